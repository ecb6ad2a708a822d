"""``estimate`` at 10^4, 10^5 and 10^6 partitions: time per partition as a ratio of the smallest
size's (linear: about 1), and the process's peak memory after each size.

    make bench            # runs this after bench_operators.py
    .venv/bin/python benchmarks/bench_estimate.py [--largest 1000000]

The job has 100 subjects and hourly windows; the ledger holds a history of accepted runs and,
for each size, a sixth of its partitions completed (registered by bulk insert).
"""

import argparse
import resource
import sys
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import psycopg
from bench_ledger import bench_database, header, row, tally

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.operator.estimate import estimate

SUBJECTS = [f"subject-{n:03d}" for n in range(100)]
TARGET_SECONDS = 10.0


def _spec(windows: int) -> IdempotentJobSpec:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(hours=windows)
    return IdempotentJobSpec(
        name="estimated",
        identity_job_name="estimated",
        version="v1",
        window=dg.HourlyPartitionsDefinition(start_date=start.strftime("%Y-%m-%d-%H:%M")),
        subjects=SUBJECTS,
    )


def _complete_some(url: str, spec: IdempotentJobSpec, keys: list[tuple[str, datetime]]) -> None:
    """A sixth of the partitions completed, each with its accepted call (the history)."""
    from idempotent_jobs.core.identity import RunIdentity

    rows = [
        (RunIdentity("estimated", s, start, "v1").run_id, s, start)
        for i, (_, start) in enumerate(keys)
        for j, s in enumerate(SUBJECTS)
        if (i * len(SUBJECTS) + j) % 6 == 0
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE idempotent_jobs.runs CASCADE")
        with conn.cursor().copy(
            "COPY idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version,"
            " status, lease_epoch, attempts, completed_at, output) FROM STDIN"
        ) as copy:
            done = '{"summary": "s"}'
            for run_id, subject, start in rows:
                copy.write_row(
                    (run_id, "estimated", subject, start, "v1", "completed", 1, 1, start, done)
                )
        conn.execute(
            "INSERT INTO idempotent_jobs.model_calls (run_id, lease_epoch, revision, worker_id,"
            " model_name, input_tokens, output_tokens, outcome)"
            " SELECT run_id, 1, 0, 'w', 'm', 900 + (hashtext(run_id) & 255), 100, 'accepted'"
            " FROM idempotent_jobs.runs LIMIT 1000"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--largest", type=int, default=1_000_000, help="partitions, at most")
    args = parser.parse_args(argv)
    header()
    sizes = [n for n in (10_000, 100_000, 1_000_000) if n <= args.largest]
    per_partition: dict[int, float] = {}
    with bench_database() as url:
        with LedgerAdmin(url) as admin:
            admin.set_price("m", "2.5", "10", effective_from=datetime(2020, 1, 1, tzinfo=UTC))
            for size in sizes:
                spec = _spec(size // len(SUBJECTS))
                windows = spec.window.get_partition_keys()[-(size // len(SUBJECTS)) :]
                starts = [(w, spec.window.time_window_for_partition_key(w).start) for w in windows]
                _complete_some(url, spec, starts)
                started = time.perf_counter()
                result = estimate(admin, spec, windows[0], windows[-1])
                seconds = time.perf_counter() - started
                per_partition[size] = seconds / result.partitions
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                ratio = per_partition[size] / per_partition[sizes[0]]
                row(
                    f"estimate, {result.partitions:,} partitions ({result.done:,} done)",
                    f"{seconds:.2f} s, x{ratio:.2f} per partition",
                    f"peak RSS {peak:.0f} MB; target under {TARGET_SECONDS:.0f} s",
                    "ok" if seconds < TARGET_SECONDS else "MISSED",
                )
    tally()
    return 0


if __name__ == "__main__":
    sys.exit(main())
