"""Every way a batch ends leaves nothing behind: a cancel the provider refuses, a range with
nothing to compute, a launch killed while it held budgets then cancelled, a launch whose claims
outlast the batch's lease, a batch that keeps failing its steps, requests over the provider's
byte limit."""

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from idempotent_jobs import Budget, JobConfig, LedgerAdmin, RunIdentity, run_idempotent
from idempotent_jobs.batches import BatchSteps, advance, open_intent
from idempotent_jobs.core.errors import LeaseLostError
from idempotent_jobs.core.health import batch_findings
from idempotent_jobs.models import OutputSchema, Prompt
from idempotent_jobs.models.batches import AnthropicBatches, BatchProvider, OpenAIBatches
from idempotent_jobs_tests.helpers import batch_provider
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders

JOB = "ending-batch"
SCHEMA = OutputSchema.of(
    {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]},
    name="Label",
)


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer('{"label": "ok"}', 50, 5)) as server:
        yield server


def _steps(collect: Any = None) -> BatchSteps:
    return BatchSteps(
        job_name=JOB,
        collect=collect or (lambda identity: {"subject": identity.subject_id}),
        prompt=lambda raw, identity: Prompt.of(system="Label.", user=f"subject {raw['subject']}"),
        schema=SCHEMA,
        notifications=lambda identity, output: {"webhook": dict(output)},
        config=JobConfig.of(prompt="Label.", model="m", validator=""),
    )


def _ids(*subjects: str) -> list[RunIdentity]:
    return [RunIdentity(JOB, s, datetime(2026, 11, 1, tzinfo=UTC), "v1") for s in subjects]


def _held(db: psycopg.Connection) -> tuple[Any, ...]:
    """Runs still leased, budget holds left, and budget reserved."""
    row = db.execute(
        "SELECT (SELECT count(*) FROM idempotent_jobs.runs WHERE lease_owner IS NOT NULL),"
        " (SELECT count(*) FROM idempotent_jobs.budget_holds),"
        " (SELECT COALESCE(sum(reserved), 0) FROM idempotent_jobs.budget_counters)"
    ).fetchone()
    assert row is not None
    return tuple(row)


