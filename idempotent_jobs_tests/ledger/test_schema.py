import logging
import multiprocessing
import threading
from collections.abc import Iterator

import psycopg
import pytest

from idempotent_jobs import InvalidInputError, LedgerError, SchemaNotMigratedError
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.schema import shipped_migrations
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger

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
    applied = LedgerAdmin(fresh_database).migrate()
    assert applied == [f"{m.version:04d}_{m.name}" for m in shipped_migrations()]
    found = columns(fresh_database, "idempotent_jobs")
    assert {t: found[t] for t in EXPECTED_COLUMNS} == EXPECTED_COLUMNS
    assert {"runs_identity_key", "runs_status_check", "run_attempts_outcome_check"} <= constraints(
        fresh_database, "idempotent_jobs"
    )


def test_migrating_twice_is_a_no_op(fresh_database: str) -> None:
    admin = LedgerAdmin(fresh_database)
    assert admin.migrate() != []
    before = columns(fresh_database, "idempotent_jobs")
    assert admin.migrate() == []
    assert columns(fresh_database, "idempotent_jobs") == before


def _migrate_in_child(
    conninfo: str,
    barrier: "multiprocessing.synchronize.Barrier",
    out: "multiprocessing.Queue[object]",
) -> None:
    barrier.wait()
    try:
        out.put(LedgerAdmin(conninfo).migrate())
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
    ledger = HarnessLedger(fresh_database)
    with pytest.raises(SchemaNotMigratedError, match="idempotent-jobs migrate"):
        ledger.open()
    LedgerAdmin(fresh_database).migrate()
    with ledger:
        assert ledger.get("0" * 64) is None


def test_a_missing_migration_is_refused_at_open(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DELETE FROM idempotent_jobs.schema_migrations")
    with pytest.raises(SchemaNotMigratedError, match="lacks migrations 0001_initial"):
        HarnessLedger(database).open()


def test_an_edited_migration_is_detected(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE idempotent_jobs.schema_migrations SET checksum = 'edited'")
    with pytest.raises(LedgerError, match="changed after it was applied"):
        LedgerAdmin(database).migrate()


def test_a_newer_schema_than_the_code_is_refused(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum)"
            " VALUES (9999, 'future', 'x')"
        )
    # No kind recorded (a release that did not say): taken for a contracting change.
    with pytest.raises(SchemaNotMigratedError, match=r"newer than the code: migration 9999_future"):
        HarnessLedger(database).open()


def _future_migration(conn: psycopg.Connection, change: str) -> None:
    """What a later release's migrate does: a new nullable column, recorded with its kind."""
    conn.execute("ALTER TABLE idempotent_jobs.runs ADD COLUMN IF NOT EXISTS future_note text")
    conn.execute(
        "INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum, change)"
        " VALUES (9001, 'future_note', 'x', %s)",
        (change,),
    )


def test_a_worker_runs_on_a_newer_additive_schema_and_refuses_a_contracting_one(
    database: str,
) -> None:
    from idempotent_jobs import __version__

    with psycopg.connect(database, autocommit=True) as conn:
        _future_migration(conn, "additive")
    # Both open: the newer migration is additive.
    with HarnessLedger(database) as ledger, LedgerAdmin.beside(ledger) as admin:
        record, lease = ledger.begin(identity(subject="expanded"), "w", 30)
        assert lease is not None
        ledger.complete(ledger.checkpoint(lease, {"n": 1}), {"summary": "s"})
        admin.migrate()  # the older code's migrate is a no-op on the newer schema
        from idempotent_jobs.core.health import ledger_findings

        findings = ledger_findings(admin, outbox_older_than_seconds=60, max_attempts=3)
        [ahead] = [f for f in findings if f.kind == "schema_ahead"]
        assert ahead.severity == "info" and "9001_future_note (additive)" in ahead.detail
        assert "mixed window is over when every worker runs that release" in ahead.detail
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "UPDATE idempotent_jobs.schema_migrations SET change = 'contracting'"
            " WHERE version = 9001"
        )
    expected = (
        rf"migration 9001_future_note \(contracting.*this code is idempotent-jobs "
        rf"{__version__} \(schema {shipped_migrations()[-1].version:04d}_"
    )
    with pytest.raises(SchemaNotMigratedError, match=expected):
        HarnessLedger(database).open()


def test_a_running_worker_survives_a_migrate_under_it(database: str) -> None:
    """Its prepared statements are invalidated by the new column ("cached plan must not change
    result type"): each is prepared afresh once, and the calls go on."""
    with HarnessLedger(database) as ledger:
        ident = identity(subject="long-lived")
        for _ in range(8):  # past psycopg's prepare threshold: the reads are prepared
            ledger.begin(ident, "w", 30)
            assert ledger.get(ident.run_id) is not None
        with psycopg.connect(database, autocommit=True) as conn:
            _future_migration(conn, "additive")
        record = ledger.get(ident.run_id)  # SELECT * now has one more column
        assert record is not None and record.run_id == ident.run_id
        _, lease = ledger.begin(identity(subject="after"), "w", 30)
        assert lease is not None
        assert ledger.complete(ledger.checkpoint(lease, {"n": 2}), {"summary": "s"}).accepted


