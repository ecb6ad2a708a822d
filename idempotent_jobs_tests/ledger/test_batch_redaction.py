"""The batch lane keeps out of the ledger what a provider or a proxy echoes of a request: the API
key (whatever its form: a gateway's key has no known prefix) and the prompt (with the raw input
it carries), in an item's error and in a refused batch's, as the online call does."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from idempotent_jobs import JobConfig, RunIdentity
from idempotent_jobs.batches import BatchSteps, advance, open_intent
from idempotent_jobs.models import Prompt
from idempotent_jobs.models.batches import AnthropicBatches, BatchProvider, OpenAIBatches
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Request, Status

JOB = "echoed-batch"
KEY = "gateway-SENTINELKEY-0123456789"  # no prefix a pattern would know
SECRET = "the confidential clause SENTINEL-PROMPT-4711"
ECHO = f"invalid content: {SECRET} (sent with key {KEY})"

STEPS = BatchSteps(
    job_name=JOB,
    collect=lambda identity: {"subject": identity.subject_id, "clause": SECRET},
    prompt=lambda raw, identity: Prompt.of(
        system="Label the clause.", user=f"{raw['subject']}: {raw['clause']}"
    ),
    config=JobConfig.of(prompt="Label the clause.", model="m", validator=""),
)


def _answer(request: Request) -> Answer | Status:
    if "refused:" in json.dumps(request.body):
        return Status(400, ECHO)
    return Answer('{"label": "ok"}', 50, 5)


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=_answer) as server:
        yield server


def _provider(api: str, fake: FakeProviders) -> BatchProvider:
    if api == "openai":
        return OpenAIBatches(model="gpt-4o-mini", api_key=KEY, base_url=fake.openai_url)
    return AnthropicBatches(model="claude-x", api_key=KEY, base_url=fake.anthropic_url)


def _opened(
    api: str, fake: FakeProviders, ledger: HarnessLedger, *subjects: str
) -> tuple[BatchProvider, str]:
    """The batch API of ``api`` on ``fake`` (with the sentinel key), and a batch of
    ``subjects`` opened on it."""
    provider = _provider(api, fake)
    ids = [RunIdentity(JOB, s, datetime(2026, 11, 1, tzinfo=UTC), "v1") for s in subjects]
    batch = open_intent(ledger, STEPS, provider, ids, worker_id="w1")
    assert batch is not None
    return provider, batch.batch_id


def _echoes(db: psycopg.Connection) -> list[tuple[str, str, str]]:
    """Every text of the ledger that holds the key or the prompt (the raw input itself aside)."""
    columns = db.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'idempotent_jobs' AND data_type IN ('text', 'jsonb')"
    ).fetchall()
    found = []
    for table, column in columns:
        for sentinel in ("SENTINELKEY", "SENTINEL-PROMPT"):
            if (table, column) == ("runs", "raw_input") and sentinel == "SENTINEL-PROMPT":
                continue  # the checkpoint is the input, not an error's text
            query = sql.SQL("SELECT {}::text FROM {} WHERE {}::text LIKE %s").format(
                sql.Identifier(column),
                sql.Identifier("idempotent_jobs", table),
                sql.Identifier(column),
            )
            found += [(table, column, v[:200]) for (v,) in db.execute(query, (f"%{sentinel}%",))]
    return found


def _errors(db: psycopg.Connection, query: str) -> list[str]:
    return [str(row[0]) for row in db.execute(query).fetchall()]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_items_error_echoing_the_key_and_the_prompt_leaves_neither_in_the_ledger(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider, batch_id = _opened(api, fake, ledger, "kept", "refused:")
    for _ in range(5):
        if advance(ledger, STEPS, provider, batch_id, worker_id="w1").collected:
            break
    states: dict[str, str] = dict(
        db.execute(
            "SELECT r.subject_id, i.state FROM idempotent_jobs.batch_items i"
            " JOIN idempotent_jobs.runs r USING (run_id)"
        ).fetchall()
    )
    assert states == {"kept": "accepted", "refused:": "failed"}
    assert _echoes(db) == []
    [error] = _errors(db, "SELECT error FROM idempotent_jobs.batch_items WHERE error IS NOT NULL")
    assert "invalid content: [prompt]" in error and "key ****" in error
    [call] = _errors(db, "SELECT error FROM idempotent_jobs.model_calls WHERE error IS NOT NULL")
    assert "[prompt]" in call and "****" in call


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_refused_batch_echoing_the_key_and_a_prompt_leaves_neither_in_the_ledger(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider, batch_id = _opened(api, fake, ledger, "one", "two")
    fake.batches.fail_next = {"create": [(400, f"line 2: {SECRET}: refused for key {KEY}")]}
    assert advance(ledger, STEPS, provider, batch_id, worker_id="w1").collected
    assert _echoes(db) == []
    [error] = _errors(db, "SELECT error FROM idempotent_jobs.batches")
    assert "the provider refused the batch" in error
    assert "[prompt]" in error and "****" in error
    attempts = _errors(db, "SELECT error FROM idempotent_jobs.run_attempts")
    assert len(attempts) == 2 and all("[prompt]" in text for text in attempts)
