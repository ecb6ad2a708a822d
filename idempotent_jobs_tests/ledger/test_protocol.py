"""run_idempotent, the protocol without Dagster, through each failure path."""

import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    LeaseLostError,
    ModelAnswer,
    ModelUsage,
    OutputRejectedError,
    RunIdentity,
    RunLedger,
    RunOutcome,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.records import Completion, Lease
from idempotent_jobs.core.testing import ScriptedModel, assert_run_twice_is_idempotent
from idempotent_jobs_tests.helpers import Collector, count, email, expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def test_run_it_twice(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    """The published test: the model's second answer would differ, yet nothing changes."""
    model = ScriptedModel([{"summary": "first answer"}, {"summary": "a visibly different one"}])
    collector = Collector()

    def job() -> RunOutcome:
        return run_idempotent(
            ledger, identity(), collect=collector, transform=model, notifications=email
        )

    first, second = assert_run_twice_is_idempotent(ledger, job)
    assert first.executed and not second.executed
    assert first.output == second.output == {"summary": "first answer"}
    assert (model.calls, collector.calls) == (1, 1)
    run_id = identity().run_id
    assert (count(db, "runs", run_id), count(db, "notification_outbox", run_id)) == (1, 1)
    record = ledger.get(run_id)
    assert record is not None and record.status == "completed"


def test_the_kit_catches_an_identity_built_from_the_wall_clock(ledger: HarnessLedger) -> None:
    model = ScriptedModel()
    wall_clock = iter(
        [datetime(2026, 8, 7, 9, 0, 1, tzinfo=UTC), datetime(2026, 8, 7, 9, 0, 2, tzinfo=UTC)]
    )

    def job_keyed_on_the_clock() -> RunOutcome:
        ident = RunIdentity("competitor-summary", "workspace-acme", next(wall_clock), "v1")
        return run_idempotent(ledger, ident, collect=Collector(), transform=model)

    with pytest.raises(AssertionError, match="another run id"):
        assert_run_twice_is_idempotent(ledger, job_keyed_on_the_clock)
    assert model.calls == 2


def test_a_timeout_after_collection_reuses_the_stored_input(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    model = ScriptedModel(fail_on=[1])
    collector = Collector()
    with pytest.raises(TimeoutError):
        run_idempotent(ledger, identity(), collect=collector, transform=model, notifications=email)
    record = ledger.get(identity().run_id)
    assert record is not None
    assert record.status == "failed"
    assert record.last_error == "TimeoutError: scripted failure on call 1"
    assert record.raw_input == {
        "subject": "workspace-acme",
        "documents": ["doc seen on collect #1"],
    }

    retry = run_idempotent(
        ledger, identity(), collect=collector, transform=model, notifications=email
    )
    assert retry.executed and retry.status == "completed"
    assert collector.calls == 1, "the retry must reuse the checkpoint, not collect again"
    assert model.inputs[1] == record.raw_input
    assert [a.outcome for a in operator.attempts(identity().run_id)] == ["failed", "completed"]
    assert len(operator.outbox(identity().run_id)) == 1


class CommitThenLoseTheAnswer(RunLedger):
    """The commit lands, then the caller sees a timeout (the answer was lost on the way)."""

    def complete(self, lease: Lease, output: dict[str, Any], *args: Any, **kw: Any) -> Completion:
        super().complete(lease, output, *args, **kw)
        raise TimeoutError("connection lost after COMMIT was sent")


def test_a_timeout_after_the_final_commit_returns_the_stored_result(
    ledger: HarnessLedger, operator: LedgerAdmin, database: str, db: psycopg.Connection
) -> None:
    model = ScriptedModel()
    collector = Collector()
    flaky = CommitThenLoseTheAnswer(database)
    try:
        with pytest.raises(TimeoutError):
            run_idempotent(
                flaky, identity(), collect=collector, transform=model, notifications=email
            )
    finally:
        flaky.close()
    stored = ledger.get(identity().run_id)
    assert stored is not None and stored.status == "completed"

    retry = run_idempotent(
        ledger, identity(), collect=collector, transform=model, notifications=email
    )
    assert (retry.executed, retry.status, retry.output) == (False, "completed", stored.output)
    assert (model.calls, collector.calls) == (1, 1)
    assert count(db, "notification_outbox", identity().run_id) == 1
    [attempt] = operator.attempts(identity().run_id)
    assert attempt.outcome == "completed"


def test_a_completed_run_invoked_again_does_nothing(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    model = ScriptedModel()
    collector = Collector()
    first = run_idempotent(ledger, identity(), collect=collector, transform=model)
    before = ledger.get(identity().run_id), operator.attempts(identity().run_id)
    for _ in range(3):
        again = run_idempotent(ledger, identity(), collect=collector, transform=model)
        assert (again.executed, again.output) == (False, first.output)
    assert (model.calls, collector.calls) == (1, 1)
    after = ledger.get(identity().run_id), operator.attempts(identity().run_id)
    assert before[0] is not None and after[0] is not None
    assert (before[0].output, before[0].completed_at, before[1]) == (
        after[0].output,
        after[0].completed_at,
        after[1],
    )


class DedupQueue:
    """A submission queue that drops duplicates only while their dedup key lives (like a TTL)."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.accepted: list[RunIdentity] = []

    def submit(self, ident: RunIdentity) -> bool:
        if ident.run_id in self.keys:
            return False
        self.keys.add(ident.run_id)
        self.accepted.append(ident)
        return True

    def expire_keys(self) -> None:
        self.keys.clear()


def test_an_expired_queue_dedup_key_still_finds_the_durable_run(ledger: HarnessLedger) -> None:
    queue = DedupQueue()
    model = ScriptedModel()
    assert queue.submit(identity())
    assert not queue.submit(identity())
    outcomes = [
        run_idempotent(ledger, i, collect=Collector(), transform=model) for i in queue.accepted
    ]
    queue.expire_keys()
    assert queue.submit(identity()), "the queue forgot it ran this"
    late = run_idempotent(ledger, queue.accepted[-1], collect=Collector(), transform=model)
    assert outcomes[0].executed and not late.executed
    assert late.output == outcomes[0].output and model.calls == 1


def test_the_heartbeat_keeps_the_lease_through_a_long_model_call(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    in_model = threading.Event()
    finish = threading.Event()
    checked: list[bool] = []

    def slow_model(raw: dict[str, Any]) -> dict[str, Any]:
        in_model.set()
        assert finish.wait(timeout=60)
        return {"summary": "slow"}

    def rival() -> None:
        assert in_model.wait(timeout=60)
        first_expiry = db.execute(
            "SELECT lease_expires_at FROM idempotent_jobs.runs WHERE run_id = %s",
            (identity().run_id,),
        ).fetchone()
        assert first_expiry is not None
        # Wait (by the database clock) until the first lease would have expired unrenewed...
        while db.execute("SELECT now() <= %s", first_expiry).fetchone() == (True,):
            threading.Event().wait(0.05)
        # ...and check nobody can take it: the heartbeat renewed it.
        checked.append(ledger.claim(identity().run_id, "rival", 30) is None)
        finish.set()

    helper = threading.Thread(target=rival)
    helper.start()
    outcome = run_idempotent(
        ledger,
        identity(),
        collect=Collector(),
        transform=slow_model,
        lease_seconds=1.0,
        heartbeat_seconds=0.2,
    )
    helper.join()
    assert checked == [True]
    assert outcome.executed and outcome.epoch == 1


def test_a_lease_lost_during_the_model_call_never_commits(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    def model_paused_past_its_lease(raw: dict[str, Any]) -> dict[str, Any]:
        # While this worker is "paused", its lease expires and another worker claims the run.
        expire_lease(db, identity().run_id)
        assert ledger.claim(identity().run_id, "new-owner", 30) is not None
        return {"summary": "stale answer"}

    with pytest.raises(LeaseLostError):
        run_idempotent(
            ledger,
            identity(),
            collect=Collector(),
            transform=model_paused_past_its_lease,
            notifications=email,
        )
    record = ledger.get(identity().run_id)
    assert record is not None
    assert (record.status, record.output, record.lease_owner, record.lease_epoch) == (
        "running",
        None,
        "new-owner",
        2,
    )
    assert operator.outbox(identity().run_id) == []
    assert [a.outcome for a in operator.attempts(identity().run_id)] == ["lease_lost", None]


def test_a_rejected_output_fails_the_attempt_and_a_retry_succeeds(ledger: HarnessLedger) -> None:
    model = ScriptedModel([{"summary": ""}, {"summary": "good"}])
    collector = Collector()

    def validate(output: dict[str, Any]) -> bool:
        return bool(output.get("summary"))

    with pytest.raises(OutputRejectedError):
        run_idempotent(ledger, identity(), collect=collector, transform=model, validate=validate)
    record = ledger.get(identity().run_id)
    assert record is not None and record.status == "failed" and record.output is None
    assert record.last_error is not None and "validator rejected" in record.last_error
    done = run_idempotent(ledger, identity(), collect=collector, transform=model, validate=validate)
    assert done.output == {"summary": "good"} and collector.calls == 1


def test_a_collector_error_is_recorded_and_nothing_is_checkpointed(ledger: HarnessLedger) -> None:
    def broken_collector(ident: RunIdentity) -> dict[str, Any]:
        raise ConnectionError("source unavailable")

    model = ScriptedModel()
    with pytest.raises(ConnectionError):
        run_idempotent(ledger, identity(), collect=broken_collector, transform=model)
    record = ledger.get(identity().run_id)
    assert record is not None
    assert (record.status, record.raw_input, record.last_error) == (
        "failed",
        None,
        "ConnectionError: source unavailable",
    )
    assert model.calls == 0


def test_usage_is_recorded_on_the_attempt(ledger: HarnessLedger, operator: LedgerAdmin) -> None:
    def model(raw: dict[str, Any]) -> ModelAnswer:
        return ModelAnswer({"summary": "s"}, ModelUsage("local-extractive", 321, 12))

    run_idempotent(ledger, identity(), collect=Collector(), transform=model)
    [attempt] = operator.attempts(identity().run_id)
    assert (attempt.model_name, attempt.input_tokens, attempt.output_tokens) == (
        "local-extractive",
        321,
        12,
    )


def test_a_run_held_by_another_worker_is_left_alone(ledger: HarnessLedger) -> None:
    ledger.register(identity())
    assert ledger.claim(identity().run_id, "someone-else", 60) is not None
    model = ScriptedModel()
    collector = Collector()
    outcome = run_idempotent(ledger, identity(), collect=collector, transform=model)
    assert (outcome.status, outcome.executed, outcome.output) == ("running", False, None)
    assert (model.calls, collector.calls) == (0, 0)