class _Announced(logging.Handler):
    """Sets ``waiting`` when a worker says it waits for ``migrate`` (no sleep to sync on)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if "waiting up to" in record.getMessage():
            self.waiting.set()


@pytest.fixture
def announced() -> Iterator[_Announced]:
    handler = _Announced()
    logger = logging.getLogger("idempotent_jobs.core.executor")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _code_of_the_next_release(monkeypatch: pytest.MonkeyPatch) -> str:
    """From here on this process is the next release's code: it ships one more (additive)
    migration than the ledger, migrated by today's, has. Return that migration's label."""
    import idempotent_jobs.core.schema as schema

    shipped = shipped_migrations()
    nxt = schema.Migration.parse(
        shipped[-1].version + 1,
        "next_release_probe",
        "-- change: additive\nALTER TABLE {schema}.runs ADD COLUMN next_release_probe text;\n",
    )
    monkeypatch.setattr(schema, "shipped_migrations", lambda: [*shipped, nxt])
    return nxt.label


def test_new_code_deployed_before_migrate_waits_for_it_and_runs(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch, announced: _Announced
) -> None:
    LedgerAdmin(fresh_database).migrate()
    newest = _code_of_the_next_release(monkeypatch)
    opened: list[object] = []

    def worker() -> None:
        try:
            with HarnessLedger(fresh_database, schema_wait_seconds=120) as ledger:
                _, lease = ledger.begin(identity(subject="deployed-first"), "w", 30)
                assert lease is not None
                opened.append(ledger.complete(ledger.checkpoint(lease, {"n": 1}), {"s": "s"}))
        except BaseException as exc:  # the assertion below names it
            opened.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert announced.waiting.wait(60), announced.messages
    assert not opened, "the worker must not run before the migrate"
    assert newest in announced.messages[0]
    LedgerAdmin(fresh_database).migrate()
    thread.join(60)
    [completion] = opened
    assert getattr(completion, "accepted", False), completion
    assert "is migrated: going on" in announced.messages[-1]


def test_a_worker_waits_only_as_long_as_it_is_told(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch, announced: _Announced
) -> None:
    LedgerAdmin(fresh_database).migrate()
    newest = _code_of_the_next_release(monkeypatch)
    with pytest.raises(SchemaNotMigratedError, match=rf"lacks migrations {newest}.*\(waited 0\.2s"):
        HarnessLedger(fresh_database, schema_wait_seconds=0.2).open()
    with pytest.raises(SchemaNotMigratedError, match=rf"lacks migrations {newest}") as at_once:
        HarnessLedger(fresh_database, schema_wait_seconds=0).open()
    assert "waited" not in str(at_once.value)
    # The operator's face never waits: `runs list` on a ledger behind the CLI says so at once.
    with pytest.raises(SchemaNotMigratedError, match="run `idempotent-jobs migrate`$"):
        LedgerAdmin(fresh_database, schema_wait_seconds=60).open()
    # Nor does a worker on a ledger that was never migrated: that is no rollout.
    with pytest.raises(SchemaNotMigratedError, match="does not exist"):
        HarnessLedger(fresh_database, schema="never_migrated", schema_wait_seconds=60).open()


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), "10", True])
def test_a_bad_schema_wait_is_refused_naming_it(wait: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        HarnessLedger("postgresql://unused", schema_wait_seconds=wait)
    assert info.value.field == "schema_wait_seconds"


def test_every_shipped_migration_declares_its_kind_of_change(fresh_database: str) -> None:
    from idempotent_jobs.core.schema import Migration

    kinds = {m.label: m.change for m in shipped_migrations()}
    assert kinds["0006_lease_vocabulary"] == "contracting"  # renames
    assert kinds["0015_answered_calls"] == "additive"
    with pytest.raises(LedgerError, match="0099_x does not start with '-- change: additive'"):
        Migration.parse(99, "x", "ALTER TABLE t ADD COLUMN c text;\n")
    LedgerAdmin(fresh_database).migrate()
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        # A ledger migrated before kinds existed: its rows get them at the next migrate.
        conn.execute("UPDATE idempotent_jobs.schema_migrations SET change = NULL")
    LedgerAdmin(fresh_database).migrate()
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        stored: dict[str, str] = dict(
            conn.execute(
                "SELECT format('%s_%s', lpad(version::text, 4, '0'), name), change"
                " FROM idempotent_jobs.schema_migrations"
            ).fetchall()
        )
    assert stored == kinds


def test_a_custom_schema_is_independent(database: str) -> None:
    other = LedgerAdmin(database, schema="tenant_b_ledger")
    assert other.migrate() == [f"{m.version:04d}_{m.name}" for m in shipped_migrations()]
    found = columns(database, "tenant_b_ledger")
    assert {t: found[t] for t in EXPECTED_COLUMNS} == EXPECTED_COLUMNS


@pytest.mark.parametrize("name", ["Ledger", "a-b", "x; DROP TABLE y", "", "9abc"])
def test_bad_schema_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        LedgerAdmin("postgresql://unused", schema=name).migrate()
    assert info.value.field == "schema_name"


def test_the_lean_claims_migration_moves_open_attempts_onto_their_runs(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0003 keeps history: an open attempt written by the older code (in 0002's column names)
    is still listed, and the next claim closes it as before."""
    import idempotent_jobs.core.schema as schema

    shipped = shipped_migrations()
    monkeypatch.setattr(schema, "shipped_migrations", lambda: shipped[:2])
    LedgerAdmin(fresh_database).migrate()
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
    assert LedgerAdmin(fresh_database).migrate()[0] == "0003_lean_claims"
    with HarnessLedger(fresh_database) as ledger, LedgerAdmin.beside(ledger) as admin:
        [open_attempt] = admin.attempts(run_id)
        assert (open_attempt.worker_id, open_attempt.caller_run_id, open_attempt.caller_step) == (
            "old",
            "d1",
            "collect",
        )
        assert open_attempt.outcome is None and open_attempt.started_at.year == 2026
        assert [a.outcome for a in admin.attempts(abandoned)] == ["lease_lost"]
        assert ledger.claim(run_id, "new", 30) is not None
        assert [(a.worker_id, a.outcome) for a in admin.attempts(run_id)] == [
            ("old", "lease_lost"),
            ("new", None),
        ]


