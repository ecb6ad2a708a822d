"""The closest peer side by side: DBOS Transact and ``run_idempotent``, same work, same server.

    make bench-peers      # installs the [bench] extra (dbos), then runs this

A three-step job (collect, transform, persist) doing trivial work, as a DBOS workflow of three
steps and as one ``run_idempotent`` call, measured interleaved in one process on one PostgreSQL
(each in a database of its own, created and dropped here):

- p50 of a new run, and of a reused run (the same id again: the recorded result comes back);
- throughput of 8 processes on distinct ids;
- 8 processes racing on the same ids: how often each system ran ``transform`` per id (counted
  in a table by the transform itself; the promise is exactly once).
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from bench_ledger import bench_database, header, row, tally
from dbos import DBOS, SetWorkflowID

from idempotent_jobs import RunIdentity, RunLedger, run_idempotent
from idempotent_jobs.operator.dagster_home import dagster_storage_url

COUNTED = {"url": ""}  # where transform records its calls in the race (empty: it does not)


def _count_call(system: str, run_key: str) -> None:
    if COUNTED["url"]:
        with psycopg.connect(COUNTED["url"], autocommit=True) as conn:
            conn.execute("INSERT INTO transform_calls VALUES (%s, %s)", (system, run_key))


# -- DBOS: a workflow of three steps -----------------------------------------------------------


@DBOS.step()
def dbos_collect(key: str) -> dict[str, Any]:
    return {"documents": ["d"]}


@DBOS.step()
def dbos_transform(key: str, raw: dict[str, Any]) -> dict[str, Any]:
    _count_call("dbos", key)
    return {"summary": "s"}


@DBOS.step()
def dbos_persist(key: str, output: dict[str, Any]) -> None:
    return None


@DBOS.workflow()
def dbos_job(key: str) -> dict[str, Any]:
    output = dbos_transform(key, dbos_collect(key))
    dbos_persist(key, output)
    return output


def start_dbos(url: str) -> None:
    DBOS(
        config={
            "name": "bench-peers",
            "system_database_url": dagster_storage_url(url).replace("+psycopg2", "+psycopg"),
            "log_level": "ERROR",
            "console_log_level": "ERROR",
            "run_migrations": True,
        }
    )
    DBOS.launch()


def dbos_run(key: str) -> None:
    with SetWorkflowID(key):
        dbos_job(key)


# -- run_idempotent ----------------------------------------------------------------------------


def identity(key: str) -> RunIdentity:
    n = int(key.rsplit("-", 1)[1])
    tag = key.rsplit("-", 1)[0]
    return RunIdentity(
        "peer-bench", tag, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n), "v1"
    )


def ledger_runner(ledger: RunLedger) -> Callable[[str], None]:
    def collect(ident: RunIdentity) -> dict[str, Any]:
        return {"documents": ["d"]}

    def run(key: str) -> None:
        def transform(raw: dict[str, Any]) -> dict[str, Any]:
            _count_call("ledger", key)
            return {"summary": "s"}

        run_idempotent(ledger, identity(key), collect=collect, transform=transform)

    return run


# -- measurements ------------------------------------------------------------------------------


def timed(run: Callable[[str], None], keys: list[str]) -> list[float]:
    times = []
    for key in keys:
        started = time.perf_counter()
        run(key)
        times.append(time.perf_counter() - started)
    return times


def latency(ledger_url: str, runs: int) -> None:
    with RunLedger(ledger_url, pool_min_size=1, pool_max_size=1) as ledger:
        ours = ledger_runner(ledger)
        timed(ours, [f"warm-{n}" for n in range(20)])
        timed(dbos_run, [f"warm-{n}" for n in range(20)])
        samples: dict[tuple[str, str], list[float]] = {}
        for block in range(runs // 20):
            keys = [f"lat{block}-{n}" for n in range(20)]
            for system, run in (("dbos", dbos_run), ("ledger", ours)):
                samples.setdefault((system, "new"), []).extend(timed(run, keys))
                samples.setdefault((system, "reused"), []).extend(timed(run, keys))
    for kind in ("new", "reused"):
        dbos = statistics.median(samples[("dbos", kind)])
        ours_p50 = statistics.median(samples[("ledger", kind)])
        ratio = dbos / ours_p50
        row(
            f"p50 per {kind} run: run_idempotent vs DBOS",
            f"{ours_p50 * 1e3:.2f} ms = {ratio:.1f}x faster",
            f"DBOS {dbos * 1e3:.2f} ms; target >= 10x",
            "ok" if ratio >= 10 else "MISSED",
        )


def _worker(
    system: str, urls: tuple[str, str], keys: list[str], seconds: float, barrier: Any, out: Any
) -> None:
    ledger_url, dbos_url = urls
    if system == "dbos":
        start_dbos(dbos_url)
        run: Callable[[str], None] = dbos_run
    else:
        ledger = RunLedger(ledger_url, pool_min_size=1, pool_max_size=1)
        ledger.open()
        run = ledger_runner(ledger)
    COUNTED["url"] = ledger_url if seconds == 0 else ""
    barrier.wait()
    done = 0
    deadline = time.monotonic() + seconds
    for key in keys:
        if seconds and time.monotonic() >= deadline:
            break
        try:
            run(key)
        except Exception as exc:  # a racing loser may be refused; the count says what ran
            print(f"{system}: {type(exc).__name__}: {exc}", file=sys.stderr)
        done += 1
    out.put(done)
    if system == "dbos":
        DBOS.destroy()
    else:
        ledger.close()


def _processes(
    system: str, urls: tuple[str, str], keys_of: Callable[[int], list[str]], seconds: float
) -> int:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(system, urls, keys_of(i), seconds, barrier, out))
        for i in range(8)
    ]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    return int(total)


def distinct_keys(tag: str) -> Callable[[int], list[str]]:
    """Process i's own ids (more than it can run in the time)."""
    return lambda i: [f"tp{tag}x{i}-{n}" for n in range(1_000_000)]


