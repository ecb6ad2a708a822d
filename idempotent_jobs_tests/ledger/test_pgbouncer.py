"""The ledger through a real PgBouncer 1.18 in transaction pooling mode (docs/deployment.md).

1.18 cannot keep prepared statements in transaction mode: the ledger finds the pooler when it
opens (the backend pid the server reports is not the one the pooler gave the client) and stops
preparing. The ``TimeZone`` advice of the docs is tested here for real, with a role whose own
zone is not UTC.
"""

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from idempotent_jobs import LedgerConnectionError, LedgerError, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.conftest import through_pgbouncer
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.pgbouncer import PgBouncer

pytestmark = [pytest.mark.slow]

ZONE = "Asia/Kathmandu"  # +05:45: no whole-hour offset hides in it


def test_the_ledger_finds_pgbouncer_and_runs_the_protocol_without_prepared_statements(
    database: str, pgbouncer: PgBouncer
) -> None:
    url = through_pgbouncer(pgbouncer, database)
    errors: list[BaseException] = []
    outcomes: list[bool] = []

    def worker(number: int) -> None:
        try:
            with HarnessLedger(url, pool_max_size=2) as ledger:
                assert ledger.pooled
                for hour in range(10):
                    outcome = run_idempotent(
                        ledger,
                        identity(subject=f"pooled-{number % 3}", hour=hour),
                        collect=lambda _: {"docs": ["d"]},
                        transform=lambda raw: {"summary": "s"},
                        notifications=lambda o: {"email": {"body": o["summary"]}},
                        wait_seconds=30,
                    )
                    outcomes.append(outcome.executed)
        except BaseException as exc:  # named by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(outcomes) == 30 and len(outcomes) == 60, "3 subjects x 10 hours, each run once"
    with HarnessLedger(database) as direct:
        assert not direct.pooled


def test_prepared_statements_forced_through_pgbouncer_1_18_break_and_the_default_does_not(
    database: str, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Why the detection matters: two clients sharing one server connection collide on the
    names psycopg gives prepared statements."""
    with PgBouncer(server_url, pool_size=1) as bouncer:
        url = through_pgbouncer(bouncer, database)
        forced = [
            HarnessLedger(url, pool_max_size=1, prepared_statements=True, connect_timeout_seconds=2)
            for _ in range(2)
        ]
        with pytest.raises((LedgerError, psycopg.Error)) as failed:
            for hour in range(3):
                for ledger in forced:
                    ledger.register(identity(subject="forced", hour=hour))
        # Met at once in a statement, or in a pooled connection's first SET (then the pool
        # retries until its timeout and logs why).
        assert "prepared statement" in str(failed.value) + caplog.text
        for ledger in forced:
            ledger.close()
        detected = [HarnessLedger(url, pool_max_size=1) for _ in range(2)]
        for hour in range(3):
            for ledger in detected:
                ledger.register(identity(subject="detected", hour=hour))
        for ledger in detected:
            ledger.close()


def test_migrate_refuses_a_pooler_and_names_the_reason(database: str, pgbouncer: PgBouncer) -> None:
    with pytest.raises(LedgerError, match="migrate needs a direct connection"):
        LedgerAdmin(through_pgbouncer(pgbouncer, database)).migrate()


@pytest.fixture
def zoned_role(server_url: str, database: str) -> Iterator[str]:
    """A worker login role whose own TimeZone is not UTC."""
    name = f"ij_zoned_{uuid.uuid4().hex[:8]}"
    role = sql.Identifier(name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
        conn.execute(sql.SQL("ALTER ROLE {} SET TimeZone = {}").format(role, sql.Literal(ZONE)))
        conn.execute(sql.SQL("GRANT idempotent_jobs_worker TO {}").format(role))
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
        conn.execute(sql.SQL("DROP ROLE {}").format(role))


def test_timezone_advice_of_the_deployment_docs(
    server_url: str, database: str, zoned_role: str
) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(database)["dbname"])
    # Without `options` in ignore_startup_parameters, 1.18 refuses the ledger's connection.
    with PgBouncer(server_url, users=(zoned_role,), ignore_options=False) as strict:
        with pytest.raises(LedgerConnectionError, match="unsupported startup parameter: options"):
            HarnessLedger(strict.url(dbname, user=zoned_role)).open()
    with PgBouncer(server_url, users=(zoned_role,)) as bouncer:
        url = bouncer.url(dbname, user=zoned_role)
        # The role's zone is what a client gets through the pooler: the startup option is gone.
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as plain:
            assert plain.execute("SHOW TimeZone").fetchone() == (ZONE,)
        with HarnessLedger(url, pool_max_size=2) as ledger:
            assert ledger.pooled
            record, lease = ledger.begin(identity(subject="zoned"), "w", 30)
            assert lease is not None
            stamps = [record.created_at, lease.expires_at, ledger.get(record.run_id).updated_at]  # type: ignore[union-attr]
            assert all(s is not None and s.utcoffset() == timedelta(0) for s in stamps), stamps
            # Every server connection the pooler hands the ledger is set to UTC again.
            with ledger.connection() as conn:
                for _ in range(5):
                    assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