def test_the_claims_hold_only_migration_gives_back_what_begin_held_for_runs_it_did_not_claim(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0025: a hold an earlier release's ``begin`` took for a run it reused or found busy is
    given back (its counter too); the holds of calls that may be in flight are kept."""
    import idempotent_jobs.core.schema as schema
    from idempotent_jobs import Budget, run_idempotent

    shipped = shipped_migrations()
    [at] = [n for n, m in enumerate(shipped) if m.name == "claims_hold_only"]
    monkeypatch.setattr(schema, "shipped_migrations", lambda: shipped[:at])
    LedgerAdmin(fresh_database).migrate()
    done, busy = identity("done"), identity("busy")
    with HarnessLedger(fresh_database) as ledger, LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=10_000), job_name=done.job_name)
        run_idempotent(
            ledger,
            done,
            collect=lambda _: {"x": 1},
            transform=lambda raw: {"summary": "s"},
            worker_id="finisher",
        )
        _, lease = ledger.begin(busy, "holder", 300)
        assert lease is not None
    held = [  # (run, epoch, worker): kept?
        (done.run_id, 1, "reuser", False),  # what the old begin held reusing the run
        (busy.run_id, 1, "latecomer", False),  # ... and finding it busy
        (busy.run_id, 1, "holder", True),  # the lease's own call, in flight
        (done.run_id, 1, "finisher", True),  # a call the completing attempt still holds
        (done.run_id, 0, "shadow:s1", True),  # a shadow's
    ]
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        [(budget_id,)] = conn.execute("SELECT budget_id FROM idempotent_jobs.spend_budgets")
        for run_id, epoch, worker, _ in held:
            conn.execute(
                "INSERT INTO idempotent_jobs.budget_holds (run_id, lease_epoch, worker_id,"
                " budget_id, period_start, subject_id, amount) VALUES (%s, %s, %s, %s,"
                " (now() AT TIME ZONE 'UTC')::date, '', 100)",
                (run_id, epoch, worker, budget_id),
            )
        conn.execute(
            "INSERT INTO idempotent_jobs.budget_counters (budget_id, period_start, subject_id,"
            " reserved) VALUES (%s, (now() AT TIME ZONE 'UTC')::date, '', 500)"
            " ON CONFLICT (budget_id, period_start, subject_id)"
            " DO UPDATE SET reserved = EXCLUDED.reserved",
            (budget_id,),
        )
    monkeypatch.setattr(schema, "shipped_migrations", lambda: shipped[: at + 1])
    assert LedgerAdmin(fresh_database).migrate() == ["0025_claims_hold_only"]
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        kept = conn.execute(
            "SELECT run_id, lease_epoch, worker_id FROM idempotent_jobs.budget_holds"
        ).fetchall()
        [(reserved,)] = conn.execute(
            "SELECT reserved FROM idempotent_jobs.budget_counters WHERE subject_id = ''"
        )
    assert sorted(kept) == sorted((r, e, w) for r, e, w, keep in held if keep)
    assert reserved == 300
