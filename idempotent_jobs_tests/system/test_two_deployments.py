"""Two Dagster deployments (separate DAGSTER_HOME and Dagster storage) share one ledger and
tick the same schedule at the same moment: the ledger alone keeps the promise."""

import multiprocessing
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs_tests import workers
from idempotent_jobs_tests.conftest import admin_execute, database_conninfo
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv

pytestmark = [pytest.mark.slow, pytest.mark.dagster_instance]

SPAWN = multiprocessing.get_context("spawn")
TICK = "2026-08-08T00:00:00+00:00"  # requests the window 2026-08-07 for every subject


@pytest.fixture
def storage_databases(server_url: str) -> Iterator[list[str]]:
    names = [f"ij_dagster_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield [database_conninfo(server_url, name) for name in names]
    for name in names:
        admin_execute(
            server_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        )


def test_two_deployments_ticking_the_same_schedule(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    storage_databases: list[str],
    tmp_path: Path,
) -> None:
    (dagster_env.calls_dir / "delay").write_text("1.0")
    base = {k: v for k, v in os.environ.items() if k.startswith(("IDEMPOTENT_JOBS_", "IJ_TEST_"))}
    barrier = SPAWN.Barrier(2)
    out: multiprocessing.Queue[dict[str, Any]] = SPAWN.Queue()
    procs = []
    for name, storage in zip(("blue", "green"), storage_databases, strict=True):
        env = {**base, "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL": dagster_storage_url(storage)}
        procs.append(
            SPAWN.Process(
                target=workers.run_deployment,
                args=(name, str(tmp_path), env, TICK, barrier, out),
            )
        )
    for proc in procs:
        proc.start()
    reports = {r["deployment"]: r for r in (out.get(timeout=300) for _ in procs)}
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0

    partitions = [f"{s}|2026-08-07" for s in SUMMARY_SPEC.subjects]
    for report in reports.values():
        assert sorted(report["runs"]) == sorted(partitions)
        assert report["dagster_runs"] == len(partitions), "each deployment sees only its own runs"
        assert {r["status"] for r in report["runs"].values()} == {"SUCCESS"}
        assert {r["run_key"] for r in report["runs"].values()} == set(partitions)
    for key in partitions:
        results = sorted(report["runs"][key]["result"] for report in reports.values())
        assert results == ["new", "reused"], (key, results)
        record = ledger.get(SUMMARY_SPEC.identity_for(key).run_id)
        assert record is not None and record.status == "completed"
        assert len(operator.attempts(record.run_id)) == 1
        assert len(operator.outbox(record.run_id)) == 1
    assert dagster_env.model_calls() == len(partitions)
    assert len(dagster_env.delivered()) == len(partitions)
