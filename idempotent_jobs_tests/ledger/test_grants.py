"""Grants: the worker and reader group roles hold exactly what they need, and survive upgrades.

Login roles made here are members of the group roles ``migrate`` creates, as the README says
(``GRANT idempotent_jobs_worker TO <role>``), and run the ledger through their own connections.
"""

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idempotent_jobs import JobConfig, ModelAnswer, ModelUsage, RunIdentity, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.errors import InvalidInputError, LedgerPermissionError
from idempotent_jobs.core.grants import WORKER_PRIVILEGES, reader_role, worker_role
from idempotent_jobs.core.retention import RetentionPolicy, prune
from idempotent_jobs.operator.cli import main
from idempotent_jobs_tests.helpers import backdate, deliver_all, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

SCHEMA = "idempotent_jobs"
MakeRole = Callable[..., str]


@pytest.fixture
def login_role(server_url: str, database: str) -> Iterator[MakeRole]:
    """Make a login role, member of the given group roles; yields its conninfo to the test
    database. The roles are dropped afterwards (roles belong to the server, not the database)."""
    made: list[str] = []

    def make(*groups: str) -> str:
        name = f"ij_login_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            made.append(name)
            for group in groups:
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name))
                )
        return make_conninfo(database, user=name)

    yield make
    for name in made:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def answer(raw: dict[str, object]) -> ModelAnswer:
    return ModelAnswer({"summary": "ok"}, ModelUsage("m", 10, 2))


def test_the_map_names_every_relation_of_the_schema(db: psycopg.Connection) -> None:
    """A migration that adds a table must say what workers may do on it."""
    rows = db.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
        "AND relkind IN ('r', 'v', 'm', 'p')",
        (SCHEMA,),
    ).fetchall()
    assert {name for (name,) in rows} == set(WORKER_PRIVILEGES)


def test_a_worker_role_runs_every_step_and_cannot_touch_the_history(
    login_role: MakeRole, db: psycopg.Connection
) -> None:
    as_worker = login_role(worker_role(SCHEMA))
    with HarnessLedger(as_worker) as ledger, LedgerAdmin.beside(ledger) as as_operator:
        outcome = run_idempotent(
            ledger, identity(), collect=lambda i: {"x": 1}, transform=answer, notifications=email
        )
        assert outcome.executed
        assert len(deliver_all(ledger)) == 1
        as_operator.revise(outcome.run_id, "prompt fixed", channels=["email"])
        again = run_idempotent(
            ledger, identity(), collect=lambda i: {"x": 1}, transform=answer, notifications=email
        )
        assert again.executed
        backdate(db, outcome.run_id, 400)
        pruned = prune(
            as_operator,
            identity().job_name,
            RetentionPolicy.of_days(attempts=1, raw_input=1),
            apply=True,
        )
        assert pruned.parts["attempts"].rows > 0
        assert as_operator.missing_privileges()[1] == []
    with psycopg.connect(as_worker, autocommit=True) as conn:
        for statement in (
            "DELETE FROM idempotent_jobs.schema_migrations",
            "UPDATE idempotent_jobs.schema_migrations SET checksum = 'x'",
            "INSERT INTO idempotent_jobs.schema_migrations VALUES (99, 'x', 'x')",
            "TRUNCATE idempotent_jobs.schema_migrations",
            "DELETE FROM idempotent_jobs.runs",
            "DELETE FROM idempotent_jobs.model_calls",
            "CREATE TABLE idempotent_jobs.mine (x int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_a_reader_role_reads_and_writes_nothing(
    login_role: MakeRole, ledger: HarnessLedger
) -> None:
    done = run_idempotent(ledger, identity(), collect=lambda i: {"x": 1}, transform=answer)
    as_reader = login_role(reader_role(SCHEMA))
    with HarnessLedger(as_reader) as reading, LedgerAdmin.beside(reading) as read_only:
        assert [r.run_id for r in read_only.list_runs()] == [done.run_id]
        assert reading.model_calls(done.run_id)
        with pytest.raises(LedgerPermissionError, match="GRANT idempotent_jobs_worker TO"):
            run_idempotent(reading, identity("other"), collect=lambda i: {"x": 1}, transform=answer)
        role, missing = read_only.missing_privileges()
        assert "INSERT on idempotent_jobs.runs" in missing
        assert "SELECT on idempotent_jobs.runs" not in missing


