"""Every model call is recorded with what it cost, accepted or not: "what did the retries of this
run cost?" has a one-line answer."""

from pathlib import Path
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    CallCosts,
    CallOrigin,
    ModelAnswer,
    ModelUsage,
    StaleCandidateError,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs.operator.cli import main
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC, defs
from idempotent_jobs_tests.helpers import Collector, claimed, expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv


def answers(*scripted: Any) -> Any:
    """A model answering (or raising) as scripted, one entry per call."""
    queue = list(scripted)

    def transform(raw: dict[str, Any]) -> ModelAnswer:
        item = queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, ModelAnswer)
        return item

    return transform


def test_failed_rejected_and_accepted_calls_are_all_recorded(ledger: HarnessLedger) -> None:
    ident = identity()
    model = answers(
        TimeoutError("provider timed out"),
        ModelAnswer({"summary": ""}, ModelUsage("m-1", 120, 7)),  # the validator rejects it
        ModelAnswer({"summary": "kept"}, ModelUsage("m-1", 130, 20)),
    )

    def validate(output: dict[str, Any]) -> bool:
        return bool(output["summary"])

    for expected in (TimeoutError, Exception, None):
        kwargs: dict[str, Any] = {"collect": Collector(), "transform": model, "validate": validate}
        if expected is None:
            outcome = run_idempotent(
                ledger, ident, origin=CallOrigin(caller_step="transform"), **kwargs
            )
            assert outcome.executed
        else:
            with pytest.raises(expected):
                run_idempotent(ledger, ident, origin=CallOrigin(caller_step="transform"), **kwargs)

    calls = ledger.model_calls(ident.run_id)
    assert [(c.outcome, c.model_name, c.input_tokens, c.output_tokens) for c in calls] == [
        ("failed", None, None, None),
        ("rejected", "m-1", 120, 7),
        ("accepted", "m-1", 130, 20),
    ]
    assert [c.lease_epoch for c in calls] == [1, 2, 3]
    assert {c.caller_step for c in calls} == {"transform"}
    assert calls[0].error == "TimeoutError: provider timed out"
    assert calls[1].error is not None and calls[1].error.startswith("OutputRejectedError")
    costs = CallCosts.of(calls)
    assert (costs.calls, costs.accepted_calls, costs.accepted_tokens, costs.wasted_tokens) == (
        3,
        1,
        150,
        127,
    )
    assert costs.summary() == (
        "3 model call(s): 150 tokens accepted, 127 wasted on 2 call(s) not accepted"
    )


def test_a_stale_answer_is_recorded_as_a_wasted_call(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    first = ledger.checkpoint(claimed(ledger, ident, "w1"), {"documents": ["d"]})
    expire_lease(db, ident.run_id)
    second = claimed(ledger, ident, "w2")
    ledger.complete(second, {"summary": "r0"}, usage=ModelUsage("m", 10, 1))
    operator.revise(ident.run_id, "again", recollect=True)
    fallback = claimed(ledger, ident, "w1")
    with pytest.raises(StaleCandidateError):
        ledger.complete(
            fallback,
            {"summary": "stale"},
            usage=ModelUsage("m", 40, 2),
            basis=first.basis,
            origin=CallOrigin(
                caller_step="transform", caller_run_id="dagster-run-1", retry_number=2
            ),
        )
    calls = ledger.model_calls(ident.run_id)
    assert [(c.outcome, c.revision, c.input_tokens) for c in calls] == [
        ("accepted", 0, 10),
        ("stale", 0, 40),
    ]
    assert (calls[1].caller_step, calls[1].caller_run_id, calls[1].retry_number) == (
        "transform",
        "dagster-run-1",
        2,
    )
    assert CallCosts.of(calls).wasted_tokens == 42


def test_the_call_is_recorded_with_the_step_that_made_it_and_persist_reports_totals(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database: str,
    tmp_path: Path,
) -> None:
    """The transient failure is transform's (retry 0), though collect claimed the lease: its call
    and its attempt say so."""
    dagster_env.script("fail_next")
    result = defs.resolve_job_def("competitor_summary").execute_in_process(
        partition_key="workspace-acme|2026-08-07"
    )
    assert result.success
    ident = SUMMARY_SPEC.identity_for("workspace-acme|2026-08-07")
    calls = ledger.model_calls(ident.run_id)
    assert [(c.caller_step, c.retry_number, c.outcome) for c in calls] == [
        ("transform", 0, "failed"),
        ("transform", 1, "accepted"),
    ]
    assert {c.caller_run_id for c in calls} == {result.run_id}
    assert calls[1].model_name == "recording-model"
    assert (calls[1].input_tokens, calls[1].output_tokens) == (102, 10)
    attempts = operator.attempts(ident.run_id)
    # Each attempt names the last step that took its lease over (collect claimed the first and
    # transform failed it), so `runs show` lists a failure under the step that failed; persist
    # commits under the lease transform handed it.
    assert [(a.caller_step, a.outcome) for a in attempts] == [
        ("transform", "failed"),
        ("transform", "completed"),
    ]

    persisted = output_metadata(result)["persist"]
    assert (persisted["model_calls"], persisted["tokens_accepted"]) == (2, 112)
    assert persisted["tokens_wasted"] == 0
    assert persisted["cost"] == (
        "2 model call(s): 112 tokens accepted, 0 wasted on 1 call(s) not accepted"
    )

    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", database)
    monkeypatch.setenv("IDEMPOTENT_JOBS_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    assert main(["runs", "show", ident.run_id]) == 0
    shown = capsys.readouterr().out
    assert "model calls:" in shown and "cost: 2 model call(s): 112 tokens accepted" in shown


def test_a_recorded_answer_lost_again_at_its_commit_is_still_one_call(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """``transform`` recorded its paid answer; a later step (re-execution, the lost-lease
    fallback) claims again, and loses that lease too before its commit lands. The call it
    commits is the recorded one: it stays one row, still reusable, never a second paid call."""
    from idempotent_jobs import LeaseLostError
    from idempotent_jobs.core.records import Basis, JobConfig

    ident = identity("recorded-then-lost")
    lease = ledger.checkpoint(claimed(ledger, ident, "transformer"), {"documents": ["d"]})
    origin = CallOrigin(caller_step="transform", caller_run_id="dagster-1", retry_number=0)
    config = JobConfig.of(prompt="p", model="m", validator="v")
    basis = Basis(revision=lease.revision, input_fingerprint=lease.input_fingerprint)
    usage = ModelUsage("m", 100, 50)
    ledger.record_answer(lease, {"summary": "s"}, usage, basis=basis, config=config, origin=origin)
    expire_lease(db, ident.run_id)
    again = ledger.claim(ident.run_id, "persister", 30)
    assert again is not None
    expire_lease(db, ident.run_id)
    assert ledger.claim(ident.run_id, "someone-else", 30) is not None
    with pytest.raises(LeaseLostError):
        ledger.complete(again, {"summary": "s"}, None, usage, basis=basis, origin=origin)
    calls = [(c.outcome, c.input_tokens) for c in ledger.model_calls(ident.run_id)]
    assert calls == [("answered", 100)]
