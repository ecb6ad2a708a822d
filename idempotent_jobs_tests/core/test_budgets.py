"""Token budgets decided in the ledger: a call that would start once the job's (or the
subject's) budget for the UTC day is spent is refused before it is made; concurrent workers
overshoot by at most one call each (real processes)."""

import multiprocessing
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    BudgetExceededError,
    InvalidInputError,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    TokenBudget,
    run_idempotent,
)
from idempotent_jobs_tests import workers
from idempotent_jobs_tests.ledgers import BothFaces

SPAWN = multiprocessing.get_context("spawn")


def _ident(subject: str, hour: int = 9, job: str = "budgeted-job") -> RunIdentity:
    return RunIdentity(job, subject, datetime(2026, 8, 7, hour, tzinfo=UTC), "v1")


def _run(
    ledger: BothFaces, ident: RunIdentity, tokens: int, budget: TokenBudget | None
) -> list[str]:
    """Run ``ident`` with a model reporting ``tokens``; return what the model saw called."""
    called: list[str] = []

    def model(raw: dict[str, Any]) -> ModelAnswer:
        called.append(ident.subject_id)
        return ModelAnswer({"summary": "ok"}, ModelUsage("m", tokens - 10, 10))

    run_idempotent(ledger, ident, collect=lambda _: {"x": 1}, transform=model, budget=budget)
    return called


def _spent_today(db: psycopg.Connection, job: str = "budgeted-job") -> int:
    """What ``model_calls`` records for ``job`` (the budget reads the trigger's rollup of it)."""
    row = db.execute(
        "SELECT COALESCE(sum(input_tokens + output_tokens), 0) FROM idempotent_jobs.model_calls"
        " JOIN idempotent_jobs.runs USING (run_id) WHERE job_name = %s",
        (job,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_call_is_refused_once_the_days_budget_is_spent(
    ledger: BothFaces, db: psycopg.Connection
) -> None:
    budget = TokenBudget(tokens_per_day=250)
    assert _run(ledger, _ident("a"), 100, budget) == ["a"]
    assert _run(ledger, _ident("b"), 100, budget) == ["b"]
    assert _run(ledger, _ident("c"), 100, budget) == ["c"]  # 200 < 250: allowed, ends at 300
    with pytest.raises(BudgetExceededError) as refused:
        _run(ledger, _ident("d"), 100, budget)
    exc = refused.value
    assert (exc.scope, exc.spent, exc.budget, exc.job_name) == ("day", 300, 250, "budgeted-job")
    assert exc.day_start.tzinfo is not None and exc.day_start.hour == 0
    assert "300 of 250 tokens" in str(exc)
    run_id = _ident("d").run_id
    record = ledger.get(run_id)
    assert record is not None and record.status == "failed"
    assert record.lease_owner is None  # the lease was given back at once
    assert [a.outcome for a in ledger.attempts(run_id)] == ["budget"]
    assert ledger.model_calls(run_id) == []  # no call was made, none recorded
    assert _spent_today(db) == 300
    rollup = db.execute(
        "SELECT sum(tokens), sum(calls) FROM idempotent_jobs.spend_days"
        " WHERE job_name = 'budgeted-job'"
    ).fetchone()
    assert rollup == (300, 3)  # the budget's rollup is what model_calls records
    # Another job has its own budget; a job without a budget is never refused.
    assert _run(ledger, _ident("d", job="other-job"), 100, budget) == ["d"]
    assert _run(ledger, _ident("e"), 100, None) == ["e"]
    # The budget its workers enforce is declared in the ledger for the operator's commands.
    row = db.execute(
        "SELECT tokens_per_day, tokens_per_subject_per_day FROM idempotent_jobs.budgets"
        " WHERE job_name = 'budgeted-job'"
    ).fetchone()
    assert row == (250, None)


def test_the_per_subject_budget_refuses_that_subject_only(ledger: BothFaces) -> None:
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


def test_only_todays_calls_count_and_a_refused_run_runs_once_the_day_turns(
    ledger: BothFaces, db: psycopg.Connection
) -> None:
    budget = TokenBudget(tokens_per_day=100)
    _run(ledger, _ident("a"), 100, budget)
    with pytest.raises(BudgetExceededError):
        _run(ledger, _ident("b"), 100, budget)
    # The day turns (by the database clock): yesterday's spend no longer counts.
    db.execute("UPDATE idempotent_jobs.model_calls SET called_at = called_at - interval '1 day'")
    db.execute("UPDATE idempotent_jobs.spend_days SET day = day - 1")
    assert _run(ledger, _ident("b"), 100, budget) == ["b"]
    assert [a.outcome for a in ledger.attempts(_ident("b").run_id)] == ["budget", "completed"]


def test_a_completed_run_is_reused_even_when_the_budget_is_spent(ledger: BothFaces) -> None:
    budget = TokenBudget(tokens_per_day=100)
    _run(ledger, _ident("a"), 100, budget)
    assert _run(ledger, _ident("a"), 100, budget) == []  # reused: no check, no call


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "budget"),
        ({"tokens_per_day": 0}, "tokens_per_day"),
        ({"tokens_per_day": 1.5}, "tokens_per_day"),
        ({"tokens_per_subject_per_day": True}, "tokens_per_subject_per_day"),
    ],
)
def test_a_bad_budget_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as bad:
        TokenBudget(**kwargs)
    assert bad.value.field == field


def _race(
    database: str, workers_count: int, budget: int, call_tokens: int, *, worst_case: bool
) -> list[dict[str, Any]]:
    start = SPAWN.Barrier(workers_count)
    in_flight = SPAWN.Barrier(workers_count) if worst_case else None
    out: multiprocessing.Queue[dict[str, Any]] = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=workers.spend_until_refused,
            args=(database, n, budget, call_tokens, start, in_flight, out),
        )
        for n in range(workers_count)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=240) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


@pytest.mark.slow
def test_n_processes_overshoot_the_budget_by_at_most_one_call_each(
    database: str, db: psycopg.Connection
) -> None:
    n, budget, call = 6, 5_000, 100
    results = _race(database, n, budget, call, worst_case=False)
    spent = _spent_today(db)
    calls = sum(r["calls"] for r in results)
    assert spent == calls * call  # spend is exactly what model_calls records
    assert all(r["refused"] is not None for r in results)  # every worker was stopped
    assert budget <= spent <= budget - 1 + n * call
    refused_runs = [r["refused"]["run_id"] for r in results]
    row = db.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE run_id = ANY(%s)",
        (refused_runs,),
    ).fetchone()
    assert row == (0,)  # no refused run made a call


@pytest.mark.slow
def test_the_bound_is_reached_when_every_worker_is_in_flight_at_once(
    ledger: BothFaces, database: str, db: psycopg.Connection
) -> None:
    n, budget, call = 6, 1_000, 100
    _run(ledger, _ident("warm-up"), budget - 1, None)  # 1 token left
    results = _race(database, n, budget, call, worst_case=True)
    # Every worker passed the check with 1 token left, then all were in their calls at once:
    # each overshoots by exactly its one call, and nobody makes a second.
    assert sorted(r["calls"] for r in results) == [1] * n
    assert _spent_today(db) == budget - 1 + n * call
    assert all(budget <= r["refused"]["spent"] <= budget - 1 + n * call for r in results)
