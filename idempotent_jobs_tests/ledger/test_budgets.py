"""Budgets decided in the ledger: tokens or money, per UTC day or month, for a job, each subject
or a group of jobs. A request's worst case is reserved before it is sent, so racing workers end
at or under the budget; the budget a ledger enforces is the ledger's, not a worker's."""

import multiprocessing
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    Budget,
    BudgetConflictError,
    BudgetExceededError,
    InvalidInputError,
    JobConfig,
    LedgerAdmin,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    TokenBudget,
    run_idempotent,
)
from idempotent_jobs.core.budgets import BudgetSpec
from idempotent_jobs.core.health import budget_findings
from idempotent_jobs.core.policy import CallPolicy
from idempotent_jobs.core.records import AdvanceHold, CallOrigin
from idempotent_jobs.core.steps import call_model
from idempotent_jobs_tests import workers
from idempotent_jobs_tests.helpers import sent_statements
from idempotent_jobs_tests.ledgers import HarnessLedger

SPAWN = multiprocessing.get_context("spawn")
JOB = "budgeted-job"


def _ident(subject: str, hour: int = 9, job: str = JOB) -> RunIdentity:
    return RunIdentity(job, subject, datetime(2026, 8, 7, hour, tzinfo=UTC), "v1")


def _run(
    ledger: HarnessLedger,
    ident: RunIdentity,
    tokens: int | None,
    budget: BudgetSpec | None,
    *,
    ceiling: int | None = None,
    follow: bool = False,
    model: str = "m",
) -> list[str]:
    """Run ``ident`` with a model reporting ``tokens`` (``None``: no usage); return what the
    model saw called."""
    called: list[str] = []

    def transform(raw: dict[str, Any]) -> ModelAnswer:
        called.append(ident.subject_id)
        usage = ModelUsage(model) if tokens is None else ModelUsage(model, tokens - 10, 10)
        return ModelAnswer({"summary": "ok"}, usage)

    run_idempotent(
        ledger,
        ident,
        collect=lambda _: {"x": 1},
        transform=transform,
        budget=budget,
        max_tokens_per_call=ceiling,
        follow_ledger_budget=follow,
        config=JobConfig.of(prompt="", model=model, validator=""),
    )
    return called


