"""The operator queries are index scans on a seeded ledger, never a scan of every run."""

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.sql import Face, face_statements
from idempotent_jobs_tests.conftest import admin_execute, copy_of_template, database_conninfo

SEEDED_RUNS = 20_000
# A run deep in the listing (seeded runs are numbered; their ids are sha256 of the number).
DEEP_RUN = hashlib.sha256(b"5000").hexdigest()
NEWEST_50 = {
    "job_name": None,
    "subject_id": None,
    "status": None,
    "since": None,
    "until": None,
    "limit": 50,
    "after": None,
}

# Each operator statement with the parameters an operator's command sends.
OPERATOR_QUERIES: dict[str, dict[str, Any]] = {
    "run_ids_by_prefix": {"prefix": "3fa9c2b1d0e4"},
    "get_run": {"run_id": "f" * 64},
    "list_runs": NEWEST_50,
    "list_runs --status failed": {**NEWEST_50, "status": "failed"},
    "list_runs --after": {**NEWEST_50, "after": DEEP_RUN},
    "expired_leases": {"limit": 101},
    "failed_past_retries": {"max_attempts": 3, "limit": 101},
    "stale_outbox": {"older_than_seconds": 300.0, "limit": 101},
    "prune_batch": {
        "job_name": "job",
        "after_subject": "subject-50",
        "after_scheduled_at": datetime(2020, 1, 1, tzinfo=UTC),
        "after_version": "v1",
        "batch_size": 5000,
        **dict.fromkeys(
            ("raw_input_before", "output_before", "attempts_before", "payloads_before"),
            datetime(2030, 1, 1, tzinfo=UTC),
        ),
        "apply": False,
    },
    "list_attempts": {"run_id": "f" * 64},
    "list_model_calls": {"run_id": "f" * 64},
    # `runs stats`, `prices list` and `runs show`: today's (the last day's) calls only, or one
    # run's, whatever the history; budgets read their counter rows, never the calls.
    "spend_by_job": {"day": None},
    "price_matches": {"days": 1},
    "call_costs": {"run_id": DEEP_RUN},
    "budget_standings": {"job_name": "job", "subject_id": "s"},
}
# Tables of a few rows each (budgets, prices, the currency): scanned whole, as they should.
SMALL_TABLES = {
    "budgets",
    "model_prices",
    "price_history",
    "ledger_currency",
    "spend_budgets",
    "budget_counters",
}


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


@pytest.fixture(scope="module")
def seeded(server_url: str, template_database: str) -> Iterator[str]:
    """A database of this module's own with SEEDED_RUNS completed runs over many windows and
    subjects, five of them failed (seeded once: the tests only read)."""
    name = copy_of_template(server_url, template_database, "ij_plans")
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
    # One model call per run, a call every 30 seconds back from now: a week of calls, of which
    # today's are a small slice.
    db.execute(
        """
        INSERT INTO idempotent_jobs.model_calls (run_id, lease_epoch, revision, worker_id,
            model_name, input_tokens, output_tokens, outcome, called_at)
        SELECT run_id, 1, 0, 'w', 'm', 100, 10, 'accepted',
            now() - make_interval(secs => 30 * row_number() OVER (ORDER BY run_id))
        FROM idempotent_jobs.runs
        """
    )
    db.execute("ANALYZE idempotent_jobs.runs")
    db.execute("ANALYZE idempotent_jobs.model_calls")


def _plan(conninfo: str, name: str, analyze: bool = False) -> list[dict[str, Any]]:
    name = name.split()[0]
    face: Face = "admin" if name in face_statements("admin") else "worker"
    query = Executor(LedgerSettings(conninfo), face).query(name)
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        [[plan]] = conn.execute(f"EXPLAIN ({options}) {query}", OPERATOR_QUERIES[name]).fetchall()
    return _nodes(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])


@pytest.mark.parametrize("name", sorted(OPERATOR_QUERIES))
def test_operator_queries_use_an_index(seeded: str, name: str) -> None:
    nodes = _plan(seeded, name)
    scanned = {(n["Node Type"], n.get("Relation Name")) for n in nodes if "Relation Name" in n}
    assert scanned, name
    scans = [table for kind, table in scanned if kind == "Seq Scan"]
    assert set(scans) <= SMALL_TABLES, (name, scanned)


def test_a_deep_page_starts_at_its_cursor(seeded: str) -> None:
    """Keyset, not OFFSET: the page after a run 15,000 rows down the listing reads about a
    page of rows, not the 15,000 before it."""
    nodes = _plan(seeded, "list_runs --after", analyze=True)
    runs_read = sum(
        n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)
        for n in nodes
        if n.get("Relation Name") == "runs"
    )
    assert 50 <= runs_read <= 200, runs_read
