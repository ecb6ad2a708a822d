"""A model call that takes several requests (a repair turn, a retried provider error) records
each one as it ends, counted in the spend and fenced by the lease; the attempt's last request
is recorded once, by the commit or the failure, as for any call. The model asked for and the
model that answered are both kept; prices key on the one asked for."""

from decimal import Decimal
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    BudgetExceededError,
    CallCosts,
    CallOrigin,
    LeaseLostError,
    ModelAnswer,
    ModelUsage,
    PaidCallError,
    TokenBudget,
    current_calls,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.commits import commit
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.core.steps import call_model
from idempotent_jobs_tests.helpers import Collector, claimed, expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

ASKED = "gpt-4o"
ANSWERED = "gpt-4o-2024-08-06"


def usage(tokens_in: int, tokens_out: int) -> ModelUsage:
    return ModelUsage(ANSWERED, tokens_in, tokens_out, requested_model=ASKED)


def calls(db: psycopg.Connection, run_id: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT turn, outcome, requested_model, model_name, input_tokens, output_tokens"
        " FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
        (run_id,),
    ).fetchall()


def repaired_once(raw: dict[str, Any]) -> ModelAnswer:
    """A first answer outside its schema, recorded as a turn; the repair turn's answer."""
    book = current_calls()
    book.before_request()
    book.paid(usage(100, 10), "rejected", "answer is not valid JSON")
    book.before_request()
    return ModelAnswer({"summary": "repaired"}, usage(130, 12))


def test_a_repair_turn_and_the_answer_are_two_calls_one_accepted(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity(subject="repair")
    outcome = run_idempotent(ledger, ident, collect=Collector(), transform=repaired_once)
    assert outcome.executed
    assert calls(db, ident.run_id) == [
        (1, "rejected", ASKED, ANSWERED, 100, 10),
        (None, "accepted", ASKED, ANSWERED, 130, 12),
    ]
    costs = CallCosts.of(ledger.model_calls(ident.run_id))
    assert (costs.calls, costs.accepted_tokens, costs.wasted_tokens) == (2, 142, 110)
    # Both count in the day's spend, which budgets decide on.
    [spent] = db.execute("SELECT sum(tokens) FROM idempotent_jobs.spend_days").fetchone() or [0]
    assert spent == 252


def test_an_answer_still_outside_its_schema_is_recorded_once_with_its_cost(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity(subject="never-repaired")

    def never_valid(raw: dict[str, Any]) -> ModelAnswer:
        book = current_calls()
        book.before_request()
        book.paid(usage(100, 10), "rejected", "summary: field required")
        book.before_request()
        raise PaidCallError("still outside the schema", usage=usage(140, 11), answered=True)

    with pytest.raises(PaidCallError):
        run_idempotent(ledger, ident, collect=Collector(), transform=never_valid)
    assert calls(db, ident.run_id) == [
        (1, "rejected", ASKED, ANSWERED, 100, 10),
        (None, "rejected", ASKED, ANSWERED, 140, 11),
    ]
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "failed" and record.output is None


def test_a_repair_turn_is_refused_once_the_budget_is_spent(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity(subject="budget")
    with pytest.raises(BudgetExceededError):
        run_idempotent(
            ledger,
            ident,
            collect=Collector(),
            transform=repaired_once,
            budget=TokenBudget(tokens_per_day=50),
        )
    # The first request was paid for and recorded; the repair turn was never sent.
    assert calls(db, ident.run_id) == [(1, "rejected", ASKED, ANSWERED, 100, 10)]
    [outcome] = [a.outcome for a in operator.attempts(ident.run_id)]
    assert outcome == "budget"


def test_no_request_is_sent_for_a_run_another_worker_took_over(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity(subject="taken-over")
    lease = claimed(ledger, ident, worker="slow", lease=30)
    lease = ledger.checkpoint(lease, {"n": 1})
    sent: list[str] = []

    def model(raw: dict[str, Any]) -> ModelAnswer:
        book = current_calls()
        book.before_request()
        sent.append("first")
        expire_lease(db, ident.run_id)
        assert (
            ledger.claim(ident.run_id, "fast", 30) is not None
        )  # another worker takes the run over
        book.paid(usage(100, 10), "failed", "HTTP 529 overloaded")
        book.before_request()  # the heartbeat has not noticed yet: the fence has
        sent.append("second")
        return ModelAnswer({"summary": "never"}, usage(1, 1))

    with pytest.raises(LeaseLostError):
        call_model(
            ledger,
            lease,
            model,
            config=JobConfig(),
            origin=CallOrigin(caller_step="transform"),
            # Longer than the test: a renewal between the expiry and the takeover would win the
            # lease back, and the fence is what this test is about.
            heartbeat_seconds=30,
        )
    assert "second" not in sent
    # The paid request is in the books, as a call of a lost lease.
    assert calls(db, ident.run_id)[0] == (1, "lease_lost", ASKED, ANSWERED, 100, 10)


def test_a_recorded_answer_committed_later_keeps_its_turns_apart(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Dagster's path: transform records its answer, persist commits it; the commit updates the
    recorded answer's row, never a turn's."""
    ident = identity(subject="dagster-path")
    lease = ledger.checkpoint(claimed(ledger, ident), {"n": 1})
    origin = CallOrigin(caller_run_id="dagster-run-1", caller_step="transform", retry_number=0)
    answer = call_model(
        ledger,
        lease,
        repaired_once,
        config=JobConfig(),
        origin=origin,
        heartbeat_seconds=10,
        record_answer=True,
    )
    assert [row[:2] for row in calls(db, ident.run_id)] == [(1, "rejected"), (None, "answered")]
    assert commit(ledger, lease, answer).accepted
    assert [row[:2] for row in calls(db, ident.run_id)] == [(1, "rejected"), (None, "accepted")]


def test_prices_key_on_the_model_asked_for(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity(subject="priced")
    operator.set_price(ASKED, input_per_million=Decimal("2.50"), output_per_million=Decimal("10"))
    run_idempotent(ledger, ident, collect=Collector(), transform=repaired_once)
    [spend] = [s for s in operator.spend_by_job() if s.job_name == ident.job_name]
    assert spend.priced, "a price set for gpt-4o prices the calls gpt-4o-2024-08-06 answered"
    assert spend.cost == Decimal("0.000795")  # 230 input tokens at 2.50, 22 output at 10
