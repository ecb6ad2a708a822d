"""The batch lane against local fake batch APIs of both providers (OpenAI's Batch API and
Anthropic's Message Batches, testkit.fake_batches): each batch submitted once, even when a
create's answer is lost; each run accepted once through the fenced commit; per-item failures,
expiry and runs that moved on handled item by item; budgets held for the whole batch."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from idempotent_jobs import (
    Budget,
    BudgetExceededError,
    JobConfig,
    LedgerAdmin,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    run_idempotent,
)
from idempotent_jobs.batches import BatchSteps, advance, open_intent
from idempotent_jobs.models import OutputSchema, Prompt, ProviderUnavailableError
from idempotent_jobs.models.batches import BatchProvider
from idempotent_jobs_tests.helpers import batch_provider
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Request, Status

JOB = "batch-job"
SCHEMA = OutputSchema.of(
    {
        "type": "object",
        "properties": {"label": {"type": "string"}},
        "required": ["label"],
    },
    name="Label",
)


def _answer(request: Request) -> Answer | Status:
    """A label per subject; subject `err` gets a per-item error, `bad` an answer off-schema."""
    text = json.dumps(request.body)
    if "subject err" in text:
        return Status(400, "invalid request", "invalid_request_error")
    if "subject bad" in text:
        return Answer('{"nolabel": 1}', input_tokens=50, output_tokens=5)
    return Answer('{"label": "ok"}', input_tokens=50, output_tokens=5)


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=_answer) as server:
        yield server


def _prompt(raw: dict[str, Any], identity: RunIdentity) -> Prompt:
    return Prompt.of(system="Label it.", user=f"subject {raw['subject']}")


def _steps() -> BatchSteps:
    return BatchSteps(
        job_name=JOB,
        collect=lambda identity: {"subject": identity.subject_id},
        prompt=lambda raw, identity: Prompt.of(
            system="Label it.", user=f"subject {raw['subject']}"
        ),
        schema=SCHEMA,
        notifications=lambda identity, output: {"webhook": {"label": output["label"]}},
        config=JobConfig.of(prompt="Label it.", model="m", validator=""),
    )


def _ids(*subjects: str) -> list[RunIdentity]:
    return [RunIdentity(JOB, s, datetime(2026, 11, 1, tzinfo=UTC), "v1") for s in subjects]


def _drive(ledger: HarnessLedger, provider: BatchProvider, batch_id: str, steps: int = 10) -> Any:
    """Advance the batch as its worker (`w1`, restarted) until it is collected."""
    for _ in range(steps):
        progress = advance(ledger, _steps(), provider, batch_id, worker_id="w1")
        if progress.collected:
            return progress
    raise AssertionError(f"batch {batch_id} not collected after {steps} steps")


def _lapse(ledger: HarnessLedger, batch_id: str) -> None:
    """The batch's lease lapses, as when the worker holding it died (the database's clock)."""
    with ledger.connection() as conn:
        conn.execute(
            "UPDATE idempotent_jobs.batches SET lease_expires_at = now() - interval '1 second'"
            " WHERE batch_id = %s",
            (batch_id,),
        )


def _calls(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT r.subject_id, c.outcome, c.tier, c.input_tokens, c.worker_id"
        " FROM idempotent_jobs.model_calls c JOIN idempotent_jobs.runs r USING (run_id)"
        " ORDER BY r.subject_id"
    ).fetchall()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_backfill_through_a_batch_is_submitted_once_and_each_run_accepted_once(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    fake.batches.polls_to_complete = 2
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b", "c"), worker_id="w1")
    assert batch is not None
    first = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    assert first.state == "submitted" and first.items == {"pending": 3}
    # While the batch holds the runs, an online worker steps aside: busy, held by the batch.
    online = run_idempotent(
        ledger,
        _ids("a")[0],
        collect=lambda i: {"subject": "a"},
        transform=lambda raw: {"label": "online"},
        worker_id="online",
    )
    assert not online.executed and online.status == "running"
    assert ledger.get(online.run_id).lease_owner == f"batch:{batch.batch_id}"  # type: ignore[union-attr]
    done = _drive(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 3}
    assert len(fake.batches.created[api]) == 1
    assert [(s, o, t) for s, o, t, _, _ in _calls(db)] == [
        ("a", "accepted", "batch"),
        ("b", "accepted", "batch"),
        ("c", "accepted", "batch"),
    ]
    outbox = db.execute("SELECT count(*) FROM idempotent_jobs.notification_outbox").fetchone()
    assert outbox == (3,)
    # The partitions' ordinary runs reuse the batch's results: no model call.
    called: list[str] = []
    again = run_idempotent(
        ledger,
        _ids("b")[0],
        collect=lambda i: {"subject": "b"},
        transform=lambda raw: called.append("b") or {"label": "x"},  # type: ignore[func-returns-value]
    )
    assert again.output == {"label": "ok"} and not again.executed and called == []


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_create_whose_answer_was_lost_is_found_and_adopted_not_submitted_again(
    api: str, fake: FakeProviders, ledger: HarnessLedger
) -> None:
    fake.batches.lose_next_creates = 1  # the provider makes the batch, the answer is a 500
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None
    with pytest.raises(ProviderUnavailableError):
        advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    # Another worker takes over once the first one's lease has lapsed: it looks before creating.
    _lapse(ledger, batch.batch_id)
    progress = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w2")
    assert progress.state == "submitted"
    assert progress.provider_batch_id == fake.batches.created[api][0]
    assert len(fake.batches.created[api]) == 1
    _lapse(ledger, batch.batch_id)
    assert _drive(ledger, provider, batch.batch_id).items == {"accepted": 2}


def test_a_crash_after_the_create_before_its_id_is_recorded_adopts_the_batch(
    fake: FakeProviders, ledger: HarnessLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None

    class Killed(BaseException):
        pass

    def crash(*args: Any) -> bool:
        raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(ledger, "record_submitted", crash)
        with pytest.raises(Killed):
            advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    assert len(fake.batches.created["openai"]) == 1
    _lapse(ledger, batch.batch_id)
    progress = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w2")
    assert progress.provider_batch_id == fake.batches.created["openai"][0]
    assert len(fake.batches.created["openai"]) == 1
    row = ledger.batch_row(batch.batch_id)
    assert row is not None and row["state"] == "submitted"


def test_a_second_batch_for_one_intent_is_cancelled_and_reported(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Two creates reached the provider (both answers lost): one is adopted, the other
    cancelled before its results are used, and recorded as a duplicate."""
    fake.batches.lose_next_creates = 2
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a"), worker_id="w1")
    assert batch is not None
    # A worker whose search found nothing (the first lost create not listed yet) creates again.
    with pytest.raises(ProviderUnavailableError):
        advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    made = fake.batches.created["openai"][0]
    fake.batches.batches[made].metadata = {}  # hidden from the next search
    with pytest.raises(ProviderUnavailableError):
        advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    fake.batches.batches[made].metadata = {"idempotent_jobs_batch": batch.batch_id}
    progress = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    assert progress.duplicates == 1 and len(fake.batches.created["openai"]) == 2
    assert progress.provider_batch_id == made  # the oldest is adopted
    duplicate = fake.batches.created["openai"][1]
    assert fake.batches.batches[duplicate].state == "cancelling"
    rows = db.execute(
        "SELECT provider_batch_id, role, cancelled_at IS NOT NULL"
        " FROM idempotent_jobs.batch_submissions ORDER BY role"
    ).fetchall()
    assert rows == [(made, "adopted", False), (duplicate, "duplicate", True)]


