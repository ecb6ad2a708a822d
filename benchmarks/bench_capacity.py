"""A capacity model of one ledger PostgreSQL, measured here (docs/deployment.md quotes it).

    make bench-capacity     # or: .venv/bin/python benchmarks/bench_capacity.py [--quick]

1. New logical runs per second (each one claim, one checkpoint and one completion with its
   outbox row) with N worker processes, directly and through PgBouncer 1.18 in transaction
   mode; and reused runs per second (a scheduler's rerun of a completed run).
2. Connections: what one worker process holds, and what the server sees with and without
   PgBouncer.
3. Bytes per run, table by table (rows and indexes), at stated payload sizes, before and after
   retention prunes the payloads: what stays forever and what goes.
4. What follows for one server: runs a day, and the size of a year of them.

Uses IDEMPOTENT_JOBS_DATABASE_URL's server (else the embedded one), in a database of its own.
"""

import argparse
import base64
import multiprocessing
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from idempotent_jobs import RunIdentity, RunLedger, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.retention import RetentionPolicy, prune
from idempotent_jobs.operator.embedded import database_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_ledger import bench_database  # noqa: E402 - a database of its own, dropped after

from testkit.pgbouncer import PgBouncer  # noqa: E402

# Payload sizes of the storage figures: a collected input of ~2 KB, an answer of ~500 B, a
# notification of ~500 B (yours differ: the row sizes below scale with them). Random text, so
# PostgreSQL's compression does not make them look smaller than prose would be.
RAW = {"documents": [base64.b64encode(os.urandom(300)).decode() for _ in range(5)]}
OUTPUT = {"summary": base64.b64encode(os.urandom(375)).decode()}
TABLES = ("runs", "run_attempts", "model_calls", "notification_outbox", "run_revisions")


def ident(tag: str, n: int) -> RunIdentity:
    return RunIdentity("capacity", tag, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n), "v1")


def _worker(url: str, tag: str, reuse: bool, seconds: float, start: Any, out: Any) -> None:
    with RunLedger(url, pool_min_size=1, pool_max_size=2) as ledger:
        n = 0
        if reuse:  # the runs to rerun, completed before the clock starts
            for i in range(200):
                run_idempotent(
                    ledger, ident(tag, i), collect=lambda _: RAW, transform=lambda _: OUTPUT
                )
        start.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            run_idempotent(
                ledger,
                ident(tag, n % 200 if reuse else n),
                collect=lambda _: RAW,
                transform=lambda _: OUTPUT,
                notifications=lambda o: {"hook": o},
            )
            n += 1
    out.put(n)


