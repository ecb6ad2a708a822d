"""One call policy per job, for both drivers: ``run_idempotent`` takes rate limits (its own
keywords or a :class:`CallPolicy`), declares them in the ledger, and its model calls keep them."""

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    BudgetExceededError,
    CallPolicy,
    InvalidInputError,
    LeaseLostError,
    RateLimit,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.budgets import Budget
from idempotent_jobs.core.rate_limits import RateRequest
from idempotent_jobs.models import OpenAIChat, Prompt, answer
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders

#: Two requests per 10-second window: the first goes at once, the second waits for its place.
LIMIT = RateLimit("openai", "gpt-4o-mini", requests_per_minute=2, window_seconds=10)


@pytest.fixture
def arrivals() -> list[float]:
    """When each request reached the fake provider (monotonic seconds)."""
    return []


@pytest.fixture
def provider(arrivals: list[float]) -> Iterator[FakeProviders]:
    def answer_and_note(request: object) -> Answer:
        arrivals.append(time.monotonic())
        return Answer("a summary", 20, 5)

    with FakeProviders(default=answer_and_note) as fake:
        yield fake


@pytest.mark.parametrize("given", ["keywords", "policy"])
def test_run_idempotent_declares_its_rate_limits_and_its_calls_keep_them(
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    provider: FakeProviders,
    arrivals: list[float],
    given: str,
) -> None:
    model = OpenAIChat(model="gpt-4o-mini", api_key="sk-test", base_url=provider.openai_url)
    for hour in range(2):
        ident = identity(f"policy-{given}", hour)
        outcome = run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"x": 1},
            transform=lambda raw: answer(model, Prompt.of(user=json.dumps(raw)), None),
            validate=lambda output: bool(output.get("text")),
            **(
                {"rate_limits": [LIMIT]}
                if given == "keywords"
                else {"policy": CallPolicy(rate_limits=[LIMIT])}
            ),
        )
        assert outcome.executed
    [row] = operator.rate_limits()
    assert (row["requests_per_window"], row["declared_by"]) == (2, ident.job_name)
    # Paced under 2 per 10 s, the second request's place is seconds after the first's (with no
    # limit it would follow at once).
    first, second = arrivals
    assert second - first > 3.0, arrivals
    assert len(provider.requests) == 2


def test_a_policy_and_its_keywords_together_are_refused_naming_policy(
    ledger: HarnessLedger,
) -> None:
    with pytest.raises(InvalidInputError, match="policy"):
        run_idempotent(
            ledger,
            identity("both"),
            collect=lambda i: {"x": 1},
            transform=lambda raw: {"summary": "s"},
            policy=CallPolicy(max_tokens_per_call=10),
            max_tokens_per_call=10,
        )
    assert ledger.get(identity("both").run_id) is None  # refused before any write


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate_limits": LIMIT}, "rate_limits"),
        ({"rate_limits": ["openai 2/min"]}, "rate_limits"),
        ({"max_tokens_per_call": 0}, "max_tokens_per_call"),
        ({"budget": "10 USD"}, "budget"),
        ({"follow_ledger_budget": "yes"}, "follow_ledger_budget"),
    ],
)
def test_a_bad_policy_names_its_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        CallPolicy(**kwargs)  # type: ignore[arg-type]
    assert refused.value.field == field


def test_a_policy_is_built_once_and_reads_as_its_parts() -> None:
    policy = CallPolicy(budget=Budget(amount=1000), max_tokens_per_call=300, rate_limits=[LIMIT])
    assert policy.budgets == (Budget(amount=1000),) and policy.rate_limits == (LIMIT,)
    assert policy.job_name is None and policy.for_job("j").job_name == "j"
    assert policy.for_job("j").for_job("k").job_name == "j"


def test_a_policy_with_rate_limits_and_no_job_is_refused_not_skipped(ledger: HarnessLedger) -> None:
    _, lease = ledger.begin(identity("nameless"), "w", 30)
    assert lease is not None
    with pytest.raises(InvalidInputError) as refused:
        CallPolicy(rate_limits=[LIMIT]).declare(ledger, lease)
    assert refused.value.field == "job_name"
    assert ledger.known_rate_limits() == {}


def _reserved(db: psycopg.Connection, job: str) -> object:
    row = db.execute(
        "SELECT sum(reserved) FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (f"job:tokens/day:{job}",),
    ).fetchone()
    assert row is not None
    return row[0]


def _tat(db: psycopg.Connection) -> tuple[object, object]:
    row = db.execute("SELECT requests_tat, tokens_tat FROM idempotent_jobs.rate_limits").fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_request_is_admitted_in_one_statement_and_each_part_only_after_the_one_before(
    ledger: HarnessLedger, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease, budget hold and rate-limit place in one round trip; a lost lease holds and places
    nothing, and a budget's refusal takes no place."""
    job = identity("s").job_name
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1000), job_name=job)
    ledger.declare_rate_limit(LIMIT, job)
    _, lease = ledger.begin(identity("s"), "w", 30)
    assert lease is not None
    lease = ledger.checkpoint(lease, {"x": 1})
    request = RateRequest("openai", "gpt-4o-mini", tokens=10, max_output_tokens=400)
    statements: list[str] = []
    fetch = ledger._db.fetch

    def counted(name: str, *args: Any) -> Any:
        statements.append(name)
        return fetch(name, *args)

    monkeypatch.setattr(ledger._db, "fetch", counted)
    grant = ledger.admit_request(
        lease, renew=True, hold=True, max_output_tokens=400, place=request, place_tokens=10
    )
    assert statements == ["admit_request"]
    assert grant is not None and grant.granted
    assert _reserved(db, job) == 400
    placed = _tat(db)
    assert placed[0] is not None
    # A budget with no room: refused, and no place taken.
    with pytest.raises(BudgetExceededError):
        ledger.admit_request(
            lease, hold=True, max_output_tokens=1200, place=request, place_tokens=10
        )
    assert _tat(db) == placed
    # A lease another claim took: nothing held, nothing placed.
    before = _reserved(db, job)
    stale = replace(lease, epoch=lease.epoch + 1)
    with pytest.raises(LeaseLostError):
        ledger.admit_request(stale, hold=True, max_output_tokens=10, place=request, place_tokens=1)
    assert _tat(db) == placed and _reserved(db, job) == before