def test_two_intents_of_one_size_whose_creates_were_lost_each_adopt_their_own(
    fake: FakeProviders, ledger: HarnessLedger
) -> None:
    """Anthropic's batches carry no metadata: a lost create is found by its size. Two intents of
    the same size, both creates made and both answers lost: the first intent's search finds
    both batches, adopts the oldest and leaves the other to the intent it may belong to (not
    cancelled as its duplicate), whose own search adopts it. Two batches for two intents."""
    fake.batches.lose_next_creates = 2
    provider = batch_provider("anthropic", fake)
    first = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    second = open_intent(ledger, _steps(), provider, _ids("c", "d"), worker_id="w1")
    assert first is not None and second is not None
    for batch in (first, second):
        with pytest.raises(ProviderUnavailableError):
            advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    made = fake.batches.created["anthropic"]
    assert len(made) == 2
    one = advance(ledger, _steps(), provider, first.batch_id, worker_id="w1")
    two = advance(ledger, _steps(), provider, second.batch_id, worker_id="w1")
    assert (one.provider_batch_id, two.provider_batch_id) == (made[0], made[1])
    assert one.duplicates == two.duplicates == 0
    assert len(fake.batches.created["anthropic"]) == 2
    assert all(fake.batches.batches[b].state != "cancelling" for b in made)
    assert _drive(ledger, provider, first.batch_id).items == {"accepted": 2}
    assert _drive(ledger, provider, second.batch_id).items == {"accepted": 2}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_cancelling_an_intent_whose_create_answer_was_lost_cancels_what_it_made(
    api: str,
    fake: FakeProviders,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    """An operator cancels an intent whose create reached the provider unanswered: the lane
    finds that batch and cancels it there, rather than ending the intent and leaving a batch
    running (and paid for) that the ledger never recorded."""
    fake.batches.lose_next_creates = 1
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None
    with pytest.raises(ProviderUnavailableError):
        advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    [made] = fake.batches.created[api]
    operator.cancel_batch(batch.batch_id, "operator")
    found = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    assert found.provider_batch_id == made
    done = _drive(ledger, provider, batch.batch_id)
    assert fake.batches.batches[made].state in ("cancelling", "ended")
    assert "cancel" in [endpoint for _, endpoint in fake.batches.calls]
    assert done.collected and len(fake.batches.created[api]) == 1


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_per_item_errors_and_answers_outside_the_schema_fail_their_runs_only(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, _steps(), provider, _ids("ok", "err", "bad"), worker_id="w1")
    assert batch is not None
    done = _drive(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 1, "failed": 2}
    assert [(s, o, n) for s, o, _, n, _ in _calls(db)] == [
        ("bad", "rejected", 50),  # paid for, refused: its cost kept
        ("err", "failed", 0),  # answered with an error: recorded once, not billed
        ("ok", "accepted", 50),
    ]
    billing = db.execute(
        "SELECT r.subject_id, c.billing, c.money FROM idempotent_jobs.model_calls c"
        " JOIN idempotent_jobs.runs r USING (run_id) WHERE r.subject_id = 'err'"
    ).fetchall()
    assert billing == [("err", "unbilled", 0)]
    states: dict[str, str] = dict(
        db.execute("SELECT subject_id, status FROM idempotent_jobs.runs").fetchall()
    )
    assert states == {"ok": "completed", "err": "failed", "bad": "failed"}
    # A failed run goes online (or into a new batch) like any failed run.
    retried = run_idempotent(
        ledger,
        _ids("err")[0],
        collect=lambda i: {"subject": "err"},
        transform=lambda raw: {"label": "online"},
    )
    assert retried.executed and retried.output == {"label": "online"}


def test_an_expired_batch_accepts_what_it_answered_and_releases_the_rest(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    fake.batches.expire_after_items = 2
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b", "c", "d"), worker_id="w1")
    assert batch is not None
    done = _drive(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 2, "released": 2}
    released = [
        row[0]
        for row in db.execute(
            "SELECT r.subject_id FROM idempotent_jobs.batch_items i"
            " JOIN idempotent_jobs.runs r USING (run_id) WHERE i.state = 'released'"
        ).fetchall()
    ]
    assert len(released) == 2
    ended = db.execute(
        "SELECT status, last_error, lease_owner FROM idempotent_jobs.runs"
        " WHERE subject_id = ANY(%s)",
        (released,),
    ).fetchall()
    for status, error, owner in ended:  # attempts ended, errors kept, leases free
        assert status == "failed" and owner is None
        assert "no result: the batch expired" in error or "expired or cancelled" in error
    for subject in released:  # back to the online lane: computed there, once
        free = run_idempotent(
            ledger,
            _ids(subject)[0],
            collect=lambda i: {"subject": i.subject_id},
            transform=lambda raw: {"label": "online"},
        )
        assert free.executed


def test_a_run_taken_meanwhile_keeps_its_result_the_batch_answer_is_paid_not_accepted(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None
    advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")  # submitted
    # The batch's lease on `a` lapsed (nobody drove it) and an online worker completed it.
    db.execute(
        "UPDATE idempotent_jobs.runs SET lease_expires_at = now() - interval '1 second'"
        " WHERE subject_id = 'a'"
    )
    online = run_idempotent(
        ledger,
        _ids("a")[0],
        collect=lambda i: {"subject": "a"},
        transform=lambda raw: ModelAnswer({"label": "online"}, ModelUsage("m", 10, 1)),
    )
    assert online.executed
    done = _drive(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 1, "not_accepted": 1}
    assert ledger.get(online.run_id).output == {"label": "online"}  # type: ignore[union-attr]
    calls = [(s, o, t) for s, o, t, _, _ in _calls(db)]
    assert calls == [
        ("a", "accepted", None),
        ("a", "lease_lost", "batch"),
        ("b", "accepted", "batch"),
    ]


def test_a_batch_that_does_not_fit_its_budget_is_refused_before_it_is_submitted(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=300), job_name=JOB)
    provider = batch_provider("anthropic", fake)
    with pytest.raises(BudgetExceededError):
        open_intent(ledger, _steps(), provider, _ids("a", "b", "c"), worker_id="w1")
    assert fake.batches.created["anthropic"] == []
    held = db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone()
    assert held == (0,)
    refused = db.execute("SELECT state, items, error FROM idempotent_jobs.batches").fetchone()
    assert refused is not None and refused[:2] == ("collected", 0)  # ended at once, no item
    assert str(refused[2]).startswith("refused by its budget")
    free = run_idempotent(
        ledger,
        _ids("a")[0],
        collect=lambda i: {"subject": "a"},
        transform=lambda raw: {"label": "online"},
    )
    assert free.executed


def _open_batch_id(db: psycopg.Connection) -> str:
    row = db.execute("SELECT batch_id FROM idempotent_jobs.batches").fetchone()
    assert row is not None
    return str(row[0])


def test_a_batch_holds_its_worst_case_and_settles_each_item_to_what_it_cost(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Money at the batch tier: held for every item before the submit, settled to each item's
    recorded cost, given back for an item with no result."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("claude-x", "3", "15")
        admin.set_price("claude-x", "1.5", "7.5", tier="batch")
        admin.set_budget(Budget(amount="1", unit="money", period="month"), job_name=JOB)
    fake.batches.expire_after_items = 2
    provider = batch_provider("anthropic", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b", "c"), worker_id="w1")
    assert batch is not None
    held = db.execute("SELECT count(*), sum(amount) FROM idempotent_jobs.budget_holds").fetchone()
    assert held is not None and held[0] == 3 and held[1] > 0
    done = _drive(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 2, "released": 1}
    counter = db.execute(
        "SELECT spent, reserved, calls FROM idempotent_jobs.budget_counters"
    ).fetchone()
    # Two calls of 50 input and 5 output tokens at 1.5 and 7.5 per million.
    assert counter == (2 * Decimal("0.0001125"), 0, 2)
    assert db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone() == (0,)


def test_an_opener_that_dies_before_adding_its_items_leaves_nothing_held(
    fake: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Holds are made before the items: a crash between leaves holds on an empty intent, which
    the lane gives back (never an intent that would be submitted without its holds)."""
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=10**9), job_name=JOB)

    class Killed(BaseException):
        pass

    def crash(*args: Any) -> list[str]:
        raise Killed()

    provider = batch_provider("openai", fake)
    with monkeypatch.context() as patch:
        patch.setattr(ledger, "add_batch_items", crash)
        with pytest.raises(Killed):
            open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    held = db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone()
    assert held == (2,)
    done = _drive(ledger, provider, _open_batch_id(db))
    assert done.items == {} and fake.batches.created["openai"] == []
    assert db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone() == (0,)
    reserved = db.execute("SELECT sum(reserved) FROM idempotent_jobs.budget_counters").fetchone()
    assert reserved == (0,)