def rate(url: str, processes: int, reuse: bool, seconds: float) -> tuple[float, int]:
    """Runs per second over ``processes`` workers, and the server connections seen meanwhile."""
    ctx = multiprocessing.get_context("forkserver")
    start, out = ctx.Event(), ctx.Queue()
    tag = uuid.uuid4().hex[:8]
    workers = [
        ctx.Process(target=_worker, args=(url, f"{tag}-{i}", reuse, seconds, start, out))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(1.0 + (2.0 if reuse else 0.0))  # pools open (and reruns prepared)
    start.set()
    time.sleep(seconds / 2)
    dbname = conninfo_to_dict(url).get("dbname")
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = "
            "'client backend'",
            (dbname,),
        ).fetchone()
    total = sum(out.get(timeout=seconds + 120) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    return total / seconds, int(row[0]) if row else 0


ADMIN_URL = ""


def throughput(url: str, bouncer: PgBouncer, seconds: float, counts: list[int]) -> None:
    dbname = str(conninfo_to_dict(url)["dbname"])
    pooled = bouncer.url(dbname)
    print("\n1-2. runs per second and server connections, by worker processes")
    print(
        f"{'processes':>9} {'new direct':>11} {'new pgb':>9} {'reused direct':>14} "
        f"{'reused pgb':>11} {'conns direct':>13} {'per worker':>11} {'conns pgb':>10}"
    )
    for n in counts:
        new_direct, conns_direct = rate(url, n, False, seconds)
        new_pooled, conns_pooled = rate(pooled, n, False, seconds)
        reused_direct, _ = rate(url, n, True, seconds)
        reused_pooled, _ = rate(pooled, n, True, seconds)
        print(
            f"{n:>9} {new_direct:>11.0f} {new_pooled:>9.0f} {reused_direct:>14.0f} "
            f"{reused_pooled:>11.0f} {conns_direct:>13} {conns_direct / n:>11.1f} "
            f"{conns_pooled:>10}",
            flush=True,
        )


def sizes(conn: psycopg.Connection) -> dict[str, tuple[int, int]]:
    found = {}
    for table in TABLES:
        row = conn.execute(
            "SELECT pg_table_size(%s), pg_indexes_size(%s)",
            (f"idempotent_jobs.{table}", f"idempotent_jobs.{table}"),
        ).fetchone()
        assert row is not None
        found[table] = (int(row[0]), int(row[1]))
    return found


def storage(url: str, runs: int) -> dict[str, float]:
    print(f"\n3. bytes per run ({runs} runs; raw input ~2 KB, output and notification ~500 B)")
    with psycopg.connect(url, autocommit=True) as conn, RunLedger(url) as ledger:
        conn.execute("VACUUM FULL")
        before = sizes(conn)
        for n in range(runs):
            run_idempotent(
                ledger,
                ident("size", n),
                collect=lambda _: RAW,
                transform=lambda _: OUTPUT,
                notifications=lambda o: {"hook": o},
            )
        while ledger.deliver_outbox(lambda row: None, limit=1000).delivered:
            pass
        conn.execute("VACUUM FULL")
        kept = sizes(conn)
        for statement in (
            "UPDATE idempotent_jobs.runs SET completed_at = completed_at - interval '400 days'",
            "UPDATE idempotent_jobs.run_attempts SET ended_at = ended_at - interval '400 days'",
            "UPDATE idempotent_jobs.notification_outbox"
            " SET delivered_at = delivered_at - interval '400 days'",
        ):
            conn.execute(statement.encode())
        policy = RetentionPolicy.of_days(
            raw_input=30, output=30, attempts=30, delivered_payloads=30
        )
        with LedgerAdmin.beside(ledger) as admin:
            prune(admin, "capacity", policy, apply=True)
        conn.execute("VACUUM FULL")
        pruned = sizes(conn)
    per_run: dict[str, float] = {}
    print(f"{'table':<22} {'rows+toast':>11} {'indexes':>9} {'after prune':>12}")
    for table in TABLES:
        rows = (kept[table][0] - before[table][0]) / runs
        index = (kept[table][1] - before[table][1]) / runs
        after = (pruned[table][0] + pruned[table][1] - before[table][0] - before[table][1]) / runs
        per_run[table], per_run[table + ":pruned"] = rows + index, after
        print(f"{table:<22} {rows:>11.0f} {index:>9.0f} {after:>12.0f}")
    total = sum(per_run[t] for t in TABLES)
    forever = sum(per_run[t + ":pruned"] for t in TABLES)
    print(f"{'total':<22} {total:>21.0f} {forever:>12.0f}")
    return {"within_retention": total, "forever": forever}


def main(argv: list[str] | None = None) -> int:
    global ADMIN_URL
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = parser.parse_args(argv)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["idempotent_jobs"])
    ADMIN_URL = os.environ.get("IDEMPOTENT_JOBS_DATABASE_URL") or database_url()
    seconds = 2.0 if args.quick else 6.0
    counts = [1, 4] if args.quick else [1, 2, 4, 8, 16]
    with bench_database() as url, PgBouncer(url) as bouncer:
        print(
            f"server: PostgreSQL {psycopg.connect(url).info.server_version}, "
            f"{os.cpu_count()} cores shared by the workers and the server"
        )
        throughput(url, bouncer, seconds, counts)
    with bench_database() as url:  # a fresh one: nothing but the runs measured
        print(
            "\n2. a worker process: one pool of pool_min_size..pool_max_size connections "
            "(defaults 1..4; a step uses at most 2: its statement and the heartbeat)"
        )
        bytes_per_run = storage(url, 500 if args.quick else 5000)
    print("\n4. one server, from the figures above")
    print(
        f"   bytes per run within retention: {bytes_per_run['within_retention']:.0f}; "
        f"kept forever after it: {bytes_per_run['forever']:.0f}"
    )
    for per_day in (10_000, 100_000, 1_000_000):
        year = per_day * 365 * bytes_per_run["forever"] / 1e9
        window = per_day * 30 * bytes_per_run["within_retention"] / 1e9
        print(
            f"   {per_day:>9,} runs/day: {window:7.1f} GB in a 30-day window, "
            f"+{year:6.1f} GB of run records a year"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
