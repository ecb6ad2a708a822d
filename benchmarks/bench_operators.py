"""The operator commands against a ledger of a million completed runs.

    make bench            # runs this after bench_ledger.py
    .venv/bin/python benchmarks/bench_operators.py [--runs N]

Fills a database of its own with N runs (default 1,000,000) by bulk insert, each with its
attempt and its delivered notification, 90% of them completed 400 days ago, about 0.1% failed and
a few with expired leases; then times what an operator runs: the database time of each command's
statements (the median of repeats, through the ledger) and the wall time of the whole CLI
process; then prunes the old 90%'s payloads while new runs are claimed beside it.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from bench_ledger import COUNTS, CountingAdmin, bench_database, header, row, tally

from idempotent_jobs import RunIdentity, RunLedger
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.health import ledger_findings
from idempotent_jobs.core.retention import RetentionPolicy, prune

CLI = str(Path(sys.executable).with_name("idempotent-jobs"))
DB_TARGET_MS, WALL_TARGET_S = 20.0, 0.4

FILL = [
    # Jobs x subjects x hourly windows; run ids are sha256 of the row number.
    """
    INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version,
        status, raw_input, output, lease_epoch, attempts, created_at, updated_at, completed_at,
        input_fingerprint, config_fingerprint, config_parts)
    SELECT encode(sha256(g::text::bytea), 'hex'), 'job-' || (g %% 5),
        'subject-' || (g / 5 %% 1000), %(start)s::timestamptz + make_interval(hours => g / 5000),
        'v1', 'completed',
        jsonb_build_object('subject', 'subject-' || (g / 5 %% 1000), 'documents',
            jsonb_build_array('a document of the window, a sentence or two long')),
        '{"summary": "what happened in this window, in one sentence"}', 1, 1, t.at, t.at, t.at,
        md5(g::text), md5('config'), '{"model": "m", "prompt": "p"}'
    FROM generate_series(1, %(runs)s) AS g,
        -- nine in ten completed long ago (what a retention policy prunes), the rest just now
        LATERAL (SELECT now() - CASE WHEN g %% 10 = 0 THEN interval '0'
                                     ELSE interval '400 days' END AS at) AS t
    """,
    """
    INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, caller_run_id,
        caller_step, started_at, ended_at, outcome, model_name, input_tokens, output_tokens)
    SELECT run_id, 1, 'worker', 'dagster-run', 'collect', completed_at, completed_at,
        'completed', 'm', 120, 30
    FROM idempotent_jobs.runs
    """,
    """
    INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at,
        delivered_at, delivery_attempts)
    SELECT run_id, 'report_file', output, completed_at, completed_at, 1
    FROM idempotent_jobs.runs
    """,
    # 0.1% failed past their retries, and 20 runs whose holder died.
    """
    UPDATE idempotent_jobs.runs SET status = 'failed', output = NULL, completed_at = NULL,
        attempts = 3, last_error = 'TimeoutError: the model did not answer'
    WHERE run_id IN (SELECT encode(sha256(g::text::bytea), 'hex')
                     FROM generate_series(1, %(runs)s, 1000) AS g)
    """,
    """
    UPDATE idempotent_jobs.runs SET status = 'running', output = NULL, completed_at = NULL,
        lease_owner = 'dead-worker', lease_epoch = 2, lease_expires_at = now() - interval '1 h'
    WHERE run_id IN (SELECT encode(sha256(g::text::bytea), 'hex')
                     FROM generate_series(7, %(runs)s, %(runs)s / 20) AS g)
    """,
]


def fill(url: str, runs: int) -> None:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for statement in FILL:
            conn.execute(statement, {"runs": runs, "start": datetime(2015, 1, 1, tzinfo=UTC)})
        conn.execute("VACUUM ANALYZE")
    seconds = time.perf_counter() - started
    row(
        f"fill {runs:,} runs (+ attempts, notifications)",
        f"{seconds:.1f} s",
        "target <= 120 s",
        "ok" if seconds <= 120 else "MISSED",
    )


def database_ms(ledger: CountingAdmin, command: Callable[[], object], repeats: int = 15) -> float:
    """Median milliseconds spent in the command's statements (round trips included)."""
    samples = []
    for _ in range(repeats):
        before = COUNTS["seconds"]
        command()
        samples.append((COUNTS["seconds"] - before) * 1e3)
    return statistics.median(samples)


def wall_seconds(url: str, argv: list[str], repeats: int = 5) -> float:
    """Median wall time of the whole CLI process (start-up, connect, queries, output)."""
    env = {**os.environ, "IDEMPOTENT_JOBS_DATABASE_URL": url}
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([CLI, *argv], env=env, capture_output=True, text=True)
        samples.append(time.perf_counter() - started)
        assert done.returncode in (0, 1), done.stderr  # doctor exits 1 on the planted problems
    return statistics.median(samples)