def test_doctor_names_what_the_role_lacks(
    login_role: MakeRole, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = login_role()
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", bare)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    role = psycopg.conninfo.conninfo_to_dict(bare)["user"]
    assert f"role {role} lacks USAGE on schema idempotent_jobs" in out
    assert f"GRANT idempotent_jobs_worker TO {role}" in out

    reader = login_role(reader_role(SCHEMA))
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", reader)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "missing_privilege" in out and "INSERT on idempotent_jobs.model_calls" in out

    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", login_role(worker_role(SCHEMA)))
    assert main(["doctor"]) == 0
    assert "has every privilege workers need" in capsys.readouterr().out


def test_migrate_grants_again_what_a_table_lost(
    login_role: MakeRole, database: str, db: psycopg.Connection
) -> None:
    """Grants are made whole by every migrate: a table added (or whose grants were lost) since
    reaches every member of the group role with no grant of its own."""
    as_worker = login_role(worker_role(SCHEMA))
    db.execute("REVOKE ALL ON idempotent_jobs.model_calls FROM idempotent_jobs_worker")
    db.execute("GRANT DELETE ON idempotent_jobs.runs TO idempotent_jobs_worker")
    with LedgerAdmin(as_worker) as as_operator:
        assert "INSERT on idempotent_jobs.model_calls" in as_operator.missing_privileges()[1]
    LedgerAdmin(database).migrate()
    with HarnessLedger(as_worker) as ledger, LedgerAdmin.beside(ledger) as as_operator:
        assert as_operator.missing_privileges()[1] == []
        run_idempotent(ledger, identity(), collect=lambda i: {"x": 1}, transform=answer)
    with psycopg.connect(as_worker, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM idempotent_jobs.runs")


def test_migrate_without_createrole_says_what_a_superuser_must_do(
    server_url: str, login_role: MakeRole
) -> None:
    """A role that may create databases but not roles migrates its own database; the group
    roles it cannot make are named in the report, with the statement that makes them."""
    owner_url = login_role()
    owner = psycopg.conninfo.conninfo_to_dict(owner_url)["user"]
    database = f"ij_owned_{uuid.uuid4().hex[:10]}"
    schema = f"tenant_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(str(owner))
            )
        )
    try:
        report = LedgerAdmin(make_conninfo(owner_url, dbname=database), schema=schema).upgrade()
        assert report.applied
        assert any(f"`CREATE ROLE {schema}_worker NOLOGIN`" in line for line in report.found), (
            report.found
        )
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


def test_the_reader_role_runs_every_read_of_the_operator_face(
    login_role: MakeRole, ledger: HarnessLedger
) -> None:
    """Each admin method that reads (every operator statement that writes nothing) works for a
    read-only role: the reader can list, show, check health, estimate and count storage."""
    from idempotent_jobs.core.admin import LedgerAdmin
    from idempotent_jobs.core.health import ledger_findings
    from idempotent_jobs.core.records import JobConfig
    from idempotent_jobs.core.sql import face_statements

    done = run_idempotent(ledger, identity(), collect=lambda i: {"x": 1}, transform=answer)
    writes = re.compile(
        r"\b(INSERT INTO|UPDATE|DELETE FROM)\s+\{schema\}\."
        r"|\{schema\}\.(settle_doubt|prune_spend)\(",
        re.IGNORECASE,
    )
    reads = {n for n, s in face_statements("admin").items() if not writes.search(s.text)}
    ran: set[str] = set()

    with LedgerAdmin(login_role(reader_role(SCHEMA))) as reader:
        real_fetch = reader._db.fetch

        def fetch(name: str, params: Any, row_factory: Any) -> Any:
            ran.add(name)
            return real_fetch(name, params, row_factory)

        real_rows = reader._db.rows

        def rows(name: str, params: Any) -> Any:
            ran.add(name)
            return real_rows(name, params)

        reader._db.fetch = fetch  # type: ignore[method-assign]
        reader._db.rows = rows  # type: ignore[method-assign]
        run_id = reader.resolve_run_id(done.run_id[:10])
        assert reader.get(run_id) is not None
        assert reader.attempts(run_id) and reader.model_calls(run_id) is not None
        reader.outbox(run_id)
        reader.revisions(run_id)
        reader.list_runs()
        reader.job_names()
        reader.drills()
        reader.drifted(
            "competitor-summary", "v1", JobConfig.of(prompt="p", model="m", validator="v")
        )
        reader.storage()
        reader.prices()
        reader.rate_limits()
        reader.batches()
        reader.batch_runs("0" * 32)
        with pytest.raises(InvalidInputError, match="no batch"):
            reader.batch_id_of("0000")  # read, and none found
        reader.spend_by_job()
        reader.job_history("competitor-summary")
        reader.run_statuses([run_id])
        reader.run_sizes([run_id])
        reader.price_matches()
        reader.call_costs(run_id)
        reader.currency()
        reader.budgets()
        reader.spend_by_kind(reader.database_now() - timedelta(days=31), reader.database_now())
        reader.spend_totals(reader.database_now() - timedelta(days=31), reader.database_now())
        reader.calls_in_doubt()
        reader.database_now()
        reader.baseline_version("competitor-summary", "v2")
        reader.shadows()
        reader.quarantine(job_name="competitor-summary")
        reader.shadow("sh-000000000000")
        reader.shadow_items("sh-000000000000")
        reader.shadow_gate("competitor-summary", "v2")
        ledger_findings(reader, outbox_older_than_seconds=60, max_attempts=3)
    assert reads - ran == set(), "an admin read this test does not run"


