"""A manual launch overlapping a scheduled run of the same partition, in two processes."""

import multiprocessing
import os
from typing import Any

import psycopg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests import workers
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC
from idempotent_jobs_tests.helpers import count
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv

pytestmark = [pytest.mark.slow, pytest.mark.dagster_instance]

SPAWN = multiprocessing.get_context("spawn")
PARTITION = "workspace-globex|2026-08-07"


def wait_for(condition: Any, what: str, tries: int = 6000) -> None:
    """Poll a condition another process will make true (checked every 10 ms, 60 s at most)."""
    import threading

    pause = threading.Event()
    for _ in range(tries):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_overlapping_runs_of_one_partition_call_the_model_once(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith(("IDEMPOTENT_JOBS_", "IJ_TEST_"))}
    run_id = SUMMARY_SPEC.identity_for(PARTITION).run_id
    dagster_env.script("slow")
    out: multiprocessing.Queue[dict[str, Any]] = SPAWN.Queue()

    scheduled = SPAWN.Process(
        target=workers.execute_partition, args=("competitor_summary", PARTITION, env, out)
    )
    scheduled.start()
    wait_for(lambda: (dagster_env.calls_dir / "started").exists(), "the first run's model call")
    [(registered_at,)] = db.execute(
        "SELECT updated_at FROM idempotent_jobs.runs WHERE run_id = %s", (run_id,)
    ).fetchall()

    manual = SPAWN.Process(
        target=workers.execute_partition, args=("competitor_summary", PARTITION, env, out)
    )
    manual.start()
    # The manual run registers the same row (bumping updated_at), then waits for the lease.
    wait_for(
        lambda: (
            db.execute(
                "SELECT updated_at > %s FROM idempotent_jobs.runs WHERE run_id = %s",
                (registered_at, run_id),
            ).fetchone()
            == (True,)
        ),
        "the second run to reach the ledger",
    )
    (dagster_env.calls_dir / "go").touch()
    results = sorted(
        (out.get(timeout=120) for _ in range(2)), key=lambda r: r["pid"] != scheduled.pid
    )
    for proc in (scheduled, manual):
        proc.join(timeout=60)

    assert [r["success"] for r in results] == [True, True]
    assert [r["persist"]["result"] for r in results] == ["new", "reused"]
    assert dagster_env.model_calls() == 1 and dagster_env.collect_calls() == 1
    assert count(db, "runs", run_id) == 1 and count(db, "notification_outbox", run_id) == 1
    assert len(dagster_env.delivered()) == 1
    assert [a.outcome for a in operator.attempts(run_id)] == ["completed"]
