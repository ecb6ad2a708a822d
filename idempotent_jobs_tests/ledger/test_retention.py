"""Retention on a real server: payloads go by policy, the run rows and their promise stay."""

import multiprocessing
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from idempotent_jobs import InvalidInputError, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.retention import PARTS, RetentionPolicy, prune
from idempotent_jobs.core.testing import ScriptedModel
from idempotent_jobs_tests.helpers import (
    Collector,
    backdate,
    claimed,
    deliver_all,
    email,
    identity,
)
from idempotent_jobs_tests.ledgers import HarnessLedger
from idempotent_jobs_tests.workers import live_runs_while_pruning

MONTH = timedelta(days=30)
EVERYTHING_AFTER_A_MONTH = RetentionPolicy(MONTH, MONTH, MONTH, MONTH)
JOB = "competitor-summary"


def complete_one(ledger: HarnessLedger, subject: str, hour: int, model: ScriptedModel) -> str:
    outcome = run_idempotent(
        ledger,
        identity(subject, hour),
        collect=Collector(),
        transform=model,
        notifications=email,
    )
    assert outcome.executed
    return outcome.run_id


def test_dry_run_and_apply_agree_and_only_old_payloads_of_finished_work_go(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    model = ScriptedModel([{"summary": f"answer {n}"} for n in range(10)])
    old = complete_one(ledger, "old-co", 1, model)
    recent = complete_one(ledger, "recent-co", 2, model)
    deliver_all(ledger)
    backdate(db, old, 100)
    undelivered = complete_one(ledger, "undelivered-co", 3, model)  # its email is still queued
    backdate(db, undelivered, 100)
    running = claimed(ledger, identity("running-co", 4))
    ledger.checkpoint(running, {"documents": ["being worked on"]})

    dry = prune(operator, JOB, EVERYTHING_AFTER_A_MONTH)
    applied = prune(operator, JOB, EVERYTHING_AFTER_A_MONTH, apply=True, batch_size=2)
    assert not dry.applied and applied.applied
    assert {p: (dry.parts[p].rows, dry.parts[p].bytes) for p in PARTS} == {
        p: (applied.parts[p].rows, applied.parts[p].bytes) for p in PARTS
    }
    assert {p: applied.parts[p].rows for p in PARTS} == {
        "raw_input": 2,  # old and undelivered: both completed 100 days ago
        "output": 2,
        "attempts": 2,
        "delivered_payloads": 1,  # old's only: undelivered's row is still queued
    }
    assert all(applied.parts[p].bytes > 0 for p in PARTS)
    assert applied.batches == 3  # 4 runs of the job in batches of 2, then an empty one

    gone = ledger.get(old)
    assert gone is not None and gone.status == "completed" and gone.attempts == 1
    assert (gone.raw_input, gone.output) == (None, None)
    assert gone.raw_input_pruned_at is not None and gone.output_pruned_at is not None
    assert gone.attempts_pruned_at is not None and len(gone.pruned) == 3
    assert gone.input_fingerprint is not None and gone.config_fingerprint is None
    assert operator.attempts(old) == []
    [row] = operator.outbox(old)
    assert row.delivered_at is not None and row.payload is None and row.payload_pruned_at

    kept = ledger.get(recent)
    assert kept is not None and kept.output == {"summary": "answer 1"} and not kept.pruned
    [queued] = operator.outbox(undelivered)
    assert queued.delivered_at is None and queued.payload is not None
    busy = ledger.get(running.run_id)
    assert busy is not None and busy.raw_input == {"documents": ["being worked on"]}

    again = prune(operator, JOB, EVERYTHING_AFTER_A_MONTH)
    assert again.rows == 0, "a second prune finds nothing left"
    other_job = prune(operator, "another-job", EVERYTHING_AFTER_A_MONTH, apply=True)
    assert other_job.rows == 0


def test_a_pruned_run_invoked_again_calls_no_model_and_sends_nothing(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    model = ScriptedModel([{"summary": "first"}, {"summary": "second"}])
    run_id = complete_one(ledger, "workspace-acme", 9, model)
    assert len(deliver_all(ledger)) == 1
    backdate(db, run_id, 400)
    prune(operator, JOB, EVERYTHING_AFTER_A_MONTH, apply=True)

    collector = Collector()
    outcome = run_idempotent(
        ledger, identity(), collect=collector, transform=model, notifications=email
    )
    assert (outcome.status, outcome.executed, outcome.output) == ("completed", False, None)
    assert outcome.output_pruned_at is not None
    assert (model.calls, collector.calls) == (1, 0)
    assert deliver_all(ledger) == []
    assert len(operator.outbox(run_id)) == 1


def test_revising_a_run_whose_input_was_pruned_needs_recollect(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    model = ScriptedModel([{"summary": "first"}, {"summary": "recomputed"}])
    run_id = complete_one(ledger, "workspace-acme", 9, model)
    backdate(db, run_id, 400)
    prune(operator, JOB, RetentionPolicy(raw_input=MONTH), apply=True)
    with pytest.raises(InvalidInputError, match=r"recollect.*raw input .* was pruned"):
        operator.revise(run_id, "prompt fixed")
    reopened = operator.revise(run_id, "prompt fixed", recollect=True)
    assert (reopened.status, reopened.raw_input_pruned_at, reopened.revision) == (
        "pending",
        None,
        1,
    )
    collector = Collector()
    outcome = run_idempotent(ledger, identity(), collect=collector, transform=model)
    assert outcome.executed and outcome.output == {"summary": "recomputed"}
    assert collector.calls == 1
    [history] = operator.revisions(run_id)
    assert history.previous_output == {"summary": "first"}  # the output itself was kept


def test_a_replaced_result_loses_its_output_by_the_output_policy(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    model = ScriptedModel([{"summary": "first"}, {"summary": "recomputed"}])
    run_id = complete_one(ledger, "workspace-acme", 9, model)
    operator.revise(run_id, "prompt fixed")
    run_idempotent(ledger, identity(), collect=Collector(), transform=model)
    db.execute(
        "UPDATE idempotent_jobs.run_revisions"
        " SET previous_completed_at = previous_completed_at - interval '400 days'"
    )
    report = prune(operator, JOB, RetentionPolicy(output=MONTH), apply=True)
    assert report.parts["output"].rows == 1  # the replaced one; the current result is new
    [history] = operator.revisions(run_id)
    assert history.previous_output is None and history.reason == "prompt fixed"
    current = ledger.get(run_id)
    assert current is not None and current.output == {"summary": "recomputed"}


def test_a_policy_must_keep_something_for_some_time() -> None:
    with pytest.raises(InvalidInputError, match="output: must be longer than zero"):
        RetentionPolicy(output=timedelta(0))
    with pytest.raises(InvalidInputError, match="outputs: is not one of"):
        RetentionPolicy.of_days(outputs=3)
    assert RetentionPolicy.of_days(raw_input=30).raw_input == timedelta(days=30)
    assert not RetentionPolicy().prunes_anything


def test_payloads_over_the_size_limit_are_refused_before_any_write(
    ledger: HarnessLedger, database: str
) -> None:
    lease = claimed(ledger, identity())
    big: dict[str, Any] = {"documents": ["x" * (1024 * 1024)]}
    with pytest.raises(InvalidInputError, match=r"raw_input: is 1,048,\d+ bytes .* 1,048,576"):
        ledger.checkpoint(lease, big)
    with pytest.raises(InvalidInputError, match=r"output: .* over the limit .*max_output_bytes"):
        ledger.complete(lease, {"summary": "y" * (1024 * 1024)})
    record = ledger.get(lease.run_id)
    assert record is not None and (record.status, record.raw_input, record.output) == (
        "running",
        None,
        None,
    )
    with HarnessLedger(database, max_raw_input_bytes=4 * 1024 * 1024) as roomy:
        assert roomy.save_raw_input(lease, big) == big
    with pytest.raises(InvalidInputError, match="max_output_bytes: must be 1 to"):
        HarnessLedger(database, max_output_bytes=0)


SEEDED_OLD_RUNS = 20_000


def seed_old_runs(db: psycopg.Connection, runs: int) -> None:
    """``runs`` completed runs of the job, completed, attempted and notified 400 days ago."""
    db.execute(
        """
        INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version,
            status, raw_input, output, lease_epoch, attempts, completed_at, input_fingerprint)
        SELECT encode(sha256(('old' || g)::bytea), 'hex'), 'competitor-summary',
            'old-' || g, '2025-01-01'::timestamptz, 'v1', 'completed',
            '{"documents": ["an old document"]}', '{"summary": "an old answer"}', 1, 1,
            now() - interval '400 days', md5(g::text)
        FROM generate_series(1, %s) AS g
        """,
        (runs,),
    )
    db.execute(
        """
        INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, started_at,
            ended_at, outcome)
        SELECT run_id, 1, 'old-worker', completed_at, completed_at, 'completed'
        FROM idempotent_jobs.runs WHERE subject_id LIKE 'old-%%'
        """
    )
    db.execute(
        """
        INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at,
            delivered_at, delivery_attempts)
        SELECT run_id, 'email', output, completed_at, completed_at, 1
        FROM idempotent_jobs.runs WHERE subject_id LIKE 'old-%%'
        """
    )


LIVE_WORKER = "ij-live-worker"

# A live worker's backend waiting on a lock, and what holds it (another live worker would be the
# test's own contention, not the prune's: none is expected either way). Not the relation
# extension lock (`extend`): any two sessions writing new row versions of one table take it in
# turn for the instant a page is added, whatever they write; it is no lock a prune holds.
_LIVE_WAITS = """
SELECT a.pid, a.wait_event, left(a.query, 120), array_agg(b.application_name)
FROM pg_stat_activity AS a
CROSS JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS blocker(pid)
JOIN pg_stat_activity AS b ON b.pid = blocker.pid
WHERE a.application_name = %s AND a.wait_event_type = 'Lock' AND a.wait_event <> 'extend'
GROUP BY a.pid, a.wait_event, a.query"""


class LockWaits:
    """Samples, on a thread of its own until :meth:`stop`, the live workers' backends that wait
    on a lock (``pg_blocking_pids``); ``seen`` lists each wait found."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.seen: list[tuple[Any, ...]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the lock sampler did not connect"

    def _sample(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            self._ready.set()
            while not self._stop.wait(0.002):
                self.seen += conn.execute(_LIVE_WAITS, (LIVE_WORKER,)).fetchall()
                self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.slow
def test_prune_runs_beside_live_claims_and_completions_in_other_processes(
    ledger: HarnessLedger, operator: LedgerAdmin, database: str, db: psycopg.Connection
) -> None:
    """Two processes claim and complete runs of the current windows of the same job while a
    prune of 20,000 old runs goes by in batches of 500: no statement of theirs is ever seen
    waiting on a lock another session holds (the server's own view, sampled all along the
    prune: a wall-clock bound would also measure the machine's load), every live run is done
    once and keeps its payloads, every old run loses them."""
    seed_old_runs(db, SEEDED_OLD_RUNS)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    out: multiprocessing.Queue[dict[str, Any]] = ctx.Queue()
    started = [ctx.Event() for _ in range(2)]
    live_url = make_conninfo(database, application_name=LIVE_WORKER)
    workers = [
        ctx.Process(
            target=live_runs_while_pruning, args=(live_url, f"live-{n}", started[n], stop, out)
        )
        for n in range(2)
    ]
    for worker in workers:
        worker.start()
    for event in started:
        assert event.wait(60), "a live worker did not start"
    waits = LockWaits(database)
    try:
        report = prune(operator, JOB, EVERYTHING_AFTER_A_MONTH, apply=True, batch_size=500)
    finally:
        waits.stop()
    stop.set()
    results = [out.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(60)

    assert report.parts["raw_input"].rows == SEEDED_OLD_RUNS
    assert report.parts["attempts"].rows == SEEDED_OLD_RUNS
    assert report.parts["delivered_payloads"].rows == SEEDED_OLD_RUNS
    assert report.batches > SEEDED_OLD_RUNS // 500
    left = db.execute(
        "SELECT count(*) FROM idempotent_jobs.runs WHERE subject_id LIKE 'old-%%'"
        " AND (raw_input IS NOT NULL OR output IS NOT NULL)"
    ).fetchone()
    assert left == (0,)
    live = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE raw_input IS NOT NULL AND output IS NOT NULL"
        " AND raw_input_pruned_at IS NULL AND output_pruned_at IS NULL)"
        " FROM idempotent_jobs.runs WHERE subject_id LIKE 'live-%%'"
    ).fetchone()
    assert live is not None and live[0] == live[1] == sum(r["done"] for r in results)
    assert all(r["done"] == r["executed"] >= 5 for r in results), results
    assert waits.samples > report.batches  # looked all along the prune
    assert waits.seen == [], waits.seen


def test_prune_during_a_revise_skips_the_run_whole_and_reports_rows_changed(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection, database: str
) -> None:
    """A revise holds the run's row while prune runs: prune waits, rechecks, and leaves every
    part of the run, its attempt rows included, as they were; --apply counts what it changed."""
    import threading

    model = ScriptedModel([{"summary": "first"}])
    run_id = complete_one(ledger, "revised-co", 1, model)
    deliver_all(ledger)
    backdate(db, run_id, 100)
    applied: list[Any] = []
    with psycopg.connect(database) as reviser:  # a revise in flight: its transaction is open
        reviser.execute(
            "UPDATE idempotent_jobs.runs SET status = 'pending', output = NULL,"
            " completed_at = NULL, revision = revision + 1 WHERE run_id = %s",
            (run_id,),
        )
        worker = threading.Thread(
            target=lambda: applied.append(
                prune(operator, JOB, EVERYTHING_AFTER_A_MONTH, apply=True)
            )
        )
        worker.start()
        for _ in range(3000):  # until prune waits on the row the revise holds
            row = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s",
                ("%WITH batch AS%",),
            ).fetchone()
            if row and row[0]:
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("prune never waited for the revise")
        reviser.commit()
    worker.join(timeout=30)
    [report] = applied
    assert {p: report.parts[p].rows for p in ("raw_input", "output", "attempts")} == {
        "raw_input": 0,
        "output": 0,
        "attempts": 0,
    }
    record = ledger.get(run_id)
    assert record is not None and record.revision == 1 and record.raw_input is not None
    assert record.attempts_pruned_at is None and record.raw_input_pruned_at is None
    assert [a.outcome for a in operator.attempts(run_id)] == ["completed"], "revision 0's attempt"


def test_spend_rows_older_than_the_longest_budget_period_are_pruned(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """``spend_days`` and budget counters used to be kept forever."""
    from idempotent_jobs import Budget, LedgerAdmin, ModelAnswer, ModelUsage

    ident = identity(subject="spender")
    run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"x": 1},
        transform=lambda raw: ModelAnswer({"summary": "s"}, ModelUsage("m", 10, 10)),
        budget=Budget(amount=1000, period="month"),
    )
    # Age a copy of today's rows by three months: the current and previous months stay.
    db.execute(
        "INSERT INTO idempotent_jobs.spend_days SELECT job_name, day - 92, subject_id, calls,"
        " tokens FROM idempotent_jobs.spend_days"
    )
    db.execute(
        "INSERT INTO idempotent_jobs.budget_counters (budget_id, period_start, subject_id, spent)"
        " SELECT budget_id, (period_start - interval '3 months')::date, subject_id, spent"
        " FROM idempotent_jobs.budget_counters"
    )
    policy = RetentionPolicy.of_days(raw_input=30)
    with LedgerAdmin.beside(ledger) as admin:
        dry = prune(admin, ident.job_name, policy)
        assert dry.spend_rows == 2
        assert prune(admin, ident.job_name, policy, apply=True).spend_rows == 2
        assert prune(admin, ident.job_name, policy).spend_rows == 0
        [standing] = admin.budgets()
    assert standing.spent == 20  # this month's counter is whole
    counts = db.execute(
        "SELECT (SELECT count(*) FROM idempotent_jobs.spend_days),"
        " (SELECT count(*) FROM idempotent_jobs.budget_counters)"
    ).fetchone()
    assert counts == (1, 1)
