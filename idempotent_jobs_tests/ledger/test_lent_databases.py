"""The suite lends an emptied database to the next test (conftest's ``database``): whatever
tables one test wrote, the next finds no row and its identities start again."""

import psycopg
from psycopg import sql

from idempotent_jobs import ModelUsage
from idempotent_jobs_tests.conftest import (
    _drop,
    _empty_for_reuse,
    _shape,
    copy_of_template,
    database_conninfo,
)
from idempotent_jobs_tests.helpers import claimed, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = 'idempotent_jobs'::regnamespace AND c.relkind = 'r'
  AND c.relname NOT IN ('schema_migrations', 'ledger_options')"""


def rows(conn: psycopg.Connection) -> dict[str, int]:
    """Each ledger table that holds rows, and how many."""
    counts = {}
    for (table,) in conn.execute(TABLES).fetchall():
        query = sql.SQL("SELECT count(*) FROM idempotent_jobs.{}").format(sql.Identifier(table))
        [n] = conn.execute(query).fetchone() or [0]
        if n:
            counts[table] = n
    return counts


def test_an_emptied_database_has_no_rows_and_its_identities_start_again(
    server_url: str, template_database: str
) -> None:
    name = copy_of_template(server_url, template_database)
    conninfo = database_conninfo(server_url, name)
    try:
        with HarnessLedger(conninfo) as ledger:
            lease = ledger.checkpoint(claimed(ledger, identity()), {"documents": ["d"]})
            ledger.complete(
                lease, {"summary": "s"}, email({"summary": "s"}), usage=ModelUsage("m", 10, 1)
            )
        with psycopg.connect(conninfo, autocommit=True) as conn:
            written = set(rows(conn))
            [calls_before] = conn.execute(
                "SELECT last_value FROM idempotent_jobs.model_calls_call_id_seq"
            ).fetchone() or [0]
        assert {"runs", "model_calls", "notification_outbox"} <= written
        assert calls_before == 1

        template_shape = _shape(database_conninfo(server_url, template_database))
        assert template_shape is not None
        assert _empty_for_reuse(server_url, name, template_shape)

        with psycopg.connect(conninfo, autocommit=True) as conn:
            assert rows(conn) == {}
            sequences = conn.execute(
                "SELECT last_value, is_called FROM idempotent_jobs.model_calls_call_id_seq"
                " UNION ALL SELECT last_value, is_called"
                " FROM idempotent_jobs.price_history_price_id_seq"
            ).fetchall()
        assert sequences == [(1, False), (1, False)]
    finally:
        _drop(server_url, name)
