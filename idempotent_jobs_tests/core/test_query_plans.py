"""The operator queries are index scans on a seeded ledger, never a scan of every run."""

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idempotent_jobs.core.executor import Executor
from idempotent_jobs_tests.conftest import admin_execute, database_conninfo

SEEDED_RUNS = 20_000

# Each operator statement with the parameters an operator's command sends.
OPERATOR_QUERIES: dict[str, dict[str, Any]] = {
    "run_ids_by_prefix": {"prefix": "3fa9c2b1d0e4"},
    "get_run": {"run_id": "f" * 64},
    "list_runs": {
        "job_name": None,
        "subject_id": None,
        "status": None,
        "since": None,
        "until": None,
        "limit": 50,
    },
    "expired_leases": {},
    "failed_past_retries": {"max_attempts": 3},
    "list_attempts": {"run_id": "f" * 64},
    "list_model_calls": {"run_id": "f" * 64},
}


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


@pytest.fixture(scope="module")
def seeded(server_url: str, template_database: str) -> Iterator[str]:
    """A database of this module's own with SEEDED_RUNS completed runs over many windows and
    subjects, five of them failed (seeded once: the tests only read)."""
    name = f"ij_plans_{uuid.uuid4().hex[:12]}"
    admin_execute(
        server_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)
        ),
    )
    conninfo = database_conninfo(server_url, name)
    with psycopg.connect(conninfo, autocommit=True) as db:
        _seed(db)
    yield conninfo
    admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


def _seed(db: psycopg.Connection) -> None:
    db.execute(
        """
        INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version,
            status, output, completed_at, lease_epoch, attempts)
        SELECT encode(sha256(g::text::bytea), 'hex'), 'job', 'subject-' || (g %% 100),
            %s::timestamptz + make_interval(hours => g / 100), 'v1', 'completed',
            '{"summary": "s"}', now(), 1, 1
        FROM generate_series(1, %s) AS g
        """,
        (datetime(2020, 1, 1, tzinfo=UTC), SEEDED_RUNS),
    )
    db.execute(
        "UPDATE idempotent_jobs.runs SET status = 'failed', output = NULL, completed_at = NULL,"
        " attempts = 3 WHERE run_id IN (SELECT run_id FROM idempotent_jobs.runs LIMIT 5)"
    )
    db.execute("ANALYZE idempotent_jobs.runs")


@pytest.mark.parametrize("name", sorted(OPERATOR_QUERIES))
def test_operator_queries_use_an_index(seeded: str, name: str) -> None:
    query = Executor(seeded).query(name)
    with psycopg.connect(seeded, autocommit=True) as conn:
        [[plan]] = conn.execute(f"EXPLAIN (FORMAT JSON) {query}", OPERATOR_QUERIES[name]).fetchall()
    nodes = _nodes(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])
    scanned = {(n["Node Type"], n.get("Relation Name")) for n in nodes if "Relation Name" in n}
    assert scanned, name
    assert all(kind != "Seq Scan" for kind, _ in scanned), (name, scanned)
