"""One bad item never stops a batch: a result line that is not JSON, a 200 body that is not an
answer, an answer over the ledger's limit, a payload builder that raises. Each ends its own
item's attempt (error kept, lease free, hold given back or settled, the call recorded once);
every good item is accepted, the batch is collected, and nothing is left held."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from idempotent_jobs import Budget, JobConfig, LedgerAdmin, RunIdentity
from idempotent_jobs.batches import BatchSteps, advance, open_intent
from idempotent_jobs.models import OutputSchema, Prompt
from idempotent_jobs_tests.helpers import batch_provider
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_batches import BadLine, OddBody
from testkit.fake_providers import Answer, FakeProviders, Request, Status

JOB = "poisoned-batch"
SCHEMA = OutputSchema.of(
    {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
    name="Label",
)
SUBJECTS = ("ok1", "badline", "garbage", "oddbody", "huge", "boom", "ok2")


def _answer(request: Request) -> Answer | Status | BadLine | OddBody:
    text = json.dumps(request.body)
    if "subject badline" in text:
        return BadLine(named=True)
    if "subject garbage" in text:
        return BadLine(named=False)
    if "subject oddbody" in text:
        keys = ("prompt_tokens", "completion_tokens")
        if request.api == "anthropic":
            keys = ("input_tokens", "output_tokens")
        return OddBody({"weird": True, "usage": {keys[0]: 7, keys[1]: 3}})
    if "subject huge" in text:
        return Answer(json.dumps({"label": "x" * (1024 * 1024 + 10)}), 60, 400_000)
    return Answer('{"label": "ok"}', input_tokens=50, output_tokens=5)


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=_answer) as server:
        yield server


def _notifications(identity: RunIdentity, output: dict[str, Any]) -> dict[str, Any]:
    if identity.subject_id == "boom":
        raise KeyError("recipient")  # the job's payload builder fails for this one item
    return {"webhook": {"label": output["label"]}}


STEPS = BatchSteps(
    job_name=JOB,
    collect=lambda identity: {"subject": identity.subject_id},
    prompt=lambda raw, identity: Prompt.of(system="Label it.", user=f"subject {raw['subject']}"),
    schema=SCHEMA,
    notifications=_notifications,
    config=JobConfig.of(prompt="Label it.", model="m", validator=""),
)


def _ids() -> list[RunIdentity]:
    return [RunIdentity(JOB, s, datetime(2026, 11, 1, tzinfo=UTC), "v1") for s in SUBJECTS]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_one_bad_item_ends_its_own_attempt_and_the_batch_goes_on(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=10**9), job_name=JOB)
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, STEPS, provider, _ids(), worker_id="w1")
    assert batch is not None
    progress = None
    for _ in range(5):  # submit, then collect: no step raises
        progress = advance(ledger, STEPS, provider, batch.batch_id, worker_id="w1")
        if progress.collected:
            break
    assert progress is not None and progress.collected
    items: dict[str, str] = dict(
        db.execute(
            "SELECT r.subject_id, i.state FROM idempotent_jobs.batch_items i"
            " JOIN idempotent_jobs.runs r USING (run_id)"
        ).fetchall()
    )
    assert items == {
        "ok1": "accepted",
        "ok2": "accepted",
        "badline": "failed",
        "garbage": "released",  # its line names no item: no result for it
        "oddbody": "failed",
        "huge": "failed",
        "boom": "failed",
    }
    runs = {
        subject: (status, owner)
        for subject, status, owner in db.execute(
            "SELECT subject_id, status, lease_owner FROM idempotent_jobs.runs"
        ).fetchall()
    }
    assert {s for s, (status, _) in runs.items() if status == "completed"} == {"ok1", "ok2"}
    assert all(owner is None for _, owner in runs.values())  # nothing left held
    calls = {
        subject: (outcome, tokens, billing)
        for subject, outcome, tokens, billing in db.execute(
            "SELECT r.subject_id, c.outcome, c.input_tokens, c.billing"
            " FROM idempotent_jobs.model_calls c JOIN idempotent_jobs.runs r USING (run_id)"
        ).fetchall()
    }
    assert calls == {
        "ok1": ("accepted", 50, "billed"),
        "ok2": ("accepted", 50, "billed"),
        "badline": ("failed", None, "in_doubt"),  # answered, unreadable: its cost unknown
        "oddbody": ("rejected", 7, "billed"),  # its reported usage is kept
        "huge": ("rejected", 60, "billed"),
        "boom": ("rejected", 50, "billed"),
    }
    errors: dict[str, str] = dict(
        db.execute(
            "SELECT subject_id, last_error FROM idempotent_jobs.runs WHERE status = 'failed'"
        ).fetchall()
    )
    assert "could not be read" in errors["badline"]
    assert "KeyError" in errors["boom"] and "recipient" in errors["boom"]
    assert "no result" in errors["garbage"]
    assert db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone() == (0,)
    counters = db.execute(
        "SELECT sum(reserved), sum(calls) FROM idempotent_jobs.budget_counters"
    ).fetchone()
    assert counters == (0, 6)
    outbox = db.execute(
        "SELECT r.subject_id FROM idempotent_jobs.notification_outbox o"
        " JOIN idempotent_jobs.runs r USING (run_id) ORDER BY 1"
    ).fetchall()
    assert outbox == [("ok1",), ("ok2",)]