def _spent(db: psycopg.Connection, job: str = JOB) -> int:
    """What ``model_calls`` records for ``job``."""
    row = db.execute(
        "SELECT COALESCE(sum(input_tokens + output_tokens), 0) FROM idempotent_jobs.model_calls"
        " JOIN idempotent_jobs.runs USING (run_id) WHERE job_name = %s",
        (job,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _counter(db: psycopg.Connection, budget_id: str) -> tuple[Any, Any, int, int]:
    row = db.execute(
        "SELECT sum(spent), sum(reserved), sum(calls), sum(unknown_calls)"
        " FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (budget_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1], int(row[2] or 0), int(row[3] or 0)


def _in_doubt(db: psycopg.Connection, budget_id: str) -> Any:
    """What calls whose outcome is in doubt hold of a budget, apart from its spend."""
    row = db.execute(
        "SELECT sum(in_doubt) FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (budget_id,),
    ).fetchone()
    assert row is not None
    return row[0]


def test_a_call_with_no_declared_worst_case_is_refused_once_the_days_budget_is_spent(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    budget = TokenBudget(tokens_per_day=250)
    assert _run(ledger, _ident("a"), 100, budget) == ["a"]
    assert _run(ledger, _ident("b"), 100, budget) == ["b"]
    assert _run(ledger, _ident("c"), 100, budget) == ["c"]  # 200 < 250: checked, ends at 300
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("d"), 100, budget)
    exc = refused.value
    assert (exc.scope, exc.budget_id, exc.spent, exc.budget, exc.job_name) == (
        "job",
        f"job:tokens/day:{JOB}",
        300,
        250,
        JOB,
    )
    assert exc.day_start.tzinfo is not None and exc.day_start.hour == 0
    assert "300 of 250 tokens" in str(exc)
    run_id = _ident("d").run_id
    record = ledger.get(run_id)
    assert record is not None and record.status == "failed"
    assert record.lease_owner is None  # the lease was given back at once
    assert [a.outcome for a in operator.attempts(run_id)] == ["budget"]
    assert ledger.model_calls(run_id) == []  # no call was made, none recorded
    assert _spent(db) == 300
    assert _counter(db, f"job:tokens/day:{JOB}") == (300, 0, 3, 0)
    # Another job has its own budget; a job the ledger holds none for is never refused.
    assert _run(ledger, _ident("d", job="other-job"), 100, budget) == ["d"]
    assert _run(ledger, _ident("e", job="free-job"), 100, None) == ["e"]
    # The budget is the ledger's now: the same job declaring none is still refused by it.
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("e"), 100, None)


def test_a_declared_worst_case_is_reserved_so_the_budget_is_never_overshot(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    budget = Budget(amount=250)
    assert _run(ledger, _ident("a"), 100, budget, ceiling=100) == ["a"]
    assert _run(ledger, _ident("b"), 100, budget, ceiling=100) == ["b"]
    with pytest.raises(BudgetExceededError) as refused:  # 200 + 100 > 250: not made
        _run(ledger, _ident("c"), 100, budget, ceiling=100)
    assert (refused.value.spent, refused.value.wanted) == (200, 100)
    assert "this call may take up to 100" in str(refused.value)
    assert _spent(db) == 200 <= 250
    # A call that fits is made, and settled to what it really cost.
    assert _run(ledger, _ident("c"), 40, budget, ceiling=50) == ["c"]
    assert _counter(db, f"job:tokens/day:{JOB}") == (240, 0, 3, 0)


def test_the_per_subject_budget_refuses_that_subject_only(ledger: HarnessLedger) -> None:
    budget = TokenBudget(tokens_per_subject_per_day=150)
    assert _run(ledger, _ident("acme", 9), 100, budget) == ["acme"]
    assert _run(ledger, _ident("acme", 10), 100, budget) == ["acme"]
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("acme", 11), 100, budget)
    assert (refused.value.scope, refused.value.subject_id, refused.value.spent) == (
        "subject",
        "acme",
        200,
    )
    assert _run(ledger, _ident("globex", 11), 100, budget) == ["globex"]


def test_only_the_periods_calls_count_and_a_refused_run_runs_once_the_day_turns(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    budget = TokenBudget(tokens_per_day=100)
    _run(ledger, _ident("a"), 100, budget)
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("b"), 100, budget)
    # The day turns (by the database clock): yesterday's counter no longer counts.
    db.execute("UPDATE idempotent_jobs.budget_counters SET period_start = period_start - 1")
    assert _run(ledger, _ident("b"), 100, budget) == ["b"]
    assert [a.outcome for a in operator.attempts(_ident("b").run_id)] == ["budget", "completed"]


def test_a_monthly_group_budget_is_shared_by_every_job_of_the_group(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    team = Budget(amount=250, period="month", scope="group", group="team-a")
    assert _run(ledger, _ident("a", job="job-one"), 100, team, ceiling=100) == ["a"]
    assert _run(ledger, _ident("a", job="job-two"), 100, team, ceiling=100) == ["a"]
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("b", job="job-one"), 100, team, ceiling=100)
    assert refused.value.budget_id == "group:tokens/month:team-a"
    assert refused.value.day_start.day == 1  # the calendar month's start
    row = db.execute(
        "SELECT jobs FROM idempotent_jobs.spend_budgets WHERE budget_id = %s",
        ("group:tokens/month:team-a",),
    ).fetchone()
    assert row is not None and sorted(row[0]) == ["job-one", "job-two"]
    assert _run(ledger, _ident("b", job="job-three"), 100, None) == ["b"]  # not in the group


def test_a_money_budget_caps_what_calls_cost_at_the_prices_in_force(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("gpt-priced", "2", "10")  # USD per million: 100 tokens ~ 0.00028
    budget = Budget(amount="0.0015", unit="money")
    assert _run(ledger, _ident("a"), 100, budget, ceiling=100, model="gpt-priced") == ["a"]
    assert _run(ledger, _ident("b"), 100, budget, ceiling=100, model="gpt-priced") == ["b"]
    # Worst case: 100 tokens at the dearest price (10/M) = 0.001 > what is left.
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("c"), 100, budget, ceiling=100, model="gpt-priced")
    exc = refused.value
    assert exc.unit == "money" and exc.wanted == Decimal("0.001")
    # Each call: 90 input tokens at 2/M and 10 output tokens at 10/M.
    assert exc.spent == 2 * (Decimal(90) * 2 + Decimal(10) * 10) / 1_000_000
    assert "USD spent" in str(exc) and exc.currency == "USD"
    # A model with no price cannot be capped in money: refused, never made.
    with pytest.raises(BudgetExceededError) as unpriced:
        _run(ledger, _ident("d"), 1, budget, ceiling=1, model="gpt-unpriced")
    assert unpriced.value.unpriced == "gpt-unpriced" and "has no price" in str(unpriced.value)
    assert ledger.model_calls(_ident("d").run_id) == []


def test_a_call_that_reports_no_usage_keeps_its_reservation_in_doubt_and_counted(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """A call with no usage known is in doubt: its hold stays charged, apart from spend."""
    budget = Budget(amount=10_000)
    for n in range(3):
        assert _run(ledger, _ident(f"s{n}"), None, budget, ceiling=1_000) == [f"s{n}"]
    key = f"job:tokens/day:{JOB}"
    assert _counter(db, key) == (0, 0, 3, 3)
    assert _in_doubt(db, key) == 3_000
    with LedgerAdmin.beside(ledger) as admin:
        [standing] = admin.budgets(JOB)
        findings = budget_findings([standing])
    assert standing.spent == 0 and standing.in_doubt == 3_000 and standing.unknown_calls == 3
    assert [f.kind for f in findings] == ["budget", "usage_unknown"]
    assert "3 call(s) this day reported no usage" in findings[1].detail


def test_a_1_token_budget_lets_one_call_with_no_usage_through_not_25(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Calls reporting no usage used to spend nothing: a 1-token budget let 25 through."""
    budget = Budget(amount=1)
    with pytest.raises(BudgetExceededError):  # a declared worst case of 10 does not fit
        _run(ledger, _ident("a"), None, budget, ceiling=10)
    assert ledger.model_calls(_ident("a").run_id) == []
    # With no worst case declared the call is only checked; reporting no usage, it is
    # held in doubt for all the room left, and the next is refused.
    assert _run(ledger, _ident("b"), None, budget) == ["b"]
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("c"), None, budget)
    assert _counter(db, f"job:tokens/day:{JOB}") == (0, 0, 1, 1)
    assert _in_doubt(db, f"job:tokens/day:{JOB}") == 1


def test_a_spec_that_declares_another_budget_than_the_ledgers_fails_naming_both(
    ledger: HarnessLedger,
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=100), job_name=JOB)
    with pytest.raises(BudgetConflictError) as conflict:
        _run(ledger, _ident("a"), 10, Budget(amount=150))
    text = str(conflict.value)
    assert f"job:tokens/day:{JOB}" in text and "150" in text and "100" in text
    assert "\n" not in text
    assert ledger.model_calls(_ident("a").run_id) == []
    # Following the ledger, the ledger's is enforced.
    assert _run(ledger, _ident("a"), 60, Budget(amount=150), follow=True) == ["a"]
    assert _run(ledger, _ident("b"), 60, Budget(amount=150), follow=True) == ["b"]
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("c"), 60, Budget(amount=150), follow=True)
    assert refused.value.budget == 100


def test_a_budget_set_by_the_operator_holds_for_a_deployment_that_declares_none(
    ledger: HarnessLedger,
) -> None:
    """Deployment A enforced 150 tokens a day; deployment B, with no budget, kept calling."""
    assert _run(ledger, _ident("a"), 100, Budget(amount=150)) == ["a"]  # A declares it
    assert _run(ledger, _ident("b"), 100, None) == ["b"]  # B, 100 < 150: checked, made
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("c"), 100, None)  # B again: the ledger's budget refuses it
    with LedgerAdmin.beside(ledger) as admin:
        [standing] = admin.budgets()
        assert standing.refusing and standing.spent == 200
        assert admin.clear_budget(standing.budget_id)  # a stale budget can be cleared
        assert admin.budgets() == []
    assert _run(ledger, _ident("c"), 100, None) == ["c"]


def test_a_completed_run_is_reused_even_when_the_budget_is_spent(ledger: HarnessLedger) -> None:
    budget = TokenBudget(tokens_per_day=100)
    _run(ledger, _ident("a"), 100, budget)
    assert _run(ledger, _ident("a"), 100, budget) == []  # reused: no check, no call


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({}, "budget", "set tokens_per_day"),
        ({"tokens_per_day": 0}, "tokens_per_day", "more than 0"),
        ({"tokens_per_day": 1.5}, "tokens_per_day", "whole number"),
        ({"tokens_per_subject_per_day": True}, "tokens_per_subject_per_day", "whole number"),
        ({"tokens_per_day": 10**30}, "tokens_per_day", "at most 10^18 tokens"),
    ],
)
def test_a_bad_budget_names_the_field(kwargs: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidInputError) as bad:
        TokenBudget(**kwargs)
    assert bad.value.field == field and words in bad.value.reason


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"amount": "1.5"}, "amount"),
        ({"amount": "-1", "unit": "money"}, "amount"),
        ({"amount": 10, "unit": "euros"}, "unit"),
        ({"amount": 10, "period": "week"}, "period"),
        ({"amount": 10, "scope": "group"}, "group"),
        ({"amount": 10, "group": "team"}, "group"),
    ],
)
def test_a_bad_budget_of_either_unit_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as bad:
        Budget(**kwargs)
    assert bad.value.field == field


def _race(
    url: str, workers_count: int, budget: Any, call_tokens: int, **options: Any
) -> list[dict[str, Any]]:
    start = SPAWN.Barrier(workers_count)
    out: multiprocessing.Queue[dict[str, Any]] = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=workers.spend_until_refused,
            args=(url, n, budget, call_tokens, start, None, out),
            kwargs=options,
        )
        for n in range(workers_count)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=240) for _ in procs]
    assert [r["error"] for r in results if "error" in r] == []
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


@pytest.mark.slow
def test_16_processes_racing_on_one_budget_never_overshoot_it(
    racer_url: str, db: psycopg.Connection
) -> None:
    """Directly and through PgBouncer (transaction mode): in tokens, then in money."""
    n, budget, call = 16, 6_000, 100
    results = _race(racer_url, n, Budget(amount=budget), call, max_tokens_per_call=call)
    spent = _spent(db)
    calls = sum(r["calls"] for r in results)
    assert spent == calls * call  # spend is exactly what model_calls records
    assert all(r["refused"] is not None for r in results)  # every worker was stopped
    assert budget - call < spent <= budget  # every token of room used, none over
    assert _counter(db, f"job:tokens/day:{JOB}") == (spent, 0, calls, 0)
    refused_runs = [r["refused"]["run_id"] for r in results]
    row = db.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE run_id = ANY(%s)",
        (refused_runs,),
    ).fetchone()
    assert row == (0,)  # no refused run made a call


@pytest.mark.slow
def test_16_processes_racing_on_a_money_budget_never_overshoot_it(
    racer_url: str, db: psycopg.Connection
) -> None:
    with LedgerAdmin(racer_url) as admin:
        admin.set_price("gpt-race", "1", "1")  # 100 tokens = 0.0001 USD
        admin.set_budget(Budget(amount="0.005", unit="money", period="month"), job_name=JOB)
    results = _race(racer_url, 16, None, 100, max_tokens_per_call=100, model="gpt-race")
    calls = sum(r["calls"] for r in results)
    spent, reserved, counted, _ = _counter(db, f"job:money/month:{JOB}")
    assert (calls, spent, reserved, counted) == (50, Decimal("0.005"), 0, 50)
    assert all(r["refused"] is not None for r in results)


def test_a_budget_set_or_declared_mid_period_starts_where_the_period_stands(
    ledger: HarnessLedger,
) -> None:
    _run(ledger, _ident("a"), 100, None)
    _run(ledger, _ident("b"), 100, None)
    with LedgerAdmin.beside(ledger) as admin:
        standing = admin.set_budget(Budget(amount=1000), job_name=JOB)
        assert standing.spent == 200 and standing.calls == 2
    _run(ledger, _ident("a", job="declaring-job"), 50, None)
    _run(ledger, _ident("b", job="declaring-job"), 100, Budget(amount=1000, period="month"))
    with LedgerAdmin.beside(ledger) as admin:
        [declared] = admin.budgets("declaring-job")
    assert declared.spent == 150 and declared.calls == 2  # the earlier call and its own


def test_a_budget_adds_no_statement_to_a_new_run_its_worst_case_rides_on_the_claim(
    ledger: HarnessLedger, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(ledger, _ident("warm", job="free-job"), 100, None)
    _run(ledger, _ident("warm"), 100, Budget(amount=1000), ceiling=200)  # declared once
    sent = sent_statements(ledger, monkeypatch)
    _run(ledger, _ident("free", job="free-job"), 100, None)
    unbudgeted = list(sent)
    sent.clear()
    _run(ledger, _ident("a"), 100, Budget(amount=1000), ceiling=200)
    # The checkpoint travels with the call and is stored by the commit: two statements.
    assert sent == unbudgeted == ["begin", "complete"]
    assert _counter(db, f"job:tokens/day:{JOB}") == (200, 0, 2, 0)  # held 200, settled at 100
    # No room for the declared worst case: the checkpoint is kept, the call is refused, and
    # nothing stays held.
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("b"), 100, Budget(amount=1000), ceiling=900)
    stored = db.execute(
        "SELECT raw_input FROM idempotent_jobs.runs WHERE run_id = %s", (_ident("b").run_id,)
    ).fetchone()
    assert stored == ({"x": 1},)
    assert _counter(db, f"job:tokens/day:{JOB}") == (200, 0, 2, 0)


def test_only_a_claim_holds_a_reused_or_busy_run_holds_nothing(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """``begin`` holds the call's worst case only for a run it claimed: a completed run it
    reuses, or one another worker holds, holds nothing (each such hold would never settle)."""
    _run(ledger, _ident("done"), 100, Budget(amount=1000), ceiling=200)
    assert _counter(db, f"job:tokens/day:{JOB}") == (100, 0, 1, 0)
    hold = AdvanceHold(200, "m")
    for _ in range(3):
        record, lease = ledger.begin(_ident("done"), "reuser", 30, hold=hold)
        assert record.status == "completed" and lease is None
    busy, held = ledger.begin(_ident("busy"), "holder", 30, hold=hold)
    assert held is not None and held.held_tokens == 200
    record, lease = ledger.begin(_ident("busy"), "other", 30, hold=hold)
    assert record.status == "running" and lease is None
    assert _counter(db, f"job:tokens/day:{JOB}") == (100, 200, 1, 0)  # the holder's 200 only
    holds = db.execute("SELECT worker_id FROM idempotent_jobs.budget_holds").fetchall()
    assert holds == [("holder",)]


def test_a_hold_made_with_the_handover_is_given_back_when_no_call_is_made(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """A later step's takeover reserves the call's worst case; a step that then fails before
    its request (here, its drill-free ``before_call`` raising) gives the hold back."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1000), job_name=JOB)
    record, lease = ledger.begin(_ident("h"), "collector", 30)
    assert lease is not None and lease.budgeted is True
    lease = ledger.checkpoint(lease, {"x": 1})
    assert lease.held_tokens is None
    taken = ledger.renew(lease, hold=AdvanceHold(300, "m"))
    assert taken.held_tokens == 300
    assert _counter(db, f"job:tokens/day:{JOB}")[:2] == (0, 300)

    def refuse() -> None:
        raise RuntimeError("not today")

    with pytest.raises(RuntimeError):
        call_model(
            ledger,
            taken,
            lambda raw: {"summary": "never"},
            config=JobConfig.of(prompt="", model="m", validator=""),
            origin=CallOrigin(),
            heartbeat_seconds=10,
            before_call=refuse,
            policy=CallPolicy(max_tokens_per_call=300),
        )
    assert _counter(db, f"job:tokens/day:{JOB}")[:2] == (0, 0)
    # Too big a hold is not made: the lease says nothing is held, and the call reserves (and is
    # refused) itself.
    _, lease = ledger.begin(_ident("i"), "collector", 30)
    assert lease is not None
    lease = ledger.checkpoint(lease, {"x": 1}, hold=AdvanceHold(5000, "m"))
    assert lease.held_tokens is None
    assert _counter(db, f"job:tokens/day:{JOB}")[:2] == (0, 0)


def test_the_claim_holds_the_calls_worst_case_and_a_failed_collect_gives_it_back(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = _ident("collect-fails")
    budget_id = f"job:tokens/day:{ident.job_name}"
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1000), job_name=ident.job_name)

    def collect(run: RunIdentity) -> dict[str, Any]:
        held = db.execute(
            "SELECT sum(amount) FROM idempotent_jobs.budget_holds WHERE run_id = %s",
            (run.run_id,),
        ).fetchone()
        assert held == (200,)  # held by the claim, before anything was collected
        raise RuntimeError("the source is down")

    with pytest.raises(RuntimeError, match="the source is down"):
        run_idempotent(ledger, ident, collect=collect, transform=dict, max_tokens_per_call=200)
    reserved = db.execute(
        "SELECT sum(reserved), count(*) FILTER (WHERE reserved <> 0)"
        " FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (budget_id,),
    ).fetchone()
    holds = db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone()
    assert reserved == (0, 0) and holds == (0,)


def test_a_retry_on_a_stored_checkpoint_holds_its_worst_case_with_the_claim(
    ledger: HarnessLedger, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    ident = _ident("retried")
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1000), job_name=ident.job_name)

    def broken(raw: dict[str, Any]) -> ModelAnswer:
        raise RuntimeError("the provider is down")

    def paid(raw: dict[str, Any]) -> ModelAnswer:
        return ModelAnswer({"summary": "s"}, ModelUsage("m", 90, 10))

    with pytest.raises(RuntimeError):
        run_idempotent(
            ledger, ident, collect=lambda i: {"x": 1}, transform=broken, max_tokens_per_call=200
        )
    sent = sent_statements(ledger, monkeypatch)
    run_idempotent(
        ledger, ident, collect=lambda i: {"x": 2}, transform=paid, max_tokens_per_call=200
    )
    assert sent == ["begin", "complete"]  # the checkpoint is stored; the claim held the call
    assert _counter(db, f"job:tokens/day:{JOB}") == (100, 0, 2, 1)  # settled; nothing held