def test_split_roles_leave_workers_admitting_and_settling_and_operators_setting(
    login_role: MakeRole, ledger: HarnessLedger, db: psycopg.Connection, database: str
) -> None:
    """Before the split (an upgrade keeps today's grants) a worker may still set a price, and
    migrate says what to run; after `migrate --split-roles` a worker admits, settles, declares
    its spec's budget and limit and prunes spend through the ledger's functions, but cannot set
    a price, a budget or a limit, reset a counter, cancel a batch or settle a call in doubt;
    the operator role can. `doctor` names what each may do."""
    from idempotent_jobs import Budget, LedgerAdmin
    from idempotent_jobs.core.grants import ensure_grants, operator_role
    from idempotent_jobs.core.rate_limits import RateLimit, RateRequest
    from idempotent_jobs_tests.helpers import claimed

    as_worker = login_role(worker_role(SCHEMA))
    as_operator = login_role(operator_role(SCHEMA))
    # A ledger created by this release starts split; one upgraded from an earlier release keeps
    # today's grants: as if this one had been.
    assert db.execute("SELECT value FROM idempotent_jobs.ledger_options").fetchall() == [("true",)]
    db.execute("DELETE FROM idempotent_jobs.ledger_options")
    with LedgerAdmin.beside(ledger) as owner:
        # The upgrade that applies 0021 says what to run; a migrate with nothing to apply not.
        upgraded = ensure_grants(db, SCHEMA, upgraded=True)
        assert any("--split-roles" in line for line in upgraded.found)
        assert not any("--split-roles" in line for line in owner.upgrade().found)
        with LedgerAdmin(as_worker) as worker_admin:  # not split yet: today's grants
            worker_admin.set_price("m", "1", "1")
            assert "sets prices" in worker_admin.role_abilities().may
        report = owner.upgrade(split_roles=True)
        assert any(line.startswith("split the roles") for line in report.done)
        assert not any("--split-roles" in line for line in report.found)
        owner.set_budget(Budget(amount="5", unit="money", period="month"), job_name="money-job")
    with HarnessLedger(as_worker) as worker, LedgerAdmin.beside(worker) as worker_as_operator:
        assert worker_as_operator.missing_privileges()[1] == []
        done = run_idempotent(
            worker,
            RunIdentity("money-job", "a", datetime(2026, 12, 1, tzinfo=UTC), "v1"),
            collect=lambda i: {"x": 1},
            transform=answer,
            max_tokens_per_call=100,
            budget=Budget(amount=1000, period="month"),
            config=JobConfig.of(prompt="", model="m", validator=""),
        )
        assert done.executed
        worker.declare_rate_limits([RateLimit("p", "m", requests_per_minute=100)], "money-job")
        lease = claimed(
            worker, RunIdentity("money-job", "b", datetime(2026, 12, 1, tzinfo=UTC), "v1")
        )
        grant = worker.acquire_rate(lease, RateRequest("p", "m"), 0)  # a place, by the buckets
        assert grant is not None and grant.granted
        # The admission of a request (lease, hold, place in one statement) under split roles.
        admitted = worker.admit_request(
            lease,
            renew=True,
            hold=True,
            max_tokens=10,
            requested_model="m",
            place=RateRequest("p", "m"),
        )
        assert admitted is not None and admitted.granted
        worker.release_budget(lease)  # never sent: its hold is given back
        assert worker_as_operator.prune_spend("money-job", apply=True) == 0
        abilities = worker_as_operator.role_abilities()
        assert abilities.split and abilities.may == ["runs model calls"]
        assert abilities.groups == [worker_role(SCHEMA)]
    counters = db.execute(
        "SELECT budget_id, spent, reserved FROM idempotent_jobs.budget_counters ORDER BY 1"
    ).fetchall()
    assert counters == [
        ("job:money/month:money-job", Decimal("0.000012"), 0),
        ("job:tokens/month:money-job", 12, 0),
    ]
    with psycopg.connect(as_worker, autocommit=True) as conn:
        for statement in (
            "INSERT INTO idempotent_jobs.price_history (model_pattern, effective_from, currency,"
            " input_per_million, output_per_million) VALUES ('m', now(), 'USD', 0, 0)",
            "UPDATE idempotent_jobs.spend_budgets SET amount = 1e18",
            "DELETE FROM idempotent_jobs.spend_budgets",
            "UPDATE idempotent_jobs.budget_counters SET spent = 0",
            "DELETE FROM idempotent_jobs.budget_holds",
            "UPDATE idempotent_jobs.rate_limits SET requests_per_window = 1000000",
            "UPDATE idempotent_jobs.batches SET cancel_requested_at = now()",
            "SELECT idempotent_jobs.settle_doubt(1, 0, 0, 'w')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with LedgerAdmin(as_operator) as operator:
        operator.set_price("m", "2", "2")
        operator.set_budget(Budget(amount="6", unit="money", period="month"), job_name="money-job")
        operator.set_rate_limit(RateLimit("p", "m", requests_per_minute=50))
        with pytest.raises(InvalidInputError, match="no model call 999"):
            operator.settle_call(999, input_tokens=0, output_tokens=0)
        abilities = operator.role_abilities()
        assert abilities.may == [
            "runs model calls",
            "sets prices",
            "sets budgets",
            "sets rate limits",
            "cancels batches",
            "settles calls in doubt",
        ]
    with LedgerAdmin.beside(ledger) as owner:  # a later migrate keeps the roles split
        assert not any("--split-roles" in line for line in owner.upgrade().found)
    with (
        psycopg.connect(as_worker, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("DELETE FROM idempotent_jobs.price_history")


def test_a_worker_changes_what_a_budget_counts_only_by_its_own_calls_as_they_were(
    login_role: MakeRole, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """Under split roles the ledger's functions are a worker's only way to the counters, so
    they check what they are given: a negative worst case is refused (it lowered what the
    budget held), a job is held under only through a lease of its run (any job could be named),
    the settling functions are the trigger's alone (a row of the worker's making lowered what
    was spent), a spec declares only its own job's budgets (and groups), and a call's counts
    are never negative nor its money a worker's to change."""
    from idempotent_jobs import Budget, LedgerAdmin

    as_worker = login_role(worker_role(SCHEMA))
    with LedgerAdmin.beside(ledger) as owner:
        owner.set_price("m", "1", "1")
        owner.set_budget(Budget(amount="5", unit="money", period="month"), job_name="money-job")
    identity = RunIdentity("money-job", "a", datetime(2026, 12, 1, tzinfo=UTC), "v1")
    with HarnessLedger(as_worker) as worker:
        done = run_idempotent(
            worker,
            identity,
            collect=lambda i: {"x": 1},
            transform=answer,
            max_tokens_per_call=100,
            config=JobConfig.of(prompt="", model="m", validator=""),
        )
    assert done.executed

    def books() -> list[tuple[Any, ...]]:
        return db.execute(
            "SELECT k.budget_id, k.spent, k.reserved, k.in_doubt, k.calls,"
            " (SELECT sum(money) FROM idempotent_jobs.model_calls),"
            " (SELECT count(*) FROM idempotent_jobs.budget_holds)"
            " FROM idempotent_jobs.budget_counters AS k ORDER BY 1"
        ).fetchall()

    before = books()
    assert before == [
        ("job:money/month:money-job", Decimal("0.000012"), 0, 0, 1, Decimal("0.000012"), 0)
    ]
    admit = (
        "SELECT outcome FROM idempotent_jobs.reserve_budget(%s, 1, 'w', %s, 0, 0, 'm', NULL,"
        " NULL, 'money-job', '')"
    )
    with psycopg.connect(as_worker, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="from 0"):
            conn.execute(admit, (identity.run_id, -(10**9)))
        # The run is completed: no lease of it, whichever job the caller names.
        assert conn.execute(admit, (identity.run_id, 100)).fetchall() == [("lease_lost",)]
        assert conn.execute(admit, ("no-such-run", 100)).fetchall() == [("lease_lost",)]
        for statement in (
            "SELECT idempotent_jobs.settle_recorded_call(c) FROM idempotent_jobs.model_calls AS c",
            "SELECT idempotent_jobs.settle_budget_by_budget(c)"
            " FROM idempotent_jobs.model_calls AS c",
            "SELECT * FROM idempotent_jobs.reserve_under_budgets('r', 1, 'w', 1, 0, 0, 'm', NULL,"
            " NULL, 'money-job', '')",
            "UPDATE idempotent_jobs.model_calls SET money = 0",
            "UPDATE idempotent_jobs.model_calls SET input_tokens = 0, price_id = NULL",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        # A spec declares its own job's budgets and groups: not another job's, at any amount.
        declare = (
            "SELECT * FROM idempotent_jobs.declare_spec_budgets('other-job', ARRAY[%s],"
            " ARRAY[%s], ARRAY[%s], ARRAY['money'], ARRAY['month'], ARRAY[1e18]::numeric[])"
        )
        for budget_id, scope, name in (
            ("job:money/month:money-job", "job", "money-job"),
            ("subject:money/month:money-job", "subject", "money-job"),
            ("job:money/month:other-job", "job", "money-job"),
            ("job:money/month:other-job", "group", "other-job"),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="its own budgets"):
                conn.execute(declare, (budget_id, scope, name))
        conn.execute(declare, ("group:money/month:team", "group", "team"))
        conn.execute(declare, ("job:money/month:other-job", "job", "other-job"))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO idempotent_jobs.model_calls (run_id, lease_epoch, revision, worker_id,"
                " model_name, input_tokens, output_tokens, outcome, requested_model)"
                " VALUES (%s, 1, 0, 'w', 'm', -1000000000, 0, 'failed', 'm')",
                (identity.run_id,),
            )
    assert books() == before
    declared = db.execute(
        "SELECT budget_id, jobs FROM idempotent_jobs.spend_budgets ORDER BY 1"
    ).fetchall()
    assert declared == [
        ("group:money/month:team", ["other-job"]),
        ("job:money/month:money-job", ["money-job"]),
        ("job:money/month:other-job", ["other-job"]),
    ]


def test_an_operators_command_run_as_a_worker_names_the_operator_role(
    login_role: MakeRole,
    ledger: HarnessLedger,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker's role refused one of the operator's commands is told which group role it
    needs (it has the worker's already), in one line, exit 2."""
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", login_role(worker_role(SCHEMA)))
    for argv, doing in (
        (["prices", "set", "m", "--input", "1", "--output", "1"], "setting a price"),
        (["budgets", "set", "--job", "j", "--tokens", "5", "--per", "day"], "setting a budget"),
        (
            ["limits", "set", "openai", "gpt-4o", "--requests-per-minute", "5"],
            "setting a rate limit",
        ),
        (
            ["costs", "settle", "1", "--input-tokens", "0", "--output-tokens", "0"],
            "settling a call in doubt",
        ),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{doing} is the operator role's" in err, err
        assert "GRANT idempotent_jobs_operator TO <role>" in err and len(err.splitlines()) == 1
    # Every statement the message is for is one of the operator face's, and only of it.
    from idempotent_jobs.core.grants import OPERATOR_STATEMENTS
    from idempotent_jobs.core.sql import face_statements

    admin, worker = set(face_statements("admin")), set(face_statements("worker"))
    assert set(OPERATOR_STATEMENTS) <= admin - worker
