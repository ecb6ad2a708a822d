"""One call policy per job, for both drivers: ``run_idempotent`` takes rate limits (its own
keywords or a :class:`CallPolicy`), declares them in the ledger, and its model calls keep them."""

import json
import time
from collections.abc import Iterator

import pytest

from idempotent_jobs import CallPolicy, InvalidInputError, RateLimit, run_idempotent
from idempotent_jobs.core.budgets import Budget
from idempotent_jobs.models import OpenAIChat, Prompt, answer
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import BothFaces
from testkit.fake_providers import Answer, FakeProviders

#: Two requests per 10-second window: the first goes at once, the second waits for its place.
LIMIT = RateLimit("openai", "gpt-4o-mini", requests_per_minute=2, window_seconds=10)


@pytest.fixture
def provider() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer("a summary", 20, 5)) as fake:
        yield fake


@pytest.mark.parametrize("given", ["keywords", "policy"])
def test_run_idempotent_declares_its_rate_limits_and_its_calls_keep_them(
    ledger: BothFaces, provider: FakeProviders, given: str
) -> None:
    model = OpenAIChat(model="gpt-4o-mini", api_key="sk-test", base_url=provider.openai_url)
    took: list[float] = []
    for hour in range(2):
        ident = identity(f"policy-{given}", hour)
        started = time.monotonic()
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
        took.append(time.monotonic() - started)
        assert outcome.executed
    [row] = ledger.admin.rate_limits()
    assert (row["requests_per_window"], row["declared_by"]) == (2, ident.job_name)
    # At 90% of 2 per 10 s, the second request's place is about 5.5 s after the first's.
    assert took[0] < 3.0 and took[1] > 2.5, took
    assert len(provider.requests) == 2


def test_a_policy_and_its_keywords_together_are_refused_naming_policy(ledger: BothFaces) -> None:
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
