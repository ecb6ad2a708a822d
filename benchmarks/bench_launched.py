"""Launched runs and backfills through a real Dagster instance: what the ledger adds to them.

    make bench            # runs this after bench_ledger.py
    .venv/bin/python benchmarks/bench_launched.py [--quick]

The baseline is the same four ops doing the same trivial work without the ledger
(``launched_defs.baseline_job``), measured in the same run, interleaved where it can be:

- one partition launched as the UI launches it (the run queue daemon dequeues it, Dagster's
  default run launcher starts a run worker process) until the run succeeds;
- a backfill of many partitions through the backfill and run-queue daemons' iterations, the
  runs executed by the daemon's process (a launcher that runs them in process), so that the
  figure is the daemons' and the jobs' work rather than 200 process starts;
- the same backfill again: every run is reused, no model call is made.

Uses IDEMPOTENT_JOBS_DATABASE_URL's server (else the embedded one), in a database of its own.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import psycopg

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))  # the bench's code location and testkit

from bench_ledger import bench_database, header, row, tally  # noqa: E402

from idempotent_jobs.core.database import DATABASE_URL_ENV  # noqa: E402
from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV, dagster_storage_url  # noqa: E402
from testkit.dagster_harness import (  # noqa: E402
    DagsterTestEnv,
    dagster_instance,
    launch_backfill,
    launch_partition,
    run_backfill_daemon,
    workspace,
)

LOCATION_MODULE = "benchmarks.launched_defs"
LEDGER_JOB, BASELINE_JOB = "bench_ledger_job", "bench_baseline_job"
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def partition(day: int) -> str:
    return f"bench|{date(2025, 1, 1) + timedelta(days=day):%Y-%m-%d}"


def launch_to_success(instance: dg.DagsterInstance, context: object, job: str, key: str) -> float:
    """Seconds from the Launchpad's launch to the run's success (polled every 20 ms)."""
    started = time.perf_counter()
    run_id = launch_partition(context, job, key)  # type: ignore[arg-type]
    while True:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.status in TERMINAL:
            break
        time.sleep(0.02)
    elapsed = time.perf_counter() - started
    assert run.status == dg.DagsterRunStatus.SUCCESS, f"{job} {key}: {run.status}"
    return elapsed


def launched_runs(env: DagsterTestEnv, rounds: int) -> None:
    with (
        dagster_instance(env, sync_launcher=False) as instance,
        workspace(instance, LOCATION_MODULE) as context,
    ):
        launch_to_success(instance, context, BASELINE_JOB, partition(0))  # warm the code server
        ledger: list[float] = []
        baseline: list[float] = []
        for n in range(1, rounds + 1):
            first, second = (LEDGER_JOB, BASELINE_JOB) if n % 2 else (BASELINE_JOB, LEDGER_JOB)
            for job in (first, second):
                seconds = launch_to_success(instance, context, job, partition(n))
                (ledger if job == LEDGER_JOB else baseline).append(seconds)
    with_ledger, without = statistics.median(ledger), statistics.median(baseline)
    added = with_ledger / without - 1
    row(
        "launched run, launch -> success (median)",
        f"{with_ledger:.2f} s = {added:+.1%}",
        f"no ledger {without:.2f} s; target <= +2%",
        "ok" if added <= 0.02 else "MISSED",
    )
    row(
        "  range over rounds, with / without the ledger",
        f"{min(ledger):.2f}-{max(ledger):.2f} s",
        f"{min(baseline):.2f}-{max(baseline):.2f} s",
        "-",
    )


def model_calls(url: str) -> int:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT count(*) FROM idempotent_jobs.model_calls").fetchone()
    assert found is not None
    return int(found[0])


def backfill_seconds(context: object, job: str, keys: list[str]) -> float:
    started = time.perf_counter()
    backfill_id = launch_backfill(context, job, keys)  # type: ignore[arg-type]
    run_backfill_daemon(context, backfill_id)  # type: ignore[arg-type]
    return time.perf_counter() - started


def backfills(env: DagsterTestEnv, url: str, size: int) -> None:
    keys = [partition(100 + n) for n in range(size)]
    with (
        dagster_instance(env, sync_launcher=True) as instance,
        workspace(instance, LOCATION_MODULE) as context,
    ):
        backfill_seconds(context, BASELINE_JOB, [partition(99)])  # warm up
        before = backfill_seconds(context, BASELINE_JOB, keys)
        calls = model_calls(url)
        first = backfill_seconds(context, LEDGER_JOB, keys)
        first_calls = model_calls(url) - calls
        after = backfill_seconds(context, BASELINE_JOB, keys)
        second = backfill_seconds(context, LEDGER_JOB, keys)
        second_calls = model_calls(url) - calls - first_calls
    baseline = (before + after) / 2
    slower = first / baseline - 1
    row(
        f"backfill of {size} partitions through the daemons",
        f"{first:.1f} s = {slower:+.1%}",
        f"no ledger {before:.1f} s, {after:.1f} s; target <= +5%",
        "ok" if slower <= 0.05 else "MISSED",
    )
    row(
        "  model calls in that backfill",
        f"{first_calls}",
        f"target {size} (one per partition)",
        "ok" if first_calls == size else "MISSED",
    )
    row(
        "  the same backfill again (every run reused)",
        f"{second:.1f} s, {second_calls} model calls",
        "target 0 model calls",
        "ok" if second_calls == 0 else "MISSED",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = parser.parse_args(argv)
    header()
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ[DATABASE_URL_ENV] = url
        os.environ[DAGSTER_STORAGE_URL_ENV] = dagster_storage_url(url)
        env = DagsterTestEnv(database=url, tmp_path=Path(tmp))
        launched_runs(env, 2 if args.quick else 10)
        backfills(env, url, 20 if args.quick else 200)
    tally()
    return 0


if __name__ == "__main__":
    sys.exit(main())
