"""Real models for a job's own prompt and output shape, against local fake providers that speak
OpenAI's and Anthropic's documented formats: structured output asked for and checked, repair
turns paid for and recorded, provider errors typed and retried within bounds, the requested and
the answering model both kept."""

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import psycopg
import pytest
from pydantic import BaseModel

from idempotent_jobs import InvalidInputError, ModelAnswer, run_idempotent
from idempotent_jobs.models import (
    AnthropicMessages,
    ContextTooLongError,
    OpenAIChat,
    OutputSchema,
    OutputSchemaError,
    Prompt,
    ProviderUnavailableError,
    RateLimitedError,
    RefusalError,
    RetryPolicy,
    answer,
    require,
)
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Status


class Clause(BaseModel):
    kind: str
    risk: int


class Clauses(BaseModel):
    clauses: list[Clause]


GOOD = json.dumps({"clauses": [{"kind": "termination", "risk": 3}]})
BAD = json.dumps({"clauses": [{"kind": "termination"}]})  # risk missing


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer(GOOD)) as server:
        yield server


def contracts_prompt(raw: dict[str, Any]) -> Prompt:
    [contracts] = require(raw, "contracts")
    return Prompt.of(
        system="List each clause of the contracts with its risk from 1 to 5.",
        user=json.dumps(contracts),
        cache_system=True,
    )


def providers(fake: FakeProviders) -> dict[str, Any]:
    return {
        "openai": OpenAIChat(model="gpt-4o", api_key="sk-test", base_url=fake.openai_url),
        "anthropic": AnthropicMessages(
            model="claude-sonnet-4-5", api_key="sk-ant-test", base_url=fake.anthropic_url
        ),
    }


def calls(db: psycopg.Connection, run_id: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT turn, outcome, requested_model, model_name, input_tokens, output_tokens"
        " FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
        (run_id,),
    ).fetchall()


def no_wait() -> RetryPolicy:
    waits: list[float] = []
    return RetryPolicy(max_retries=2, sleep=waits.append)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_schema_is_asked_for_and_a_bad_first_answer_is_repaired(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = providers(fake)[api]
    answered_by = {"openai": "gpt-4o-2024-08-06", "anthropic": "claude-sonnet-4-5-20250929"}[api]
    fake.script = [
        Answer(BAD, 900, 30, model=answered_by),
        Answer(GOOD, 960, 35, model=answered_by),
    ]
    ident = identity(subject=f"contracts-{api}")

    def transform(raw: dict[str, Any]) -> ModelAnswer:
        return answer(provider, contracts_prompt(raw), OutputSchema.of(Clauses), retry=no_wait())

    outcome = run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"contracts": [{"id": "c-1", "text": "Either party may terminate."}]},
        transform=transform,
    )
    assert outcome.executed and outcome.output == json.loads(GOOD)
    asked = provider.model
    assert calls(db, ident.run_id) == [
        (1, "rejected", asked, answered_by, 900, 30),
        (None, "accepted", asked, answered_by, 960, 35),
    ]
    first, repair = fake.requests
    if api == "openai":
        schema = first.body["response_format"]["json_schema"]
        assert schema["name"] == "Clauses" and schema["strict"] is True
        # Strict structured output: every object closed, every property required.
        clause = schema["schema"]["$defs"]["Clause"]
        assert clause["additionalProperties"] is False and clause["required"] == ["kind", "risk"]
        assert "c-1" in first.body["messages"][-1]["content"]
        last = repair.body["messages"][-1]["content"]
    else:
        sent = first.body["output_config"]["format"]["schema"]  # as the SDK's helper makes it
        assert sent == anthropic.transform_schema(Clauses)
        assert first.body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert "c-1" in first.body["messages"][-1]["content"][0]["text"]
        last = repair.body["messages"][-1]["content"][0]["text"]
    assert "clauses/0/risk: Field required" in last  # the repair turn says what was wrong
    assert repair.body["messages"][-2]["role"] == "assistant"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_answer_that_stays_outside_the_schema_fails_with_every_call_paid_for(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = providers(fake)[api]
    fake.default = lambda request: Answer(BAD, 500, 20)
    ident = identity(subject=f"never-{api}")
    with pytest.raises(OutputSchemaError, match="after 2 repair turn"):
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"contracts": []},
            transform=lambda raw: answer(
                provider, contracts_prompt(raw), OutputSchema.of(Clauses), repair_turns=2
            ),
        )
    assert [c[:2] for c in calls(db, ident.run_id)] == [
        (1, "rejected"),
        (2, "rejected"),
        (None, "rejected"),
    ]
    assert all(c[4:] == (500, 20) for c in calls(db, ident.run_id))
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "failed" and record.output is None


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_429_is_waited_out_as_the_provider_says_and_recorded(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = providers(fake)[api]
    kind = {"openai": "rate_limit_exceeded", "anthropic": "rate_limit_error"}[api]
    fake.script = [Status(429, "slow down", kind, retry_after="7")]
    waits: list[float] = []
    ident = identity(subject=f"throttled-{api}")
    outcome = run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"contracts": []},
        transform=lambda raw: answer(
            provider,
            contracts_prompt(raw),
            OutputSchema.of(Clauses),
            retry=RetryPolicy(sleep=waits.append),
        ),
    )
    assert outcome.executed and waits == [7.0]
    assert [c[:2] for c in calls(db, ident.run_id)] == [(1, "failed"), (None, "accepted")]


