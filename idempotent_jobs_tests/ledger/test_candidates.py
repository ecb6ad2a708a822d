"""A candidate answer is accepted only on the revision and checkpoint it was computed against.

The scenario the issue reproduced: worker 1 stalls in its model call past its lease, worker 2
completes the run, an operator revises it, worker 1 resumes and (as ``persist``'s fallback does)
claims the reopened run and commits its pre-revision answer.
"""

import psycopg
import pytest

from idempotent_jobs import (
    Basis,
    JobConfig,
    Lease,
    LeaseLostError,
    StaleCandidateError,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.json_values import json_fingerprint
from idempotent_jobs_tests.helpers import Collector, claimed, count, email, expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def stalled_then_overtaken(ledger: HarnessLedger, db: psycopg.Connection) -> Lease:
    """Worker 1 read the checkpoint and stalled; worker 2 completed the run. Returns worker 1's
    lease, whose basis is what its answer was computed on."""
    ident = identity()
    first = ledger.checkpoint(claimed(ledger, ident, "w1", 30), {"documents": ["before"]})
    expire_lease(db, ident.run_id)
    second = claimed(ledger, ident, "w2", 30)
    ledger.complete(second, {"summary": "accepted at revision 0"}, email({"summary": "r0"}))
    return first


@pytest.mark.parametrize("recollect", [True, False])
def test_a_stale_answer_never_becomes_a_revisions_result(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection, recollect: bool
) -> None:
    ident = identity()
    stale_basis = stalled_then_overtaken(ledger, db).basis
    assert stale_basis == Basis(
        revision=0, input_fingerprint=json_fingerprint({"documents": ["before"]})
    )
    operator.revise(ident.run_id, "prompt fixed", channels=["email"], recollect=recollect)

    # Worker 1 resumes: its handed lease is lost, so it claims the reopened run again...
    fallback = claimed(ledger, ident, "w1", 30)
    assert fallback.revision == 1
    with pytest.raises(StaleCandidateError, match="computed on revision 0"):
        ledger.complete(
            fallback, {"summary": "stale"}, email({"summary": "stale"}), basis=stale_basis
        )

    record = ledger.get(ident.run_id)
    assert record is not None
    assert (record.status, record.output, record.lease_owner) == ("pending", None, None)
    assert record.raw_input == (None if recollect else {"documents": ["before"]})
    assert [(o.revision, o.channel) for o in operator.outbox(ident.run_id)] == [(0, "email")]
    last = operator.attempts(ident.run_id)[-1]
    assert (last.lease_epoch, last.worker_id, last.outcome) == (3, "w1", "superseded")
    assert last.error is not None and last.error.startswith("stale candidate")

    # The revision is computed by whoever runs it next, on its own checkpoint, and sent once.
    collector = Collector()
    outcome = run_idempotent(
        ledger,
        ident,
        collect=collector,
        transform=lambda raw: {"summary": f"on {raw['documents'][0]}"},
        notifications=email,
    )
    assert outcome.executed and collector.calls == (1 if recollect else 0)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed" and record.revision == 1
    assert record.raw_input is not None
    assert record.raw_input["documents"] == ["doc seen on collect #1" if recollect else "before"]
    assert record.output == {"summary": f"on {record.raw_input['documents'][0]}"}
    assert record.input_fingerprint == json_fingerprint(record.raw_input)
    keys = sorted(o.idempotency_key for o in operator.outbox(ident.run_id))
    assert keys == [f"{ident.run_id}:email", f"{ident.run_id}:email:r1"]


def test_the_fallback_keeps_its_saving_when_nothing_moved(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """A lost lease with no revise in between: the answer already paid for is committed."""
    ident = identity()
    first = ledger.checkpoint(claimed(ledger, ident, "w1", 30), {"documents": ["d"]})
    expire_lease(db, ident.run_id)
    again = claimed(ledger, ident, "w1-fallback", 30)
    completion = ledger.complete(again, {"summary": "paid once"}, basis=first.basis)
    assert completion.accepted and completion.output == {"summary": "paid once"}


def test_a_lost_answer_of_a_refused_commit_is_still_refused(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    """The retry of a COMPLETE whose answer was lost finds the refusal, not a lost lease."""
    ident = identity()
    stale_basis = stalled_then_overtaken(ledger, db).basis
    operator.revise(ident.run_id, "again", recollect=True)
    fallback = claimed(ledger, ident, "w1", 30)
    with pytest.raises(StaleCandidateError):
        ledger.complete(fallback, {"summary": "stale"}, basis=stale_basis)
    with pytest.raises(StaleCandidateError):  # what a retried statement then sees
        ledger.complete(fallback, {"summary": "stale"}, basis=stale_basis)
    assert count(db, "notification_outbox", ident.run_id) == 1


def test_the_stalled_workers_own_lease_writes_nothing_after_a_revise(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    stalled = stalled_then_overtaken(ledger, db)
    operator.revise(ident.run_id, "again", channels=["email"])
    with pytest.raises(LeaseLostError):
        ledger.complete(stalled, {"summary": "stale"}, email({"summary": "stale"}))
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.output) == ("pending", None)
    assert count(db, "notification_outbox", ident.run_id) == 1


def test_the_checkpoint_fingerprint_is_stored_and_shown(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity()
    lease = ledger.checkpoint(claimed(ledger, ident), {"b": 1, "a": [1, "é"]})
    expected = json_fingerprint({"a": [1, "é"], "b": 1})
    assert lease.input_fingerprint == expected
    # The first checkpoint wins, and so does its fingerprint.
    assert ledger.checkpoint(lease, {"other": True}).input_fingerprint == expected
    record = ledger.get(ident.run_id)
    assert record is not None and record.input_fingerprint == expected


def test_each_accepted_result_records_its_configuration(ledger: HarnessLedger) -> None:
    ident = identity()
    config = JobConfig.of(prompt="Summarise.", model="m-1", validator="mod.check")
    outcome = run_idempotent(
        ledger,
        ident,
        collect=Collector(),
        transform=lambda raw: {"summary": "s"},
        config=config,
    )
    assert outcome.executed and outcome.config_changed == ()
    record = ledger.get(ident.run_id)
    assert record is not None
    assert record.config_fingerprint == config.fingerprint
    assert record.config_parts == dict(config.parts)

    changed = JobConfig.of(prompt="Summarise briefly.", model="m-1", validator="mod.check")
    again = run_idempotent(
        ledger, ident, collect=Collector(), transform=lambda raw: {"x": 1}, config=changed
    )
    assert not again.executed and again.config_changed == ("prompt",)
    assert again.output == {"summary": "s"}, "drift is reported, the result is still reused"