def racing_keys(keys: list[str]) -> Callable[[int], list[str]]:
    """The same ids for every process, half of them walking the list backwards."""
    return lambda i: keys if i % 2 == 0 else keys[::-1]


def throughput(urls: tuple[str, str], seconds: float) -> None:
    rates = {}
    for system in ("dbos", "ledger"):
        done = _processes(system, urls, distinct_keys(uuid.uuid4().hex[:6]), seconds)
        rates[system] = done / seconds
    ratio = rates["ledger"] / rates["dbos"]
    row(
        "8 processes, distinct ids: runs/s",
        f"{rates['ledger']:,.0f}/s = {ratio:.1f}x",
        f"DBOS {rates['dbos']:,.0f}/s; no target",
        "-",
    )


def race(urls: tuple[str, str], ids: int) -> None:
    ledger_url = urls[0]
    with psycopg.connect(ledger_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS transform_calls (system text, run_key text)")
    for system in ("dbos", "ledger"):
        _processes(system, urls, racing_keys([f"race-{n}" for n in range(ids)]), 0)
    with psycopg.connect(ledger_url, autocommit=True) as conn:
        counts: dict[str, str] = dict(
            conn.execute(
                "SELECT system, count(*) FILTER (WHERE n = 1)::text || ' of ' || count(*)"
                " || ' ids once, most ' || max(n) FROM (SELECT system, run_key, count(*) AS n"
                " FROM transform_calls GROUP BY 1, 2) AS per_id GROUP BY system"
            ).fetchall()
        )
    for system in ("ledger", "dbos"):
        verdict = counts.get(system, "")
        row(
            f"8-way race on {ids} ids: transform per id ({system})",
            verdict or "no calls",
            "target: every id exactly once",
            "ok" if verdict.startswith(f"{ids} of {ids} ") else "MISSED",
        )


@contextmanager
def two_databases() -> Iterator[tuple[str, str]]:
    with bench_database() as ledger_url, bench_database() as dbos_url:
        yield ledger_url, dbos_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = parser.parse_args(argv)
    header()
    with two_databases() as urls:
        start_dbos(urls[1])
        try:
            latency(urls[0], 100 if args.quick else 400)
        finally:
            DBOS.destroy()
        throughput(urls, 3.0 if args.quick else 10.0)
        race(urls, 20 if args.quick else 100)
    tally()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DBOS__CONSOLE_LOG_LEVEL", "ERROR")
    sys.exit(main())