def test_transient_errors_are_retried_up_to_the_bound_then_fail_the_attempt(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = providers(fake)["anthropic"]
    fake.default = lambda request: Status(529, "Overloaded", "overloaded_error")
    ident = identity(subject="overloaded")
    with pytest.raises(ProviderUnavailableError, match="Overloaded"):
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"contracts": []},
            transform=lambda raw: answer(provider, contracts_prompt(raw), None, retry=no_wait()),
        )
    assert len(fake.requests) == 3  # the first and two retries
    assert [c[:2] for c in calls(db, ident.run_id)] == [
        (1, "failed"),
        (2, "failed"),
        (None, "failed"),
    ]


def test_a_retry_after_longer_than_the_bound_ends_the_attempt_at_once(
    fake: FakeProviders, ledger: HarnessLedger
) -> None:
    provider = providers(fake)["openai"]
    fake.script = [Status(429, "try tomorrow", "rate_limit_exceeded", retry_after="86400")]
    with pytest.raises(RateLimitedError) as raised:
        run_idempotent(
            ledger,
            identity(subject="tomorrow"),
            collect=lambda i: {"contracts": []},
            transform=lambda raw: answer(provider, contracts_prompt(raw), None, retry=no_wait()),
        )
    assert raised.value.retry_after == 86400 and len(fake.requests) == 1


@pytest.mark.parametrize(
    ("api", "status", "error"),
    [
        (
            "openai",
            Status(
                400,
                "This model's maximum context length is 128000 tokens",
                "context_length_exceeded",
            ),
            ContextTooLongError,
        ),
        (
            "anthropic",
            Status(
                400, "prompt is too long: 250000 tokens > 200000 maximum", "invalid_request_error"
            ),
            ContextTooLongError,
        ),
        ("openai", Answer("I can't help with that.", stop="refusal"), RefusalError),
        ("anthropic", Answer("I can't help with that.", stop="refusal"), RefusalError),
    ],
)
def test_errors_that_will_not_pass_are_typed_and_not_retried(
    api: str, status: Any, error: type[Exception], fake: FakeProviders, ledger: HarnessLedger
) -> None:
    provider = providers(fake)[api]
    fake.script = [status]
    with pytest.raises(error):
        run_idempotent(
            ledger,
            identity(subject=f"{api}-{error.__name__}"),
            collect=lambda i: {"contracts": []},
            transform=lambda raw: answer(provider, contracts_prompt(raw), OutputSchema.of(Clauses)),
        )
    assert len(fake.requests) == 1


