"""Failure drills live in the ledger: scoped to a job, shared by every worker, expiring by
themselves; a drilled failure ends its attempt as ``drill`` and is no model call."""

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from idempotent_jobs import RunLedger
from idempotent_jobs.core.operator_reads import LedgerReads
from idempotent_jobs.core.records import CallOrigin, JobConfig
from idempotent_jobs.core.steps import call_model, collect_once
from idempotent_jobs.dagster.drill import ModelOutageDrill, drill_for
from idempotent_jobs_tests.helpers import claimed, identity


def test_a_drill_fails_only_its_job_and_only_n_calls(ledger: RunLedger) -> None:
    ledger.arm_drill("lead-scoring", 3, 3600)
    assert ledger.take_drill("ticket-triage") is None
    assert [ledger.take_drill("lead-scoring") for _ in range(4)] == [2, 1, 0, None]
    assert LedgerReads(ledger).drills() == []


def test_a_drill_for_every_job_and_its_expiry(ledger: RunLedger, db: psycopg.Connection) -> None:
    ledger.arm_drill("*", 5, 3600)
    assert ledger.take_drill("any-job") == 4
    [armed] = LedgerReads(ledger).drills()
    assert (armed.job_name, armed.remaining) == ("*", 4)
    db.execute("UPDATE idempotent_jobs.drills SET expires_at = now() - interval '1 s'")
    assert ledger.take_drill("any-job") is None and LedgerReads(ledger).drills() == []
    ledger.arm_drill("*", 2, 3600)  # arming again replaces the expired drill
    assert [d.remaining for d in LedgerReads(ledger).drills()] == [2]
    assert [d.job_name for d in ledger.disarm_drills()] == ["*"]
    with pytest.raises(ValueError, match="calls"):
        ledger.arm_drill("*", 0, 3600)


def test_concurrent_workers_take_exactly_n_failures(database: str) -> None:
    workers, tries, armed = 8, 5, 10
    with RunLedger(database) as ledger:
        ledger.arm_drill("race", armed, 3600)
    start = threading.Barrier(workers)

    def worker() -> int:
        with RunLedger(database) as own:
            start.wait()
            return sum(own.take_drill("race") is not None for _ in range(tries))

    with ThreadPoolExecutor(workers) as pool:
        taken = sum(pool.map(lambda _: worker(), range(workers)))
    assert taken == armed


def test_a_drilled_failure_ends_the_attempt_as_drill_and_is_no_call(ledger: RunLedger) -> None:
    ident = identity()
    lease = collect_once(ledger, claimed(ledger, ident), lambda: {"documents": ["d"]})
    ledger.arm_drill(ident.job_name, 1, 3600)
    called: list[int] = []
    with pytest.raises(ModelOutageDrill, match="failed on purpose"):
        call_model(
            ledger,
            lease,
            lambda raw: called.append(1),
            config=JobConfig(),
            origin=CallOrigin(caller_step="transform"),
            heartbeat_seconds=10,
            before_call=drill_for(ledger, ident.job_name),
        )
    assert called == []
    [attempt] = ledger.attempts(ident.run_id)
    assert attempt.outcome == "drill" and attempt.error is not None
    assert ledger.model_calls(ident.run_id) == []
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.lease_owner) == ("failed", None)
