"""``batches list|show|cancel``: a batch's runs, provider id, state and money, as an operator
reads them; a cancel kept in the ledger and carried out by the lane at its next step."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent_jobs import LedgerAdmin
from idempotent_jobs.batches import advance, open_intent
from idempotent_jobs_tests.helpers import batch_provider
from idempotent_jobs_tests.ledger.test_lane import _answer, _ids, _steps
from idempotent_jobs_tests.ledger.test_operator_cli import cli_env, run  # noqa: F401
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import FakeProviders


@pytest.fixture
def fake() -> Iterator[FakeProviders]:
    with FakeProviders(default=_answer) as server:
        yield server


def test_an_operator_lists_shows_and_cancels_batches(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    fake: FakeProviders,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_price("gpt-4o-mini", "0.15", "0.60", tier="batch")
    provider = batch_provider("openai", fake)
    done = open_intent(ledger, _steps(), provider, _ids("a", "b", "err"), worker_id="w1")
    assert done is not None
    while not advance(ledger, _steps(), provider, done.batch_id, worker_id="w1").collected:
        pass
    fake.batches.polls_to_complete = 5
    open_ = open_intent(ledger, _steps(), provider, _ids("c", "d"), worker_id="w1")
    assert open_ is not None
    advance(ledger, _steps(), provider, open_.batch_id, worker_id="w1")  # submitted

    code, out = run(capsys, "batches", "list")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].startswith(open_.batch_id) and "submitted" in lines[1]
    assert done.batch_id in lines[2] and "collected" in lines[2]
    assert "2 accepted, 1 failed" in lines[2]
    # 2 calls of 50 input and 5 output tokens at the batch tier's price per million.
    assert "0.000021 USD" in lines[2]

    code, out = run(capsys, "batches", "show", done.batch_id[:8], "--json")  # a prefix
    shown = json.loads(out)
    assert shown["batch_id"] == done.batch_id
    code, out = run(capsys, "batches", "show", "xyz!")
    assert code == 2 and "batch_id" in out and "not a batch id" in out
    ids = (done.batch_id, open_.batch_id)
    unknown = next(p for p in ("0000", "ffff", "abcd") if not any(i.startswith(p) for i in ids))
    code, out = run(capsys, "batches", "show", unknown)
    assert code == 2 and f"no batch '{unknown}'" in out

    assert shown["provider_batch_id"] == fake.batches.created["openai"][0]
    assert sorted((r["subject_id"], r["state"]) for r in shown["runs"]) == [
        ("a", "accepted"),
        ("b", "accepted"),
        ("err", "failed"),
    ]

    # doctor sees the open batch and the runs it holds; one nothing advances is a problem.
    code, out = run(capsys, "doctor", "--json")
    assert f"batch {open_.batch_id} of batch-job" in out and "holding 2 run(s)" in out, out
    assert "nothing has advanced it" not in out
    with ledger.connection() as conn:
        conn.execute(
            "UPDATE idempotent_jobs.batches SET lease_expires_at = now() - interval '1 hour',"
            " lease_owner = 'gone' WHERE batch_id = %s",
            (open_.batch_id,),
        )
        conn.execute(
            "UPDATE idempotent_jobs.runs SET lease_expires_at = now() - interval '1 hour'"
            " WHERE lease_owner = %s",
            (f"batch:{open_.batch_id}",),
        )
    code, out = run(capsys, "doctor", "--json")
    assert code == 1 and "nothing has advanced it" in out, out
    assert f"held by batch {open_.batch_id} (the batch lane)" in out

    code, out = run(capsys, "batches", "cancel", open_.batch_id, "--requested-by", "ops")
    assert code == 0 and "cancel requested" in out, out
    code, out = run(capsys, "batches", "list", "--state", "submitted")
    assert "submitted (cancel requested)" in out, out
    progress = advance(ledger, _steps(), provider, open_.batch_id, worker_id="w1")
    assert progress.state == "submitted"  # cancelling at the provider
    assert fake.batches.calls.count(("openai", "cancel")) == 1
    while not progress.collected:
        progress = advance(ledger, _steps(), provider, open_.batch_id, worker_id="w1")
    assert progress.items == {"released": 2}
    assert fake.batches.calls.count(("openai", "cancel")) == 1  # asked once
    code, out = run(capsys, "batches", "cancel", open_.batch_id)
    assert code != 0 and "batch_id" in out and "no open batch" in out