def test_a_timeout_is_retried_and_the_slow_call_recorded(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    from testkit.fake_providers import Slow

    provider = OpenAIChat(
        model="gpt-4o", api_key="sk-test", base_url=fake.openai_url, timeout_seconds=0.3
    )
    fake.script = [Slow(2.0, Answer(GOOD))]
    ident = identity(subject="slow")
    outcome = run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"contracts": []},
        transform=lambda raw: answer(provider, contracts_prompt(raw), None, retry=no_wait()),
    )
    assert outcome.executed
    assert [c[:2] for c in calls(db, ident.run_id)] == [(1, "failed"), (None, "accepted")]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_answer_cut_off_mid_way_is_retried_and_recorded(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    from testkit.fake_providers import Drop

    provider = providers(fake)[api]
    fake.script = [Drop(Answer(GOOD))]
    ident = identity(subject=f"dropped-{api}")
    outcome = run_idempotent(
        ledger,
        ident,
        collect=lambda i: {"contracts": []},
        transform=lambda raw: answer(
            provider, contracts_prompt(raw), OutputSchema.of(Clauses), retry=no_wait()
        ),
    )
    assert outcome.executed and len(fake.requests) == 2
    assert [c[:2] for c in calls(db, ident.run_id)] == [(1, "failed"), (None, "accepted")]


def test_a_missing_input_key_is_refused_before_any_call(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = providers(fake)["openai"]
    ident = identity(subject="no-contracts")
    with pytest.raises(InvalidInputError) as refused:
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"documents": ["a"]},
            transform=lambda raw: answer(provider, contracts_prompt(raw), None),
        )
    assert str(refused.value).startswith("raw_input: has no 'contracts'")
    assert "'documents'" in str(refused.value)
    assert fake.requests == []


def test_a_json_schema_is_checked_as_well_as_a_pydantic_model(fake: FakeProviders) -> None:
    schema = OutputSchema.of(
        {
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": ["score"],
            "additionalProperties": False,
        },
        name="score",
    )
    fake.script = [Answer('{"score": 140}'), Answer('{"score": 40}')]
    provider = providers(fake)["openai"]
    got = answer(provider, Prompt.of(user="score it"), schema, retry=no_wait())
    assert got.output == {"score": 40}
    assert "score: 140 is greater than the maximum of 100" in str(
        fake.requests[1].body["messages"][-1]["content"]
    )
    with pytest.raises(InvalidInputError, match="output_schema"):
        OutputSchema.of({"type": "array"})


def test_the_model_steps_record_their_prompt_builder_and_schema_as_configuration(
    fake: FakeProviders,
) -> None:
    """The resources as a job configures them: by import path. A changed builder or schema
    changes the recorded configuration (a reused result computed under another says so)."""
    from datetime import UTC, datetime

    from idempotent_jobs import RunIdentity
    from idempotent_jobs.core.records import JobConfig
    from idempotent_jobs.dagster import AnthropicModel, OpenAICompatibleModel, StepContext

    here = "idempotent_jobs_tests.dagster.test_real_models"
    ident = RunIdentity("contracts", "acme", datetime(2026, 11, 2, tzinfo=UTC), "v1")
    context = StepContext(ident, "List the clauses.", ident.run_id)
    for step in (
        OpenAICompatibleModel(
            model="gpt-4o",
            api_key="k",
            base_url=fake.openai_url,
            prompt=f"{here}:builder",
            output_schema=f"{here}:Clauses",
        ),
        AnthropicModel(
            model="claude-sonnet-4-5",
            api_key="k",
            base_url=fake.anthropic_url,
            prompt=f"{here}:builder",
            output_schema=f"{here}:Clauses",
        ),
    ):
        settings = step.settings()
        assert set(settings) == {"prompt_builder", "output_schema"}
        config = JobConfig.of(prompt="p", model=step.model_name, validator="v", **settings)
        assert config.parts["model"] == step.model
        got = step.generate({"contracts": [{"id": "c-9"}]}, context)
        assert got.output == json.loads(GOOD) and got.usage.requested_model == step.model
    assert "c-9" in json.dumps(fake.requests[-1].body)
    with pytest.raises(InvalidInputError, match="^prompt: cannot import 'no_such_module'"):
        OpenAICompatibleModel(model="m", prompt="no_such_module:x").build_prompt({}, context)
    with pytest.raises(InvalidInputError, match="^output_schema: module .* has no 'Nope'"):
        OpenAICompatibleModel(model="m", output_schema=f"{here}:Nope").output_schema_of()


