"""Real processes racing on one key: exactly one wins, whatever the interleaving; directly, and
through PgBouncer in transaction pooling mode (``racer_url``)."""

import multiprocessing
import signal
import subprocess
import sys
import threading
from datetime import datetime
from typing import Any

import psycopg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests import workers
from idempotent_jobs_tests.helpers import count, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

pytestmark = [pytest.mark.slow]

SPAWN = multiprocessing.get_context("spawn")


def test_many_processes_claim_at_once_and_one_wins(
    ledger: HarnessLedger, operator: LedgerAdmin, racer_url: str
) -> None:
    ident = identity()
    ledger.register(ident)
    racers = 16
    barrier = SPAWN.Barrier(racers)
    out: multiprocessing.Queue[int | None] = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=workers.race_claim, args=(racer_url, ident.run_id, barrier, out))
        for _ in range(racers)
    ]
    for proc in procs:
        proc.start()
    epochs = [out.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert sorted(epochs, key=lambda e: e or 0) == [None] * (racers - 1) + [1]
    assert len(operator.attempts(ident.run_id)) == 1


def test_eight_workers_run_the_same_run_and_one_does_the_model_work(
    ledger: HarnessLedger, racer_url: str, db: psycopg.Connection
) -> None:
    racers = 8
    barrier = SPAWN.Barrier(racers)
    release_winner = SPAWN.Event()
    out: multiprocessing.Queue[dict[str, Any]] = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=workers.race_run_idempotent, args=(racer_url, barrier, release_winner, out)
        )
        for _ in range(racers)
    ]
    for proc in procs:
        proc.start()
    # The winner blocks in its model call until every loser has finished: the race overlaps.
    events = [out.get(timeout=180) for _ in range(racers)]
    release_winner.set()
    events.append(out.get(timeout=60))
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0

    started = [e for e in events if e["event"] == "model-started"]
    done = [e for e in events if e["event"] == "done"]
    assert len(started) == 1 and len(done) == racers
    winners = [d for d in done if d["executed"]]
    assert len(winners) == 1 and winners[0]["pid"] == started[0]["pid"]
    assert sum(d["model_calls"] for d in done) == 1
    assert sum(d["collect_calls"] for d in done) == 1
    assert {d["status"] for d in done if not d["executed"]} <= {"running", "completed"}
    run_id = identity().run_id
    assert count(db, "runs", run_id) == 1
    assert count(db, "run_attempts", run_id) == 1
    assert count(db, "notification_outbox", run_id) == 1
    record = ledger.get(run_id)
    assert record is not None and record.status == "completed"
    assert record.output == {"summary": f"answer from {winners[0]['pid']}"}


def test_a_worker_killed_holding_a_lease_blocks_others_until_expiry(
    ledger: HarnessLedger, operator: LedgerAdmin, racer_url: str, db: psycopg.Connection
) -> None:
    ident = identity()
    ledger.register(ident)
    doomed = subprocess.Popen(
        [sys.executable, "-m", "idempotent_jobs_tests.workers", racer_url, ident.run_id, "1.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert doomed.stdout is not None
    epoch, expires = doomed.stdout.readline().split()
    expires_at = datetime.fromisoformat(expires)
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(timeout=30) == -signal.SIGKILL

    assert int(epoch) == 1
    assert ledger.claim(ident.run_id, "survivor", 30) is None
    tries = 1
    while (lease := ledger.claim(ident.run_id, "survivor", 30)) is None:
        tries += 1
        assert tries < 100_000, "the dead worker's lease never expired"
    row = db.execute(
        "SELECT started_at FROM idempotent_jobs.attempts WHERE run_id = %s AND lease_epoch = 2",
        (ident.run_id,),
    ).fetchone()
    assert row is not None and row[0] >= expires_at
    assert lease.epoch == 2
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["lease_lost", None]


def test_first_registrations_racing_on_one_identity_all_succeed(
    racer_url: str, db: psycopg.Connection
) -> None:
    """Racing first INSERTs can trip the identity constraint instead of ON CONFLICT (run_id)."""
    racers, rounds = 8, 15
    ledgers = [HarnessLedger(racer_url, pool_max_size=1) for _ in range(racers)]
    barrier = threading.Barrier(racers)
    errors: list[BaseException] = []
    leases: list[tuple[int, int]] = []

    def race(ledger: HarnessLedger) -> None:
        for hour in range(rounds):
            barrier.wait()
            try:
                ledger.register(identity(subject="racing", hour=hour))
                _, lease = ledger.begin(identity(subject="begin", hour=hour), f"w{id(ledger)}", 60)
                if lease is not None:
                    leases.append((hour, lease.epoch))
            except BaseException as exc:  # collected: the assertion below names it
                errors.append(exc)

    threads = [threading.Thread(target=race, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for ledger in ledgers:
        ledger.close()
    assert errors == []
    row = db.execute("SELECT count(*) FROM idempotent_jobs.runs").fetchone()
    assert row == (2 * rounds,)
    assert sorted(leases) == [(hour, 1) for hour in range(rounds)], "one begin wins each run"