def _until_collected(
    ledger: HarnessLedger, provider: BatchProvider, batch_id: str, worker_id: str = "w1"
) -> Any:
    for _ in range(8):
        progress = advance(ledger, _steps(), provider, batch_id, worker_id=worker_id)
        if progress.collected:
            return progress
    raise AssertionError(f"batch {batch_id} not collected")


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_cancel_the_provider_refuses_for_an_ended_batch_collects_what_it_answered(
    api: str, fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider(api, fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None
    advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")  # submitted
    with LedgerAdmin.beside(ledger) as admin:
        admin.cancel_batch(batch.batch_id, requested_by="ops")
    fake.batches.fail_next["cancel"] = [400]  # "the batch has already ended"
    done = _until_collected(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 2}
    assert _held(db) == (0, 0, 0)


def test_a_cancel_the_provider_refuses_while_it_runs_ends_it_here_and_gives_its_runs_back(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    fake.batches.polls_to_complete = 50  # it runs on at the provider
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1")
    assert batch is not None
    advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    with LedgerAdmin.beside(ledger) as admin:
        admin.cancel_batch(batch.batch_id)
    fake.batches.fail_next["cancel"] = [409]  # refused, and not because it ended
    fake.batches.fail_next["cancel"] = [400]
    done = advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    assert done.collected and done.items == {"released": 2}
    assert _held(db) == (0, 0, 0)
    errors = db.execute("SELECT DISTINCT last_error FROM idempotent_jobs.runs").fetchall()
    assert len(errors) == 1 and "refused to cancel" in errors[0][0]
    again = run_idempotent(  # free to go online at once
        ledger, _ids("a")[0], collect=lambda i: {"subject": "a"}, transform=lambda r: {"x": 1}
    )
    assert again.executed


def test_a_range_with_nothing_to_compute_records_no_batch(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    for identity in _ids("a", "b"):
        run_idempotent(
            ledger, identity, collect=lambda i: {"subject": "x"}, transform=lambda r: {"x": 1}
        )
    provider = batch_provider("openai", fake)
    assert open_intent(ledger, _steps(), provider, _ids("a", "b"), worker_id="w1") is None
    assert db.execute("SELECT count(*) FROM idempotent_jobs.batches").fetchone() == (0,)
    assert fake.batches.calls == []


def test_a_launch_killed_while_it_held_budgets_then_cancelled_gives_everything_back(
    fake: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=10**9), job_name=JOB)

    class Killed(BaseException):
        pass

    def crash(*args: Any) -> list[str]:
        raise Killed()

    provider = batch_provider("anthropic", fake)
    with monkeypatch.context() as patch:
        patch.setattr(ledger, "add_batch_items", crash)
        with pytest.raises(Killed):
            open_intent(ledger, _steps(), provider, _ids("a", "b", "c"), worker_id="w1")
    assert _held(db)[:2] == (3, 3)
    [(batch_id,)] = db.execute("SELECT batch_id FROM idempotent_jobs.batches").fetchall()
    with LedgerAdmin.beside(ledger) as admin:
        admin.cancel_batch(batch_id, requested_by="ops")
    db.execute(  # the dead launch's lease lapses (the database's clock)
        "UPDATE idempotent_jobs.batches SET lease_expires_at = now() - interval '1 s'"
    )
    done = advance(ledger, _steps(), provider, batch_id, worker_id="sensor")
    assert done.collected and done.state == "collected"
    assert _held(db) == (0, 0, 0)
    statuses = db.execute("SELECT DISTINCT status FROM idempotent_jobs.runs").fetchall()
    assert statuses == [("pending",)]
    assert fake.batches.created["anthropic"] == []


def test_a_launch_whose_claims_outlast_the_batch_lease_keeps_it_and_computes_every_run(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """A slow collector (0.4 s a run, 2.4 s in all) under a 1.2 s lease: the launch renews the
    batch's lease (and its claims') as it goes, so the sensor cannot take the intent over."""
    provider = batch_provider("openai", fake)
    taken_over: list[str] = []

    def slow(identity: RunIdentity) -> dict[str, Any]:
        time.sleep(0.4)  # the collector's own slowness, not a synchronisation
        [(batch_id,)] = db.execute(
            "SELECT batch_id FROM idempotent_jobs.batches WHERE state = 'intent'"
        ).fetchall()
        try:
            advance(ledger, _steps(), provider, batch_id, worker_id="sensor")
            taken_over.append(identity.subject_id)
        except LeaseLostError:
            pass
        return {"subject": identity.subject_id}

    subjects = ("a", "b", "c", "d", "e", "f")
    batch = open_intent(
        ledger, _steps(slow), provider, _ids(*subjects), worker_id="launch", lease_seconds=1.2
    )
    assert batch is not None and taken_over == []
    done = _until_collected(ledger, provider, batch.batch_id, "launch")
    assert done.items == {"accepted": 6}
    assert _held(db) == (0, 0, 0)


def test_a_launch_that_loses_its_batch_gives_its_claims_back_and_says_so(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)

    def taken(identity: RunIdentity) -> dict[str, Any]:
        if identity.subject_id == "b":  # another worker takes the batch over meanwhile
            db.execute("UPDATE idempotent_jobs.batches SET lease_owner = 'other', lease_epoch = 9")
        return {"subject": identity.subject_id}

    with pytest.raises(LeaseLostError, match="given back"):
        open_intent(ledger, _steps(taken), provider, _ids("a", "b", "c"), worker_id="launch")
    assert _held(db)[0] == 0  # its claims were given back, not left to their leases


def test_a_batch_whose_steps_keep_failing_is_a_doctor_problem(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a"), worker_id="w1")
    assert batch is not None
    advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    fake.batches.fail_next["retrieve"] = [500, 500, 500]
    for _ in range(3):
        with pytest.raises(Exception, match="500"):
            advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    with LedgerAdmin.beside(ledger) as admin:
        findings = batch_findings(admin.batches(), admin.database_now())
    [failing] = [f for f in findings if f.kind == "batch_failing"]
    assert failing.severity == "problem" and "last 3 steps failed" in failing.detail
    done = _until_collected(ledger, provider, batch.batch_id)  # a step that ends well
    assert done.failed_steps == 0 and done.items == {"accepted": 1}


def test_a_range_over_the_providers_byte_limit_is_split(
    fake: FakeProviders, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    provider = batch_provider("openai", fake)
    line = provider.batch_line("x" * 64, Prompt.of(system="Label.", user="subject a"), SCHEMA)
    size = len(json.dumps(line).encode()) + 1
    assert isinstance(provider, OpenAIBatches)
    provider.max_batch_bytes = 2 * size + 1024 + 10  # two requests, and the room kept
    left = iter(_ids("a", "b", "c", "d", "e"))
    sizes = []
    while (batch := open_intent(ledger, _steps(), provider, left, worker_id="w1")) is not None:
        sizes.append(len(ledger.batch_items(batch.batch_id)))
    assert sizes == [2, 2, 1]


def _foreign_batch(fake: FakeProviders, requests: int) -> str:
    """Another team's Message Batch in the same workspace, of the same size."""
    theirs = AnthropicBatches(model="claude-x", api_key="k", base_url=fake.anthropic_url)
    lines = [
        {"custom_id": f"theirs-{n}", "params": {"model": "claude-x", "max_tokens": 10}}
        for n in range(requests)
    ]
    return theirs.create_batch(lines, "not-ours").provider_batch_id


@pytest.mark.parametrize("theirs_made", ["after ours", "before ours"])
def test_another_teams_batch_of_the_same_size_is_never_cancelled_nor_adopted(
    theirs_made: str,
    fake: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anthropic's batches carry no metadata: after our create's answer is lost, a batch of
    the same size made by someone else is told apart by its results' custom_ids once it ends."""
    provider = batch_provider("anthropic", fake)
    batch = open_intent(ledger, _steps(), provider, _ids("a", "b", "c"), worker_id="w1")
    assert batch is not None
    foreign: list[str] = []
    if theirs_made == "before ours":  # between our start mark and our create
        real_start = ledger.start_submit

        def start_then_theirs(*args: Any) -> Any:
            started = real_start(*args)
            if not foreign:
                foreign.append(_foreign_batch(fake, 3))
                fake.batches.lose_next_creates = 1  # ours, next
            return started

        monkeypatch.setattr(ledger, "start_submit", start_then_theirs)
    else:
        fake.batches.lose_next_creates = 1
    with pytest.raises(Exception, match="500"):  # made, but its answer lost
        advance(ledger, _steps(), provider, batch.batch_id, worker_id="w1")
    if theirs_made == "after ours":
        foreign.append(_foreign_batch(fake, 3))
    done = _until_collected(ledger, provider, batch.batch_id)
    assert done.items == {"accepted": 3}
    [ours] = [b for b in fake.batches.created["anthropic"] if b not in foreign]
    assert done.provider_batch_id == ours
    assert ("anthropic", "cancel") not in fake.batches.calls  # theirs was never cancelled
    assert fake.batches.batches[foreign[0]].outcome == "completed"
    recorded = db.execute(
        "SELECT provider_batch_id FROM idempotent_jobs.batch_submissions"
    ).fetchall()
    assert recorded == [(ours,)]
    assert _held(db) == (0, 0, 0)
