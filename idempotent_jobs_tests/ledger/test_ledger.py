"""The ledger's operations against a real PostgreSQL: registration, fenced leases, commit."""

import json
import math
import threading
from datetime import timedelta

import psycopg
import pytest

from idempotent_jobs import (
    CallOrigin,
    IdentityConflictError,
    InvalidInputError,
    LeaseLostError,
    LedgerConnectionError,
    ModelUsage,
    RunLedger,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.helpers import claimed, count, expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def db_now(db: psycopg.Connection):  # type: ignore[no-untyped-def]
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def test_register_is_idempotent(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    ident = identity()
    first = ledger.register(ident)
    second = ledger.register(ident)
    assert first.run_id == second.run_id == ident.run_id
    assert (first.status, first.lease_epoch, first.attempts) == ("pending", 0, 0)
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    assert count(db, "runs", ident.run_id) == 1


def test_register_never_moves_a_completed_run_back(ledger: HarnessLedger) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    ledger.complete(lease, {"summary": "kept"})
    again = ledger.register(ident)
    assert (again.status, again.output) == ("completed", {"summary": "kept"})


def test_same_identity_under_another_id_is_a_conflict(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity()
    db.execute(
        "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version)"
        " VALUES (%s, %s, %s, %s, %s)",
        ("f" * 64, ident.job_name, ident.subject_id, ident.scheduled_at, ident.version),
    )
    with pytest.raises(IdentityConflictError, match="another run id"):
        ledger.register(ident)


def test_same_id_with_other_fields_is_a_conflict(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity()
    db.execute(
        "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version)"
        " VALUES (%s, 'other-job', %s, %s, %s)",
        (ident.run_id, ident.subject_id, ident.scheduled_at, ident.version),
    )
    with pytest.raises(IdentityConflictError, match="different identity fields"):
        ledger.register(ident)


def test_a_held_lease_cannot_be_claimed(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    ledger.register(ident)
    lease = ledger.claim(
        ident.run_id, "w1", 30, origin=CallOrigin(caller_run_id="dr-1", caller_step="collect")
    )
    assert lease is not None and lease.epoch == 1
    assert lease.expires_at > db_now(db) + timedelta(seconds=25)
    assert ledger.claim(ident.run_id, "w2", 30) is None
    record = ledger.get(ident.run_id)
    assert record is not None
    assert (record.status, record.lease_owner, record.lease_epoch) == ("running", "w1", 1)
    [attempt] = operator.attempts(ident.run_id)
    assert (attempt.worker_id, attempt.caller_run_id, attempt.caller_step, attempt.outcome) == (
        "w1",
        "dr-1",
        "collect",
        None,
    )


def test_an_expired_lease_is_reclaimed_with_the_next_epoch(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    old = claimed(ledger, ident, "w1", 30)
    expire_lease(db, ident.run_id)
    new = ledger.claim(ident.run_id, "w2", 30)
    assert new is not None and new.epoch == old.epoch + 1
    first, second = operator.attempts(ident.run_id)
    assert (first.lease_epoch, first.outcome) == (1, "lease_lost")
    assert first.ended_at is not None
    assert (second.lease_epoch, second.worker_id, second.outcome) == (2, "w2", None)


def test_the_owner_reclaiming_supersedes_its_own_attempt(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    ledger.register(ident)
    first = ledger.claim(ident.run_id, "w1", 30)
    second = ledger.claim(ident.run_id, "w1", 30)
    assert first is not None and second is not None
    assert second.epoch == first.epoch + 1
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["superseded", None]
    with pytest.raises(LeaseLostError):
        ledger.save_raw_input(first, {"stale": True})


def test_lease_expiry_follows_the_database_clock(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    ident = identity()
    held = claimed(ledger, ident, "w1", 0.5)
    attempts = 0
    while (taken := ledger.claim(ident.run_id, "w2", 30)) is None:
        attempts += 1
        assert attempts < 10_000, "the lease never expired"
    # The second claim succeeded only once the database clock passed the first expiry.
    row = db.execute(
        "SELECT started_at FROM idempotent_jobs.attempts WHERE run_id = %s AND lease_epoch = 2",
        (ident.run_id,),
    ).fetchone()
    assert row is not None and row[0] >= held.expires_at
    assert taken.epoch == 2 and attempts > 0


def test_renew_extends_by_the_database_clock(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 5)
    renewed = ledger.renew(lease)
    assert renewed.expires_at is not None and lease.expires_at is not None
    assert renewed.expires_at >= lease.expires_at
    assert renewed.epoch == lease.epoch
    expire_lease(db, ident.run_id)
    # Still the owner (nobody took it over): renewing is allowed and safe thanks to the epoch.
    assert ledger.renew(lease).expires_at > db_now(db)


def test_raw_input_checkpoint_keeps_the_first_value(ledger: HarnessLedger) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    assert ledger.save_raw_input(lease, {"docs": ["first"]}) == {"docs": ["first"]}
    assert ledger.save_raw_input(lease, {"docs": ["second"]}) == {"docs": ["first"]}
    ledger.release(lease)
    again = ledger.claim(ident.run_id, "w2", 30)
    assert again is not None and again.stored_raw_input == {"docs": ["first"]}


def test_complete_commits_output_attempt_and_outbox_together(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    done = ledger.complete(
        lease,
        {"summary": "s"},
        {"email": {"to": "ops"}, "webhook": {"n": 1}},
        ModelUsage("local", 120, 30),
    )
    assert done.accepted and done.output == {"summary": "s"}
    record = ledger.get(ident.run_id)
    assert record is not None
    assert (record.status, record.lease_owner, record.lease_expires_at) == ("completed", None, None)
    assert record.completed_at is not None
    [attempt] = operator.attempts(ident.run_id)
    assert (attempt.outcome, attempt.model_name, attempt.input_tokens, attempt.output_tokens) == (
        "completed",
        "local",
        120,
        30,
    )
    assert [(r.channel, r.payload) for r in operator.outbox(ident.run_id)] == [
        ("email", {"to": "ops"}),
        ("webhook", {"n": 1}),
    ]
    assert ledger.claim(ident.run_id, "w2", 30) is None
    assert ledger.claim(ident.run_id, "w1", 30) is None


def test_complete_retried_after_it_landed_resolves_to_the_same_outcome(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    """The caller lost the answer of its commit and retries it with the same lease."""
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    first = ledger.complete(lease, {"summary": "one"}, {"email": {"n": 1}})
    retry = ledger.complete(lease, {"summary": "two"}, {"email": {"n": 2}})
    assert retry.accepted and retry.output == first.output == {"summary": "one"}
    assert count(db, "notification_outbox", ident.run_id) == 1
    assert operator.outbox(ident.run_id)[0].payload == {"n": 1}


def test_a_stale_worker_can_write_nothing(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    stale = claimed(ledger, ident, "paused-worker", 30)
    expire_lease(db, ident.run_id)
    fresh = ledger.claim(ident.run_id, "new-worker", 30)
    assert fresh is not None
    ledger.save_raw_input(fresh, {"docs": ["fresh"]})
    before = (
        ledger.get(ident.run_id),
        operator.attempts(ident.run_id),
        operator.outbox(ident.run_id),
    )

    for write in (
        lambda: ledger.save_raw_input(stale, {"docs": ["stale"]}),
        lambda: ledger.renew(stale),
        lambda: ledger.complete(stale, {"summary": "stale"}, {"email": {"stale": True}}),
        lambda: ledger.fail(stale, "stale failure"),
        lambda: ledger.release(stale),
    ):
        with pytest.raises(LeaseLostError):
            write()
    after = ledger.get(ident.run_id), operator.attempts(ident.run_id), operator.outbox(ident.run_id)
    assert after == before

    done = ledger.complete(fresh, {"summary": "fresh"}, {"email": {"fresh": True}})
    assert done.accepted
    # After the run is completed by the new owner, the stale commit gets the stored result back
    # (success, nothing new) and changes nothing.
    late = ledger.complete(stale, {"summary": "stale"}, {"email": {"stale": True}})
    assert (late.accepted, late.output) == (False, {"summary": "fresh"})
    assert [r.payload for r in operator.outbox(ident.run_id)] == [{"fresh": True}]


def test_a_failed_run_is_retried_without_duplicate_outbox_rows(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    first = claimed(ledger, ident, "w1", 30)
    ledger.save_raw_input(first, {"docs": ["d"]})
    ledger.fail(first, "TimeoutError: model timed out", ModelUsage("m", 10, 0))
    ledger.fail(first, "TimeoutError: model timed out")  # a retried fail that already landed
    record = ledger.get(ident.run_id)
    assert record is not None
    assert (record.status, record.last_error, record.lease_owner) == (
        "failed",
        "TimeoutError: model timed out",
        None,
    )
    second = ledger.claim(ident.run_id, "w2", 30)
    assert second is not None and second.stored_raw_input == {"docs": ["d"]}
    ledger.complete(second, {"summary": "ok"}, {"email": {"n": 1}})
    ledger.complete(second, {"summary": "ok"}, {"email": {"n": 1}})
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["failed", "completed"]
    assert operator.attempts(ident.run_id)[0].input_tokens == 10
    assert count(db, "notification_outbox", ident.run_id) == 1
    final = ledger.get(ident.run_id)
    assert final is not None and final.last_error is None and final.attempts == 2


def test_release_frees_the_run_for_another_worker(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 300)
    ledger.release(lease)
    ledger.release(lease)  # a retried release that already landed
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.lease_owner) == ("pending", None)
    other = ledger.claim(ident.run_id, "w2", 30)
    assert other is not None and other.epoch == 2
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["superseded", None]


@pytest.mark.parametrize(
    ("output", "field", "reason"),
    [
        (["not", "a", "dict"], "output", "JSON object"),
        ({"score": math.nan}, "output", "not storable"),
        ({"score": math.inf}, "output", "not storable"),
        ({"blob": b"\x00\x01"}, "output", "not JSON-serialisable"),
        ({"text": "nul\x00char"}, "output", "NUL"),
        ({"when": {1, 2}}, "output", "not JSON-serialisable"),
    ],
)
def test_unstorable_output_is_refused_and_nothing_changes(
    ledger: HarnessLedger, output: object, field: str, reason: str
) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    before = ledger.get(ident.run_id)
    with pytest.raises(InvalidInputError) as info:
        ledger.complete(lease, output)  # type: ignore[arg-type]
    assert info.value.field == field and reason in str(info.value)
    assert ledger.get(ident.run_id) == before
    assert ledger.complete(lease, {"summary": "fine"}).accepted


def test_deeply_nested_output_is_refused(ledger: HarnessLedger) -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    with pytest.raises(InvalidInputError, match="output: is nested more than 100 levels deep"):
        ledger.complete(lease, deep)


def test_bad_arguments_are_refused_naming_the_field(ledger: HarnessLedger) -> None:
    ident = identity()
    ledger.register(ident)
    for kwargs, field in (
        ({"worker_id": "", "lease_seconds": 30}, "worker_id"),
        ({"worker_id": "w\n1", "lease_seconds": 30}, "worker_id"),
        ({"worker_id": "w1", "lease_seconds": 0}, "lease_seconds"),
        ({"worker_id": "w1", "lease_seconds": -5}, "lease_seconds"),
        ({"worker_id": "w1", "lease_seconds": 10**9}, "lease_seconds"),
    ):
        with pytest.raises(InvalidInputError) as info:
            ledger.claim(ident.run_id, **kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
    lease = ledger.claim(ident.run_id, "w1", 30)
    assert lease is not None
    with pytest.raises(InvalidInputError) as info:
        ledger.save_raw_input(lease, {"x": float("nan")})
    assert info.value.field == "raw_input"
    with pytest.raises(InvalidInputError) as info:
        ledger.complete(lease, {"summary": "s"}, {"": {"x": 1}})
    assert info.value.field == "notifications"
    with pytest.raises(InvalidInputError) as info:
        ledger.complete(lease, {"summary": "s"}, {"email": ["not", "a", "dict"]})  # type: ignore[dict-item]
    assert info.value.field == "notifications['email']"
    record = ledger.get(ident.run_id)
    assert record is not None and record.raw_input is None and record.output is None


def test_a_connection_dropped_during_commit_resolves_to_one_outcome(
    ledger: HarnessLedger, db: psycopg.Connection, database: str
) -> None:
    """The backend running the commit is terminated; the ledger's retry gives one result."""
    ident = identity()
    lease = claimed(ledger, ident, "w1", 30)
    results: list[object] = []

    with psycopg.connect(database) as blocker:
        # Hold the run's row so the commit blocks where we can see it and cut its connection.
        blocker.execute(
            "SELECT 1 FROM idempotent_jobs.runs WHERE run_id = %s FOR UPDATE", (ident.run_id,)
        )
        worker = threading.Thread(
            target=lambda: results.append(
                ledger.complete(lease, {"summary": "s"}, {"email": {"n": 1}})
            )
        )
        worker.start()
        pid = None
        for _ in range(10_000):
            row = db.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%WITH cur AS (\nSELECT k.*, (lease_owner = %",),
            ).fetchone()
            if row:
                pid = row[0]
                break
            threading.Event().wait(0.01)
        assert pid is not None, "the commit never blocked on the row"
        terminated = db.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
        assert terminated == (True,)
        blocker.rollback()
    worker.join(timeout=30)
    assert len(results) == 1
    done = results[0]
    assert done.accepted and done.output == {"summary": "s"}  # type: ignore[attr-defined]
    assert count(db, "notification_outbox", ident.run_id) == 1
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"


def test_outbox_delivery_sends_each_row_once(ledger: HarnessLedger, operator: LedgerAdmin) -> None:
    runs = [identity(hour=h) for h in range(4)]
    for ident in runs:
        lease = claimed(ledger, ident, "w", 30)
        ledger.complete(lease, {"summary": ident.run_id}, {"email": {"n": 1}, "hook": {"n": 2}})
    sent: list[str] = []
    lock = threading.Lock()
    gate = threading.Barrier(2)

    def send(row: object) -> None:
        with lock:
            sent.append(row.idempotency_key)  # type: ignore[attr-defined]

    def deliver() -> None:
        gate.wait()
        ledger.deliver_outbox(send)

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == sorted(f"{i.run_id}:{c}" for i in runs for c in ("email", "hook"))
    assert operator.outbox(pending_only=True) == []
    assert ledger.deliver_outbox(send).delivered == []
    assert all(r.delivery_attempts == 1 and r.delivered_at for r in operator.outbox())


def test_a_failed_delivery_is_recorded_and_retried(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    ident = identity()
    lease = claimed(ledger, ident, "w", 30)
    ledger.complete(lease, {"summary": "s"}, {"hook": {"n": 1}})

    def refuse(row: object) -> None:
        raise ConnectionError("receiver answered 500")

    report = ledger.deliver_outbox(refuse)
    assert [reason for _, reason in report.failed] == ["ConnectionError: receiver answered 500"]
    [row] = operator.outbox(ident.run_id)
    assert (row.delivered_at, row.delivery_attempts, row.last_error) == (
        None,
        1,
        "ConnectionError: receiver answered 500",
    )
    keys: list[str] = []
    assert len(ledger.deliver_outbox(lambda r: keys.append(r.idempotency_key)).delivered) == 1
    assert keys == [f"{ident.run_id}:hook"]
    [row] = operator.outbox(ident.run_id)
    assert row.delivered_at is not None and row.delivery_attempts == 2 and row.last_error is None


def test_secrets_stay_out_of_errors_and_repr() -> None:
    url = "postgresql://ledger:s3cr3t-pw@127.0.0.1:9/ledger"
    ledger = HarnessLedger(url, connect_timeout_seconds=1)
    assert "s3cr3t" not in repr(ledger)
    with pytest.raises(LedgerConnectionError) as info:
        ledger.open()
    assert "s3cr3t" not in str(info.value)
    assert "s3cr3t" not in json.dumps(str(info.value.__cause__))


def test_begin_registers_and_claims_in_one_statement(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    record, lease = ledger.begin(
        ident, "w1", 30, origin=CallOrigin(caller_run_id="dr", caller_step="collect")
    )
    assert lease is not None and (lease.epoch, lease.worker_id) == (1, "w1")
    assert (record.status, record.lease_owner, record.lease_epoch, record.attempts) == (
        "running",
        "w1",
        1,
        1,
    )
    [attempt] = operator.attempts(ident.run_id)
    assert (attempt.lease_epoch, attempt.caller_run_id, attempt.caller_step) == (1, "dr", "collect")

    held, none = ledger.begin(ident, "w2", 30)
    assert none is None and (held.status, held.lease_owner, held.lease_epoch) == (
        "running",
        "w1",
        1,
    )
    assert len(operator.attempts(ident.run_id)) == 1

    ledger.save_raw_input(lease, {"collected": True})
    expire_lease(db, ident.run_id)
    taken, lease2 = ledger.begin(ident, "w2", 30)
    assert lease2 is not None and lease2.epoch == 2 and taken.attempts == 2
    assert lease2.stored_raw_input == taken.raw_input == {"collected": True}  # claimed: read
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["lease_lost", None]
    with pytest.raises(LeaseLostError):
        ledger.save_raw_input(lease, {"stale": True})

    ledger.complete(lease2, {"summary": "s"})
    done, none = ledger.begin(ident, "w3", 30)
    assert none is None and (done.status, done.output, done.lease_epoch) == (
        "completed",
        {"summary": "s"},
        2,
    )
    # A completed run comes back without its checkpoint (it may be large; nothing reads it),
    # which stays stored.
    assert done.raw_input is None and done.input_fingerprint == taken.input_fingerprint
    assert operator.get(ident.run_id).raw_input == {"collected": True}  # type: ignore[union-attr]


def test_begin_refuses_a_mismatched_identity(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    ident = identity()
    db.execute(
        "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version)"
        " VALUES (%s, 'other-job', %s, %s, %s)",
        (ident.run_id, ident.subject_id, ident.scheduled_at, ident.version),
    )
    with pytest.raises(IdentityConflictError):
        ledger.begin(ident, "w1", 30)
    row = db.execute(
        "SELECT status, lease_owner, lease_epoch FROM idempotent_jobs.runs WHERE run_id = %s",
        (ident.run_id,),
    ).fetchone()
    assert row == ("pending", None, 0), "a mismatched row is never claimed"


def _xmax(db: psycopg.Connection, run_id: str) -> str:
    row = db.execute(
        "SELECT xmax::text FROM idempotent_jobs.runs WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_a_claim_writes_one_row_and_the_attempt_when_it_ends(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    ledger.register(ident)
    lease = ledger.claim(
        ident.run_id, "w1", 30, origin=CallOrigin(caller_run_id="d-1", caller_step="collect")
    )
    assert lease is not None
    # While the claim is open its details live on the run; no attempt row is written yet.
    assert count(db, "run_attempts", ident.run_id) == 0
    [open_attempt] = operator.attempts(ident.run_id)
    assert (open_attempt.caller_run_id, open_attempt.caller_step, open_attempt.outcome) == (
        "d-1",
        "collect",
        None,
    )
    ledger.complete(lease, {"summary": "s"}, usage=ModelUsage("m", 3, 4))
    [ended] = operator.attempts(ident.run_id)
    assert (ended.caller_run_id, ended.caller_step, ended.outcome) == (
        "d-1",
        "collect",
        "completed",
    )
    assert ended.started_at == open_attempt.started_at and ended.ended_at is not None
    assert (ended.model_name, ended.input_tokens, ended.output_tokens) == ("m", 3, 4)
    assert count(db, "run_attempts", ident.run_id) == 1


def test_the_claim_that_supersedes_a_vanished_holder_records_its_attempt(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ident = identity()
    ledger.register(ident)
    gone = ledger.claim(
        ident.run_id, "gone", 30, origin=CallOrigin(caller_run_id="d-1", caller_step="transform")
    )
    assert gone is not None
    expire_lease(db, ident.run_id)
    assert ledger.claim(ident.run_id, "w2", 30, origin=CallOrigin(caller_run_id="d-2")) is not None
    lost, current = operator.attempts(ident.run_id)
    assert (lost.worker_id, lost.caller_run_id, lost.caller_step, lost.outcome) == (
        "gone",
        "d-1",
        "transform",
        "lease_lost",
    )
    assert lost.ended_at is not None and lost.ended_at >= lost.started_at
    assert (current.worker_id, current.caller_run_id, current.outcome) == ("w2", "d-2", None)


def test_polling_a_held_run_writes_nothing(ledger: HarnessLedger, db: psycopg.Connection) -> None:
    ident = identity()
    claimed(ledger, ident, "holder", 30)
    before = _xmax(db, ident.run_id)
    for _ in range(3):
        assert ledger.claim(ident.run_id, "poller", 30) is None
    # A claim that cannot succeed does not even lock the row (xmax would name the locker).
    assert _xmax(db, ident.run_id) == before


@pytest.mark.parametrize("durable", [False, True])
def test_lease_commit_mode_stays_inside_its_statement(database: str, durable: bool) -> None:
    """Lease writes may commit without waiting for the flush; the setting never leaks into the
    pooled connection's session, where the final commit must wait."""
    with HarnessLedger(
        database, pool_min_size=1, pool_max_size=1, durable_lease_commits=durable
    ) as ledger:
        pool = ledger._db._pool_or_open()
        with pool.connection() as conn:
            default = conn.execute("SHOW synchronous_commit").fetchone()
        ident = identity()
        record, lease = ledger.begin(ident, "w", 30)
        assert lease is not None
        ledger.save_raw_input(lease, {"documents": ["d"]})
        lease = ledger.renew(lease)
        with pool.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == default
        assert ledger.complete(lease, {"summary": "s"}).accepted
        stored = ledger.get(ident.run_id)
        assert stored is not None and stored.raw_input == {"documents": ["d"]}


def test_the_ledger_has_two_faces_the_worker_and_the_operator(ledger: HarnessLedger) -> None:
    """Listings, health checks, storage, revisions, drills, prices and retention are the
    operator face's (LedgerAdmin); RunLedger keeps what a worker does, and its executor is
    private."""
    from idempotent_jobs.core.admin import LedgerAdmin

    operator_reads = (
        "list_runs",
        "resolve_run_id",
        "expired_leases",
        "stale_outbox",
        "failed_past_retries",
        "storage",
        "job_names",
        "drifted",
        "drills",
    )
    operator_work = ("revise", "arm_drill", "migrate", "set_price", "prune_batch", "attempts")
    for name in operator_reads + operator_work:
        assert not hasattr(RunLedger, name) and callable(getattr(LedgerAdmin, name)), name
    for name in ("register", "save_raw_input", "executor", "outbox"):
        assert not hasattr(RunLedger, name), name
    worker = RunLedger(ledger.settings)  # not opened: asking for a method opens nothing
    with pytest.raises(AttributeError, match=r"RunLedger.revise is the operator's now.*Admin"):
        worker.revise  # noqa: B018
    with pytest.raises(AttributeError, match=r"RunLedger.register was removed in 0.2: begin"):
        worker.register  # noqa: B018
    with LedgerAdmin.beside(ledger) as admin:
        assert admin.list_runs() == [] and admin.job_names() == [] and admin.drills() == []