def builder(raw: dict[str, Any], context: Any) -> Prompt:
    return contracts_prompt(raw)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_usage_parts_are_recorded_as_the_provider_reports_them_and_priced(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    from datetime import UTC, datetime
    from decimal import Decimal

    from idempotent_jobs import LedgerAdmin

    provider = providers(fake)[api]
    fake.script = [
        Answer(
            GOOD,
            5000,
            200,
            cached_input_tokens=4000,
            cache_write_tokens=800,
            reasoning_tokens=50 if api == "openai" else 0,
        )
    ]
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price(
            provider.model,
            "2",
            "10",
            cache_read_per_million="0.5",
            cache_write_per_million="4",
            effective_from=datetime(2020, 1, 1, tzinfo=UTC),
        )
        ident = identity(subject=f"usage-{api}")
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"contracts": [{"id": "c-1"}]},
            transform=lambda raw: answer(provider, contracts_prompt(raw), OutputSchema.of(Clauses)),
        )
        row = db.execute(
            "SELECT input_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,"
            " provider_name FROM idempotent_jobs.model_calls WHERE run_id = %s",
            (ident.run_id,),
        ).fetchone()
        [cost] = admin.call_costs(ident.run_id).values()
    if api == "openai":  # OpenAI reports cache reads (within prompt_tokens) and reasoning
        assert row == (5000, 4000, None, 50, "openai")
        assert cost == (Decimal(1000) * 2 + Decimal(4000) * Decimal("0.5") + 200 * 10) / 10**6
    else:  # Anthropic reports reads and writes beside the uncached input
        assert row == (5000, 4000, 800, None, "anthropic")
        expected = 200 * 2 + Decimal(4000) * Decimal("0.5") + 800 * 4 + 200 * 10
        assert cost == Decimal(expected) / 10**6


def test_a_real_models_request_reserves_its_worst_case_before_it_is_sent(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """The request's most input tokens (its bytes) and most output tokens (max_tokens) are
    held under the budget before it is sent, then settled to what the provider reported."""
    from idempotent_jobs import Budget, BudgetExceededError

    provider = providers(fake)["anthropic"]  # max_tokens 1024 by default
    fake.default = lambda request: Answer(GOOD, 300, 40)
    job = identity(subject="worst-case").job_name

    def run(subject: str, budget: Budget) -> str:
        ident = identity(subject=subject)
        run_idempotent(
            ledger,
            ident,
            collect=lambda i: {"contracts": [{"id": "c-1"}]},
            transform=lambda raw: answer(provider, contracts_prompt(raw), OutputSchema.of(Clauses)),
            budget=budget,
            follow_ledger_budget=True,
        )
        return ident.run_id

    with pytest.raises(BudgetExceededError) as refused:
        run("too-small", Budget(amount=1500))  # 1,024 output + the prompt's bytes > 1,500
    assert fake.requests == [] and refused.value.wanted > 1500
    db.execute(
        "UPDATE idempotent_jobs.spend_budgets SET amount = 100000 WHERE budget_id = %s",
        (f"job:tokens/day:{job}",),
    )
    run("fits", Budget(amount=1500))
    counter = db.execute(
        "SELECT spent, reserved FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (f"job:tokens/day:{job}",),
    ).fetchone()
    assert counter == (340, 0)  # settled to the 300 + 40 reported; nothing left held
