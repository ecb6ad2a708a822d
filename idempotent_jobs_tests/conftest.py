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

from idempotent_jobs import RunLedger
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.dagster.project import project_home
from idempotent_jobs.operator.embedded import start_embedded_postgres
from idempotent_jobs_tests.dagster_harness import DagsterTestEnv

# Markers (registered in pyproject.toml, --strict-markers): `chaos`, `dagster_instance` and
# `browser` tests are also `slow`; `make check` (the fast lane) leaves every slow test out.
HEAVY_MARKERS = ("chaos", "dagster_instance", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in HEAVY_MARKERS):
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture(scope="session")
def template_database(server_url: str) -> Iterator[str]:
    name = f"ij_template_{uuid.uuid4().hex[:12]}"
    admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    RunLedger(database_conninfo(server_url, name)).migrate()
    yield name
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
def fresh_database(server_url: str) -> Iterator[str]:
    """An empty database (no ledger schema); yields its conninfo."""
    name = f"ij_test_{uuid.uuid4().hex[:12]}"
    admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield database_conninfo(server_url, name)
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
def database(server_url: str, template_database: str) -> Iterator[str]:
    """A migrated database of this test's own; yields its conninfo."""
    name = f"ij_test_{uuid.uuid4().hex[:12]}"
    admin_execute(
        server_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)
        ),
    )
    yield database_conninfo(server_url, name)
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
def ledger(database: str) -> Iterator[RunLedger]:
    with RunLedger(database) as opened:
        yield opened


@pytest.fixture
def db(database: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection to the test database, for checks and planted states."""
    with psycopg.connect(database, autocommit=True) as conn:
        yield conn


@pytest.fixture
def dagster_env(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DagsterTestEnv:
    """Env vars the test code location reads: this test's ledger database and call logs."""
    from idempotent_jobs.dagster.project import DAGSTER_STORAGE_URL_ENV, dagster_storage_url

    env = DagsterTestEnv(database, tmp_path)
    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.setenv(DAGSTER_STORAGE_URL_ENV, dagster_storage_url(database))
    monkeypatch.setenv("IJ_TEST_DIR", str(env.calls_dir))
    monkeypatch.setenv("IJ_TEST_NOTIFICATIONS", str(env.notifications))
    return env
