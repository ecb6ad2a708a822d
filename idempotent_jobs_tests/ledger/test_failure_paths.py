"""Every failure ends the attempt cleanly: hostile error text and receivers, fenced outcomes."""

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.commits import commit
from idempotent_jobs.core.error_text import MAX_ERROR_CHARS, describe_error, safe_text
from idempotent_jobs.core.errors import LeaseLostError, StaleCandidateError
from idempotent_jobs.core.records import (
    Basis,
    CallCosts,
    CallOrigin,
    FenceOutcome,
    JobConfig,
    ModelUsage,
    OutboxRecord,
)
from idempotent_jobs.core.steps import BoundAnswer, end_attempt
from idempotent_jobs_tests.helpers import claimed, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

_HOURS = itertools.count()
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=5000)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=ANY_TEXT)
def test_any_error_text_is_recorded_safely_and_frees_the_run(
    ledger: HarnessLedger, text: str
) -> None:
    ident = identity(subject=f"hostile-{next(_HOURS)}")
    lease = claimed(ledger, ident)
    assert end_attempt(ledger, lease, RuntimeError(text)) == FenceOutcome.APPLIED
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "failed" and record.lease_owner is None
    assert record.last_error == describe_error(RuntimeError(text))
    assert "\x00" not in record.last_error and len(record.last_error) <= MAX_ERROR_CHARS
    assert ledger.claim(ident.run_id, "next", 30) is not None


@given(text=ANY_TEXT)
def test_safe_text_keeps_printable_text_and_escapes_the_rest(text: str) -> None:
    shown = safe_text(text)
    shown.encode("utf-8")
    assert "\x00" not in shown and len(shown) <= MAX_ERROR_CHARS
    if text.isprintable() and len(text) <= MAX_ERROR_CHARS:
        assert shown == text


def test_an_exception_whose_str_raises_is_still_recorded(ledger: HarnessLedger) -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    lease = claimed(ledger, identity())
    end_attempt(ledger, lease, Hostile())
    record = ledger.get(identity().run_id)
    assert record is not None and record.last_error == "Hostile: <message could not be read>"


def test_fenced_statements_say_what_happened(ledger: HarnessLedger) -> None:
    ident = identity()
    lease = claimed(ledger, ident)
    assert ledger.fail(lease, "boom") == FenceOutcome.APPLIED
    assert ledger.fail(lease, "boom") == FenceOutcome.ALREADY_DONE  # a retry after a lost answer
    with pytest.raises(LeaseLostError):
        ledger.fail(lease, "another reason")
    lease = claimed(ledger, ident, "w2")
    assert ledger.release(lease) == FenceOutcome.APPLIED
    assert ledger.release(lease) == FenceOutcome.ALREADY_DONE
    lease = claimed(ledger, ident, "w3")
    stale = Basis(revision=lease.revision + 1, input_fingerprint=None)
    with pytest.raises(StaleCandidateError) as info:
        ledger.complete(lease, {"summary": "s"}, basis=stale)
    assert info.value.candidate == stale and info.value.current == lease.basis
    assert info.value.run_id == ident.run_id


def test_one_hostile_receiver_never_blocks_the_outbox(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    runs = [identity(hour=h) for h in range(3)]
    for ident in runs:
        ledger.complete(claimed(ledger, ident), {"summary": "s"}, {"hook": {"n": 1}})
    hostile = runs[0].run_id

    class UnreadableAnswer(Exception):
        def __str__(self) -> str:
            raise ValueError("unreadable")

    def send(row: OutboxRecord) -> None:
        if row.run_id == hostile and row.delivery_attempts == 0:
            raise ConnectionError("HTTP/1.1 200\x00OK \udc80")
        if row.run_id == hostile:
            raise UnreadableAnswer()

    report = ledger.deliver_outbox(send)
    assert sorted(r.run_id for r in report.delivered) == sorted(i.run_id for i in runs[1:])
    [(row, reason)] = report.failed
    assert row.run_id == hostile and reason == "ConnectionError: HTTP/1.1 200\\x00OK \\udc80"
    [pending] = operator.outbox(pending_only=True)
    assert pending.last_error == reason and pending.delivery_attempts == 1
    report = ledger.deliver_outbox(send)
    assert [reason for _, reason in report.failed] == [
        "UnreadableAnswer: <message could not be read>"
    ]


def test_a_delivery_whose_record_fails_is_reported_and_the_pass_goes_on(
    ledger: HarnessLedger, operator: LedgerAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [identity(hour=h) for h in range(2)]
    for ident in runs:
        ledger.complete(claimed(ledger, ident), {"summary": "s"}, {"hook": {"n": 1}})
    first = operator.outbox(pending_only=True)[0].run_id
    outbox = ledger._stores.outbox
    original = outbox._deliver_one

    def broken(send: Any, key: dict[str, Any]) -> Any:
        if key["run_id"] == first:
            raise RuntimeError("the mark could not be written \x00")
        return original(send, key)

    monkeypatch.setattr(outbox, "_deliver_one", broken)
    report = ledger.deliver_outbox(lambda row: None)
    assert [r.run_id for r in report.delivered] != [] and len(report.failed) == 1
    assert report.failed[0][1].startswith("delivery not recorded: RuntimeError")
    [pending] = operator.outbox(pending_only=True)
    assert pending.run_id == first and pending.last_error == report.failed[0][1]


def test_an_answer_committed_again_after_a_failed_commit_is_still_one_model_call(
    ledger: HarnessLedger,
) -> None:
    """What a re-execution of `persist` does: an earlier Dagster run paid for the answer and its
    commit failed (recorded, `rejected`); the re-execution claims and commits the same answer.
    The call stays one row, now `accepted`, and its tokens are counted once."""
    ident = identity()
    lease = claimed(ledger, ident)
    lease = ledger.checkpoint(lease, {"documents": ["d"]})
    origin = CallOrigin(caller_step="job_transform", caller_run_id="dagster-run-a", retry_number=0)
    answer = BoundAnswer(
        output={"summary": "s"},
        usage=ModelUsage("m", 100, 20),
        basis=lease.basis,
        config=JobConfig(),
        origin=origin,
    )

    def payload_fails(output: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the payload builder failed")

    with pytest.raises(RuntimeError):
        commit(ledger, lease, answer, payload_fails)
    [call] = ledger.model_calls(ident.run_id)
    assert (call.outcome, call.error) == ("rejected", "RuntimeError: the payload builder failed")

    again = ledger.claim(ident.run_id, "re-execution", 30)
    assert again is not None
    with pytest.raises(RuntimeError):  # it fails once more: still the same one call
        commit(ledger, again, answer, payload_fails)
    assert len(ledger.model_calls(ident.run_id)) == 1
    again = ledger.claim(ident.run_id, "re-execution-2", 30)
    assert again is not None
    assert commit(ledger, again, answer, email).accepted
    [call] = ledger.model_calls(ident.run_id)
    assert (call.outcome, call.error, call.lease_epoch, call.tokens) == ("accepted", None, 1, 120)
    assert CallCosts.of(ledger.model_calls(ident.run_id)).wasted_tokens == 0
