"""Fixtures: a real PostgreSQL, one database per test cloned from a migrated template.

The server is ``IDEMPOTENT_JOBS_TEST_DATABASE_URL`` or ``IDEMPOTENT_JOBS_DATABASE_URL`` when set,
else the embedded server (started here, never skipped).
"""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.project_paths import project_home
from idempotent_jobs.operator.embedded import start_embedded_postgres
from idempotent_jobs_tests.installed_wheel import install_wheel
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.pgbouncer import PgBouncer

# Markers (registered in pyproject.toml, --strict-markers): `chaos`, `dagster_instance` and
# `browser` tests are also `slow`; `make check` (the fast lane) leaves every slow test out.
HEAVY_MARKERS = ("chaos", "dagster_instance", "browser")


#: The suite's folders by what a test costs, dearest first (see :func:`by_cost`).
COST_TIERS = ("system", "dagster", "ledger", "unit")


def by_cost(item: pytest.Item) -> int:
    """The cost tier of a test's folder: the dearest run first. `make test` hands whole files to
    two processes as each frees up (pytest-xdist's ``loadfile``), so the longest files must go
    first: collected last, a system file of two minutes keeps one process busy while the other
    has nothing left to take. The Makefile passes ``--no-loadscope-reorder``: by default xdist
    reorders the files by their number of tests, which puts the browser's one test of two
    minutes last of all."""
    parts = item.path.parts
    return next((n for n, tier in enumerate(COST_TIERS) if tier in parts), len(COST_TIERS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in HEAVY_MARKERS):
            item.add_marker(pytest.mark.slow)
    items.sort(key=by_cost)  # stable: each file's tests stay together and in order


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Each test leaves the process environment as it found it: a command run in process exports
    the ledger's URL and the project home for its children (``ensure_database_url``), which must
    not reach the next test in this process (the suite runs on two processes, in any order)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def server_url() -> str:
    """A URL of the server's maintenance database (``postgres``).

    Without a configured server, an embedded one of the tests' own (not the project's `dev`
    server): its data is thrown away after each test, so it skips fsync, which makes creating
    and dropping a database per test cheap on a slow disk."""
    configured = os.environ.get("IDEMPOTENT_JOBS_TEST_DATABASE_URL") or os.environ.get(
        DATABASE_URL_ENV
    )
    if configured:
        return configured
    url = start_embedded_postgres(project_home() / "test-pgdata")
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "full_page_writes"):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")
    return url


def database_conninfo(server_url: str, dbname: str) -> str:
    return make_conninfo(server_url, dbname=dbname)


def admin_execute(server_url: str, statement: sql.Composed) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(statement)


def copy_of_template(server_url: str, template_database: str, prefix: str = "ij_test") -> str:
    """A new database copied from the migrated template (no rows); returns its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin_execute(
        server_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)
        ),
    )
    return name


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel installed with its extras (and ``create-dagster``) into a virtualenv
    outside the repository, once for every docs test; that venv's ``bin``."""
    return install_wheel(tmp_path_factory.mktemp("installed-wheel"))


@pytest.fixture(scope="session")
def template_database(server_url: str) -> Iterator[str]:
    name = f"ij_template_{uuid.uuid4().hex[:12]}"
    admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    admin = LedgerAdmin(database_conninfo(server_url, name))
    admin.migrate()
    admin.close()
    yield name
    _drop(server_url, name)


@pytest.fixture
def fresh_database(server_url: str) -> Iterator[str]:
    """An empty database (no ledger schema); yields its conninfo."""
    name = f"ij_test_{uuid.uuid4().hex[:12]}"
    admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield database_conninfo(server_url, name)
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


# What a test may change besides the ledger's rows: tables, columns, constraints, privileges,
# views, functions, migrations, the ledger's options (the roles split) and the database's own
# settings. A database whose shape still
# matches the template's after a test is emptied and lent to the next test (creating one costs
# ~0.3 s); any other is dropped.
_SHAPE = """
SELECT md5(string_agg(item, ',' ORDER BY item)) FROM (
  SELECT format('rel %s.%s %s %s', n.nspname, c.relname, c.relkind, c.relacl) AS item
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp)'
  UNION ALL
  SELECT format('col %s.%s %s %s %s', c.relnamespace, c.relname, a.attname, a.atttypid,
                a.attnotnull)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE a.attnum > 0 AND NOT a.attisdropped
    AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp)'
  UNION ALL
  SELECT format('con %s %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
  WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL
  SELECT format('ns %s %s', nspname, nspacl) FROM pg_namespace
  UNION ALL
  SELECT format('fn %s', p.oid::regprocedure) FROM pg_proc p
  WHERE pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL
  SELECT format('view %s', pg_get_viewdef(c.oid)) FROM pg_class c WHERE c.relkind = 'v'
    AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL
  SELECT format('set %s', s.setconfig) FROM pg_db_role_setting s
  WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL
  SELECT format('mig %s %s', version, checksum) FROM idempotent_jobs.schema_migrations
  UNION ALL
  SELECT format('opt %s %s', name, value) FROM idempotent_jobs.ledger_options
) AS shape"""

