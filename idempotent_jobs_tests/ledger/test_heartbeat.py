"""One renewer per ledger and process keeps every held lease alive, on a real server."""

import multiprocessing
import threading

import psycopg
import pytest

from idempotent_jobs import LeaseLostError
from idempotent_jobs.core.heartbeat import LeaseHeartbeat, renewer_for
from idempotent_jobs.core.records import AdvanceHold, Lease
from idempotent_jobs_tests.helpers import claimed, identity, take_over
from idempotent_jobs_tests.ledgers import HarnessLedger


class CountingLedger(HarnessLedger):
    """A real ledger that counts its renewals and signals once ``wanted`` have been made."""

    def __init__(self, conninfo: str, wanted: int) -> None:
        super().__init__(conninfo)
        self.renewals = 0
        self.lost = 0
        self.wanted = wanted
        self.enough = threading.Event()
        self.lost_seen = threading.Event()

    def renew(
        self, lease: Lease, *, hold: AdvanceHold | None = None, step: str | None = None
    ) -> Lease:
        try:
            renewed = super().renew(lease, hold=hold, step=step)
        except LeaseLostError:
            self.lost += 1
            self.lost_seen.set()
            raise
        self.renewals += 1
        if self.renewals >= self.wanted:
            self.enough.set()
        return renewed


def renewer_threads(ledger: HarnessLedger) -> int:
    name = renewer_for(ledger).thread_name
    return sum(t.name == name for t in threading.enumerate())


def test_many_leases_share_one_renewer_thread_and_each_is_renewed(database: str) -> None:
    ledger = CountingLedger(database, wanted=15)
    with ledger:
        leases = [claimed(ledger, identity(hour=h), lease=30) for h in range(5)]
        beats = [LeaseHeartbeat(ledger, lease, 0.05) for lease in leases]
        for beat in beats:
            beat.__enter__()
        assert renewer_threads(ledger) == 1
        assert renewer_for(ledger).held == 5
        assert ledger.enough.wait(30)
        for beat in beats:
            beat.__exit__(None, None, None)
        assert renewer_for(ledger).held == 0
        # Every lease was renewed: its expiry moved forward by the database's clock.
        for lease, beat in zip(leases, beats, strict=True):
            before, after = lease.expires_at, beat.lease.expires_at
            assert before is not None and after is not None and after > before
            assert not beat.lost


def test_a_step_shorter_than_its_interval_renews_nothing(database: str) -> None:
    ledger = CountingLedger(database, wanted=1)
    with ledger:
        lease = claimed(ledger, identity(), lease=30)
        for _ in range(50):
            with LeaseHeartbeat(ledger, lease, 10.0) as beat:
                pass
            beat.raise_if_lost()
        assert ledger.renewals == 0
        assert beat.lease.expires_at == lease.expires_at


def test_a_lease_taken_over_is_reported_lost(database: str, db: psycopg.Connection) -> None:
    ledger = CountingLedger(database, wanted=1)
    with ledger:
        lease = claimed(ledger, identity(), lease=30)
        with LeaseHeartbeat(ledger, lease, 0.05) as beat:
            take_over(ledger, db, lease.run_id, "new-owner")
            assert ledger.lost_seen.wait(30)
        with pytest.raises(LeaseLostError):
            beat.raise_if_lost()
        assert ledger.lost == 1  # renewal stopped after the fence refused it


def _child_renews(
    database: str, parent_ledger: HarnessLedger, out: "multiprocessing.Queue[str]"
) -> None:
    # The parent's renewer (its thread and its lock) did not survive the fork: a fresh one.
    if renewer_for(parent_ledger).held != 0:
        out.put("inherited the parent's renewer")
        return
    ledger = CountingLedger(database, wanted=2)
    with ledger:
        lease = claimed(ledger, identity(hour=20), worker="child")
        with LeaseHeartbeat(ledger, lease, 0.05):
            renewed = ledger.enough.wait(30)
    out.put("renewed" if renewed else "not renewed")


def test_a_forked_child_gets_a_renewer_of_its_own(database: str) -> None:
    ledger = CountingLedger(database, wanted=1)
    with ledger:
        lease = claimed(ledger, identity(hour=1))
        with LeaseHeartbeat(ledger, lease, 0.05):
            assert ledger.enough.wait(30)  # the parent's renewer thread is running
            ctx = multiprocessing.get_context("fork")
            out: multiprocessing.Queue[str] = ctx.Queue()
            child = ctx.Process(target=_child_renews, args=(database, ledger, out))
            child.start()
            answer = out.get(timeout=60)
            child.join(60)
        assert renewer_for(ledger).held == 0
    assert (answer, child.exitcode) == ("renewed", 0)
