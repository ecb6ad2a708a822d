import multiprocessing

import psycopg
import pytest

from idempotent_jobs import InvalidInputError, LedgerError, SchemaNotMigratedError
from idempotent_jobs.core.schema import shipped_migrations
from idempotent_jobs_tests.ledgers import BothFaces

EXPECTED_COLUMNS = {
    "runs": (
        "run_id job_name subject_id scheduled_at version status raw_input output lease_owner "
        "lease_expires_at lease_epoch attempts last_error created_at updated_at completed_at "
        "revision lease_started_at lease_caller_run_id lease_caller_step input_fingerprint "
        "config_fingerprint config_parts raw_input_pruned_at output_pruned_at "
        "attempts_pruned_at"
    ).split(),
    # A view: the ended attempts plus the open one, whose details live on the run.
    "attempts": (
        "run_id lease_epoch worker_id caller_run_id caller_step started_at ended_at outcome error "
        "model_name input_tokens output_tokens"
    ).split(),
    "run_attempts": (
        "run_id lease_epoch worker_id caller_run_id caller_step started_at ended_at outcome error "
        "model_name input_tokens output_tokens"
    ).split(),
    "notification_outbox": (
        "run_id channel payload created_at delivered_at delivery_attempts last_error revision "
        "payload_pruned_at"
    ).split(),
    "run_revisions": (
        "run_id revision reason channels previous_output previous_completed_at previous_epoch "
        "recollect requested_by requested_at"
    ).split(),
}


def columns(conninfo: str, schema: str) -> dict[str, list[str]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = %s ORDER BY table_name, ordinal_position",
            (schema,),
        ).fetchall()
    found: dict[str, list[str]] = {}
    for table, column in rows:
        found.setdefault(table, []).append(column)
    return found


def constraints(conninfo: str, schema: str) -> set[str]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s",
            (schema,),
        ).fetchall()
    return {name for (name,) in rows}


def test_migrations_create_the_designed_tables(fresh_database: str) -> None:
    applied = BothFaces(fresh_database).migrate()
    assert applied == [f"{m.version:04d}_{m.name}" for m in shipped_migrations()]
    found = columns(fresh_database, "idempotent_jobs")
    assert {t: found[t] for t in EXPECTED_COLUMNS} == EXPECTED_COLUMNS
    assert {"runs_identity_key", "runs_status_check", "run_attempts_outcome_check"} <= constraints(
        fresh_database, "idempotent_jobs"
    )


def test_migrating_twice_is_a_no_op(fresh_database: str) -> None:
    ledger = BothFaces(fresh_database)
    assert ledger.migrate() != []
    before = columns(fresh_database, "idempotent_jobs")
    assert ledger.migrate() == []
    assert columns(fresh_database, "idempotent_jobs") == before


def _migrate_in_child(
    conninfo: str,
    barrier: "multiprocessing.synchronize.Barrier",
    out: "multiprocessing.Queue[object]",
) -> None:
    barrier.wait()
    try:
        out.put(BothFaces(conninfo).migrate())
    except Exception as exc:  # reported to the parent, which fails the test
        out.put(repr(exc))


def test_concurrent_migrations_apply_once(fresh_database: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    barrier = ctx.Barrier(workers)
    out: multiprocessing.Queue[object] = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_in_child, args=(fresh_database, barrier, out))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert all(isinstance(r, list) for r in results), results
    assert sorted(len(r) for r in results) == [0] * (workers - 1) + [len(shipped_migrations())]  # type: ignore[arg-type]
    with psycopg.connect(fresh_database) as conn:
        row = conn.execute("SELECT count(*) FROM idempotent_jobs.schema_migrations").fetchone()
    assert row == (len(shipped_migrations()),)


def test_an_unmigrated_database_is_refused_at_open(fresh_database: str) -> None:
    ledger = BothFaces(fresh_database)
    with pytest.raises(SchemaNotMigratedError, match="idempotent-jobs migrate"):
        ledger.open()
    ledger.migrate()
    with ledger:
        assert ledger.get("0" * 64) is None


def test_a_missing_migration_is_refused_at_open(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DELETE FROM idempotent_jobs.schema_migrations")
    with pytest.raises(SchemaNotMigratedError, match="lacks migrations 0001_initial"):
        BothFaces(database).open()


def test_an_edited_migration_is_detected(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE idempotent_jobs.schema_migrations SET checksum = 'edited'")
    with pytest.raises(LedgerError, match="changed after it was applied"):
        BothFaces(database).migrate()


def test_a_newer_schema_than_the_code_is_refused(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum)"
            " VALUES (9999, 'future', 'x')"
        )
    with pytest.raises(SchemaNotMigratedError, match="newer than the code"):
        BothFaces(database).open()


def test_a_custom_schema_is_independent(database: str) -> None:
    other = BothFaces(database, schema="tenant_b_ledger")
    assert other.migrate() == [f"{m.version:04d}_{m.name}" for m in shipped_migrations()]
    found = columns(database, "tenant_b_ledger")
    assert {t: found[t] for t in EXPECTED_COLUMNS} == EXPECTED_COLUMNS


@pytest.mark.parametrize("name", ["Ledger", "a-b", "x; DROP TABLE y", "", "9abc"])
def test_bad_schema_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        BothFaces("postgresql://unused", schema=name).migrate()
    assert info.value.field == "schema_name"


def test_the_lean_claims_migration_moves_open_attempts_onto_their_runs(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0003 keeps history: an open attempt written by the older code (in 0002's column names)
    is still listed, and the next claim closes it as before."""
    import idempotent_jobs.core.schema as schema

    shipped = shipped_migrations()
    monkeypatch.setattr(schema, "shipped_migrations", lambda: shipped[:2])
    BothFaces(fresh_database).migrate()
    run_id, abandoned = "a" * 64, "b" * 64
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        for rid, status in ((run_id, "running"), (abandoned, "failed")):
            conn.execute(
                "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at,"
                " version, status, lock_owner, lock_expires_at, lease_epoch, attempts)"
                " VALUES (%s, 'j', %s, now(), 'v', %s, %s, %s, 1, 1)",
                (
                    rid,
                    rid[:1],
                    status,
                    "old" if status == "running" else None,
                    "2026-01-01T00:00:00Z" if status == "running" else None,
                ),
            )
            conn.execute(
                "INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id,"
                " dagster_run_id, step_key, started_at) VALUES (%s, 1, 'old', 'd1', 'collect',"
                " '2026-01-01T00:00:00Z')",
                (rid,),
            )
    monkeypatch.setattr(schema, "shipped_migrations", lambda: shipped)
    assert BothFaces(fresh_database).migrate()[0] == "0003_lean_claims"
    with BothFaces(fresh_database) as ledger:
        [open_attempt] = ledger.attempts(run_id)
        assert (open_attempt.worker_id, open_attempt.caller_run_id, open_attempt.caller_step) == (
            "old",
            "d1",
            "collect",
        )
        assert open_attempt.outcome is None and open_attempt.started_at.year == 2026
        assert [a.outcome for a in ledger.attempts(abandoned)] == ["lease_lost"]
        assert ledger.claim(run_id, "new", 30) is not None
        assert [(a.worker_id, a.outcome) for a in ledger.attempts(run_id)] == [
            ("old", "lease_lost"),
            ("new", None),
        ]