def operator_commands(url: str, runs: int) -> None:
    with psycopg.connect(url) as conn:
        # The newest run's id; commands address it by a 12-hex prefix.
        found = conn.execute(
            "SELECT run_id FROM idempotent_jobs.runs ORDER BY scheduled_at DESC LIMIT 1"
        ).fetchone()
    assert found is not None
    prefix = str(found[0])[:12]
    ledger = CountingAdmin(url)

    def show() -> None:
        run_id = ledger.resolve_run_id(prefix)
        ledger.get(run_id)
        ledger.attempts(run_id)
        ledger.model_calls(run_id)
        ledger.outbox(run_id)
        ledger.revisions(run_id)

    def page_two() -> None:
        first = ledger.list_runs(limit=50)
        ledger.list_runs(limit=50, after=first[-1].run_id)

    commands: list[tuple[str, Callable[[], object], list[str]]] = [
        (f"runs show {prefix}", show, ["runs", "show", prefix]),
        (
            "runs list (newest 50)",
            lambda: ledger.list_runs(limit=50),
            ["runs", "list", "--limit", "50"],
        ),
        (
            "runs list --status failed",
            lambda: ledger.list_runs(status="failed", limit=50),
            ["runs", "list", "--status", "failed", "--limit", "50"],
        ),
        ("runs list, two pages (--after)", page_two, []),
        (
            "doctor",
            lambda: ledger_findings(ledger, outbox_older_than_seconds=300, max_attempts=3),
            ["doctor"],
        ),
    ]
    with ledger:
        for name, command, argv in commands:
            millis = database_ms(ledger, command)
            row(
                f"{name}: database time",
                f"{millis:.2f} ms",
                f"{runs:,} runs; target <= {DB_TARGET_MS:g} ms",
                "ok" if millis <= DB_TARGET_MS else "MISSED",
            )
            if argv:
                wall = wall_seconds(url, argv)
                row(
                    f"{name}: whole command",
                    f"{wall:.2f} s",
                    f"target <= {WALL_TARGET_S:g} s",
                    "ok" if wall <= WALL_TARGET_S else "MISSED",
                )


def prune_while_claiming(url: str, runs: int) -> None:
    """Dry run, then apply, a policy that lets go of 90% of the payloads, job by job, while a
    thread claims and completes new runs of the same jobs: how fast batches go, how long the
    longest took, and the longest claim meanwhile."""
    policy = RetentionPolicy.of_days(raw_input=30, output=30, attempts=30, delivered_payloads=30)
    jobs = [f"job-{n}" for n in range(5)]
    stop = threading.Event()
    claims: list[float] = []

    def claim_new_runs() -> None:
        with RunLedger(url, pool_min_size=1, pool_max_size=1) as live:
            n = 0
            while not stop.is_set():
                began = time.perf_counter()
                live.begin(
                    RunIdentity(
                        jobs[n % 5],
                        "live",
                        datetime(2027, 1, 1, tzinfo=UTC) + timedelta(hours=n),
                        "v1",
                    ),
                    "live-worker",
                    60,
                )
                claims.append(time.perf_counter() - began)
                n += 1

    with LedgerAdmin(url) as ledger:
        now = ledger.database_now()
        started = time.perf_counter()
        dry = [prune(ledger, job, policy, now=now) for job in jobs]
        dry_seconds = time.perf_counter() - started
        claimer = threading.Thread(target=claim_new_runs)
        claimer.start()
        applied = [prune(ledger, job, policy, apply=True, now=now) for job in jobs]
        stop.set()
        claimer.join()
    payloads = sum(r.parts["raw_input"].rows for r in applied)
    rows = sum(r.rows for r in applied)
    size = sum(r.bytes for r in applied)
    batches = sum(r.batches for r in applied)
    seconds = sum(r.seconds for r in applied)
    agree = [r.rows for r in dry] == [r.rows for r in applied]
    row(
        f"prune {payloads:,} runs' payloads ({rows:,} rows)",
        f"{seconds:.1f} s, {batches / seconds:.1f} batches/s",
        f"{size / 1e6:,.0f} MB; batches of 5,000 runs",
        "-",
    )
    row(
        "  longest batch (its locks are held this long)",
        f"{max(r.longest_batch_seconds for r in applied) * 1e3:.0f} ms",
        "no target",
        "-",
    )
    row(
        "  longest claim of a new run meanwhile",
        f"{max(claims) * 1e3:.1f} ms",
        f"{len(claims):,} claims, p50 {statistics.median(claims) * 1e3:.2f} ms",
        "-",
    )
    row(
        "  dry run first: same counts",
        f"{dry_seconds:.1f} s",
        "target: the dry run counts what the apply prunes",
        "ok" if agree else "MISSED",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs to fill the ledger with")
    args = parser.parse_args(argv)
    header()
    with bench_database() as url:
        fill(url, args.runs)
        operator_commands(url, args.runs)
        prune_while_claiming(url, args.runs)
    tally()
    return 0


if __name__ == "__main__":
    sys.exit(main())