# Empty the ledger's tables for the next test: only those holding rows are truncated (a
# truncation makes new files for the table and its indexes, ~3 ms a table: the whole schema
# took ~80 ms a test), and every identity starts again, as `TRUNCATE ... RESTART IDENTITY`.
_EMPTY = """
DO $empty$
DECLARE
  t regclass;
  held boolean;
  filled text[] := ARRAY[]::text[];
BEGIN
  FOR t IN SELECT c.oid::regclass FROM pg_class c
    WHERE c.relnamespace = 'idempotent_jobs'::regnamespace AND c.relkind = 'r'
      AND c.relname NOT IN ('schema_migrations', 'ledger_options')
  LOOP
    EXECUTE format('SELECT EXISTS (SELECT FROM %s)', t) INTO held;
    IF held THEN
      filled := filled || t::text;
    END IF;
  END LOOP;
  IF cardinality(filled) > 0 THEN
    EXECUTE format('TRUNCATE %s CASCADE', array_to_string(filled, ', '));
  END IF;
  PERFORM setval(q.seqrelid, q.seqstart, false) FROM pg_sequence AS q
  JOIN pg_class AS c ON c.oid = q.seqrelid
  WHERE c.relnamespace = 'idempotent_jobs'::regnamespace;
END
$empty$"""


def _shape(conninfo: str) -> str | None:
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(_SHAPE).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


def _drop(server_url: str, name: str) -> None:
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


def _empty_for_reuse(server_url: str, name: str, template_shape: str) -> bool:
    """Empty the test database for the next test if its shape is the template's."""
    conninfo = database_conninfo(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(  # what the test left connected (a thread's pool, a child process)
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (name,),
        )
    if _shape(conninfo) != template_shape:
        return False
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            conn.execute(_EMPTY)
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="session")
def spare_databases(server_url: str, template_database: str) -> Iterator[tuple[list[str], str]]:
    """Emptied test databases to lend again, and the template's shape they must keep."""
    spare: list[str] = []
    yield spare, _shape(database_conninfo(server_url, template_database)) or ""
    for name in spare:
        _drop(server_url, name)


@pytest.fixture
def database(
    server_url: str, template_database: str, spare_databases: tuple[list[str], str]
) -> Iterator[str]:
    """A migrated database of this test's own, with no rows; yields its conninfo."""
    spare, template_shape = spare_databases
    if spare:
        name = spare.pop()
    else:
        name = copy_of_template(server_url, template_database)
    yield database_conninfo(server_url, name)
    if template_shape and _empty_for_reuse(server_url, name, template_shape):
        spare.append(name)
    else:
        _drop(server_url, name)


@pytest.fixture
def ledger(database: str) -> Iterator[HarnessLedger]:
    """The worker face on the test database (claims, checkpoints, commits, model calls), with
    the test harness's own statements."""
    with HarnessLedger(database) as opened:
        yield opened


@pytest.fixture
def operator(database: str) -> Iterator[LedgerAdmin]:
    """The operator face on the same database (listings, revisions, prices, budgets, drills,
    migrate), a pool of its own: what a test reads back is what an operator would see."""
    with LedgerAdmin(database) as opened:
        yield opened


@pytest.fixture
def db(database: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection to the test database, for checks and planted states."""
    with psycopg.connect(database, autocommit=True) as conn:
        yield conn


@pytest.fixture
def dagster_env(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DagsterTestEnv:
    """Env vars the test code location reads: this test's ledger database and call logs."""
    from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV, dagster_storage_url

    env = DagsterTestEnv(database, tmp_path)
    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.setenv(DAGSTER_STORAGE_URL_ENV, dagster_storage_url(database))
    monkeypatch.setenv("IJ_TEST_DIR", str(env.calls_dir))
    monkeypatch.setenv("IJ_TEST_NOTIFICATIONS", str(env.notifications))
    return env


@pytest.fixture(scope="session")
def pgbouncer(server_url: str) -> Iterator[PgBouncer]:
    """PgBouncer 1.18 in transaction pooling mode in front of the test server."""
    with PgBouncer(server_url) as bouncer:
        yield bouncer


def through_pgbouncer(bouncer: PgBouncer, conninfo: str) -> str:
    """The same database as ``conninfo``, reached through ``bouncer``."""
    return bouncer.url(str(psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]))


@pytest.fixture(params=["direct", "pgbouncer"])
def racer_url(request: pytest.FixtureRequest, database: str) -> str:
    """The test database as racing workers reach it: directly, and through PgBouncer in
    transaction pooling mode."""
    if request.param == "direct":
        return database
    return through_pgbouncer(request.getfixturevalue("pgbouncer"), database)
