"""What the ledger costs, as ratios against baselines measured in the same run, same database.

    make bench            # or: .venv/bin/python benchmarks/bench_ledger.py [--quick]

Uses IDEMPOTENT_JOBS_DATABASE_URL's server (else the embedded one), in a database of its own
that it drops afterwards. Every figure is printed next to its baseline and the target.
"""

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idempotent_jobs import RunIdentity, RunLedger, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.operator.embedded import database_url

ROWS: list[tuple[str, str, str, str]] = []


def header() -> None:
    print(f"{'measure':<52} {'value':>22}   {'baseline / target':<34} verdict")


def tally() -> None:
    """The last line of every benchmark: how many targets its rows met and missed."""
    missed = [r for r in ROWS if r[3].startswith("MISSED")]
    met = [r for r in ROWS if r[3] == "ok"]
    print(f"{len(met)} targets met, {len(missed)} missed")


def row(name: str, value: str, baseline: str, verdict: str) -> None:
    ROWS.append((name, value, baseline, verdict))
    print(f"{name:<52} {value:>22}   {baseline:<34} {verdict}", flush=True)


def ident(tag: str, n: int, job: str = "bench") -> RunIdentity:
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=n)
    return RunIdentity(job, tag, start, "v1")


COUNTS = {"statements": 0.0, "seconds": 0.0}
STATEMENT_TIMES: dict[tuple[str, str], list[float]] = {}
LABEL = ["warm"]


def _counted(started: float, statements: int) -> None:
    COUNTS["statements"] += statements
    COUNTS["seconds"] += time.perf_counter() - started


class CountingExecutor(Executor):
    """Counts statements (each is one round trip) and times them and every delivery
    transaction, in the module-level ``COUNTS``; and each statement by name, under the label
    a benchmark sets (``LABEL[0]``), in ``STATEMENT_TIMES``: where a difference between two
    kinds of call is."""

    def fetch(self, name: str, params: Any, row_factory: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().fetch(name, params, row_factory)
        finally:
            _counted(started, 1)
            took = time.perf_counter() - started
            STATEMENT_TIMES.setdefault((LABEL[0], name), []).append(took)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        # A delivery transaction, including the channel's send (a local file write here).
        started = time.perf_counter()
        with super().transaction() as conn:
            yield conn
        _counted(started, 0)


class Counted(LedgerFace):
    """A face of the ledger whose statements are counted, and whose pool's opening and closing
    are timed too. Kept in the module-level ``COUNTS`` (Dagster copies resources, so not on the
    instance)."""

    executor_class = CountingExecutor

    def open(self) -> None:
        started = time.perf_counter()
        super().open()
        _counted(started, 0)

    def close(self) -> None:
        started = time.perf_counter()
        super().close()
        _counted(started, 0)

    @property
    def stats(self) -> dict[str, float]:
        return COUNTS


class CountingLedger(Counted, RunLedger):
    """The worker face, counted."""


class CountingAdmin(Counted, LedgerAdmin):
    """The operator face, counted."""


_REGISTER = (
    "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING"
)


def register(target: str | psycopg.Connection, identities: list[RunIdentity]) -> None:
    """Create the runs' rows unclaimed, one statement each, as a first ``begin`` would before
    its claim (the benchmarks' set-up: the ledger registers a run only while claiming it).
    ``target``: a URL, or an autocommit connection to reuse."""
    rows = [(i.run_id, i.job_name, i.subject_id, i.scheduled_at, i.version) for i in identities]
    if isinstance(target, psycopg.Connection):
        target.cursor().executemany(_REGISTER, rows)
        return
    with psycopg.connect(target, autocommit=True) as conn:
        conn.cursor().executemany(_REGISTER, rows)


_NEXT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
# PostgreSQL 18 moved WAL sync counts from pg_stat_wal to pg_stat_io.
_WAL_SYNCS_18 = "SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'"
_WAL_SYNCS = "SELECT wal_sync FROM pg_stat_wal"


def server_counters(conn: psycopg.Connection, ledger: RunLedger) -> tuple[int, int]:
    """Transaction ids handed out so far (one per transaction that writes: a commit record) and
    WAL syncs so far (a commit that waits for its flush causes one; the WAL writer adds a few).

    The ledger's one connection reports its statistics first (a backend otherwise sends them at
    most once a second)."""
    pool = ledger._db._pool_or_open()
    with pool.connection() as ledger_conn:
        ledger_conn.execute("SELECT pg_stat_force_next_flush()")
    xid = conn.execute(_NEXT_XID).fetchone()
    version = conn.info.server_version
    syncs = conn.execute(_WAL_SYNCS_18 if version >= 180000 else _WAL_SYNCS).fetchone()
    assert xid is not None and syncs is not None
    return int(xid[0]), int(syncs[0])


@contextmanager
def bench_database() -> Iterator[str]:
    server = os.environ.get("IDEMPOTENT_JOBS_DATABASE_URL") or database_url()
    name = f"ij_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(server, dbname=name)
    try:
        LedgerAdmin(url).migrate()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_rows (id int PRIMARY KEY, n bigint NOT NULL)")
            conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 99999) g")
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def noop_collect(identity: RunIdentity) -> dict[str, Any]:
    return {"documents": ["d"]}


def noop_model(raw: dict[str, Any]) -> dict[str, Any]:
    return {"summary": "s"}


def notify(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"hook": {"summary": output["summary"]}}


# -- 1 + 2: round trips, commits and latency per run ------------------------------------------


def per_run(url: str, runs: int) -> None:
    ledger = CountingLedger(url, pool_min_size=1, pool_max_size=1)
    with ledger, psycopg.connect(url, autocommit=True) as conn:
        run_idempotent(ledger, ident("warm", 0), collect=noop_collect, transform=noop_model)
        ledger.stats.update(statements=0, seconds=0.0)
        times = []
        xids, syncs = server_counters(conn, ledger)
        for n in range(runs):
            before = ledger.stats["seconds"]
            run_idempotent(
                ledger,
                ident("latency", n),
                collect=noop_collect,
                transform=noop_model,
                notifications=notify,
            )
            times.append(ledger.stats["seconds"] - before)
        xids_after, syncs_after = server_counters(conn, ledger)
        per = ledger.stats["statements"] / runs
        row(
            "round trips per logical run (happy path)",
            f"{per:.1f}",
            "target <= 4",
            "ok" if per <= 4 else "MISSED",
        )
        # Reading the counters takes no transaction id: every one counted is a run's commit.
        # No target (retired): the claim must commit before collect, the checkpoint before the
        # model call, so a new run is three write transactions; only the last must be flushed.
        commits = (xids_after - xids) / runs
        row("commits per logical run (write transactions)", f"{commits:.1f}", "no target", "-")
        flushes = (syncs_after - syncs) / runs
        row(
            "  of which wait for the WAL flush (WAL syncs)",
            f"{flushes:.2f}",
            "target 1 per new run (was 3.0)",
            "ok" if flushes <= 1.1 else "MISSED",
        )
        update = []
        for n in range(runs):
            started = time.perf_counter()
            conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = %s", (n,))
            update.append(time.perf_counter() - started)
        for q, name, target in ((0.5, "p50", "target <= 3x"), (0.99, "p99", "no target")):
            ratio = pct(times, q) / pct(update, q)
            verdict = "-" if name == "p99" else ("ok" if ratio <= 3 else "MISSED")
            row(
                f"ledger time per run vs one UPDATE ({name})",
                f"{pct(times, q) * 1e3:.2f} ms = {ratio:.2f}x",
                f"UPDATE {pct(update, q) * 1e3:.2f} ms; {target}",
                verdict,
            )
    whole_call(url, runs)


def _timed_calls(ledger: RunLedger, tag: str, runs: int) -> list[float]:
    times = []
    for n in range(runs):
        started = time.perf_counter()
        run_idempotent(
            ledger, ident(tag, n), collect=noop_collect, transform=noop_model, notifications=notify
        )
        times.append(time.perf_counter() - started)
    return times


def whole_call(url: str, runs: int) -> None:
    """The whole ``run_idempotent`` call as a caller times it: the heartbeat, the Python around
    the statements, the statements. Interleaved with autocommit UPDATEs by primary key, so
    both see the same machine."""
    with RunLedger(url, pool_min_size=1, pool_max_size=1) as ledger:
        with psycopg.connect(url, autocommit=True) as conn:
            _timed_calls(ledger, "whole-warm", 20)
            new: list[float] = []
            reused: list[float] = []
            update: list[float] = []
            for block in range(runs // 20):
                new += _timed_calls(ledger, f"whole-{block}", 20)
                reused += _timed_calls(ledger, f"whole-{block}", 20)
                for n in range(20):
                    started = time.perf_counter()
                    conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = %s", (n,))
                    update.append(time.perf_counter() - started)
    base = pct(update, 0.5)
    for name, times, target in (("new run", new, 3.0), ("reused", reused, 1.5)):
        ratio = pct(times, 0.5) / base
        row(
            f"whole run_idempotent call, {name} (p50)",
            f"{pct(times, 0.5) * 1e3:.2f} ms = {ratio:.2f}x",
            f"UPDATE {base * 1e3:.2f} ms; target <= {target:g}x",
            "ok" if ratio <= target else "MISSED",
        )


# -- 3: claims/s under 16 racing processes vs plain UPDATEs/s ---------------------------------


def _claim_worker(url: str, offset: int, hot: bool, seconds: float, out: Any) -> None:
    ledger = RunLedger(url, pool_min_size=1, pool_max_size=1)
    done = 0
    with ledger:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            run_id = ident("hot", offset % 16).run_id if hot else ident(f"d{offset}", n).run_id
            ledger.claim(run_id, f"w{offset}", 0.001)
            done += 1
            n += 1
    out.put(done)


def _update_worker(url: str, offset: int, hot: bool, seconds: float, out: Any) -> None:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            key = offset % 16 if hot else offset * 5000 + n
            conn.execute("UPDATE bench_rows SET n = n + 1 WHERE id = %s", (key,))
            done += 1
            n += 1
    out.put(done)


def _rate(target: Callable[..., None], url: str, hot: bool, seconds: float) -> float:
    ctx = multiprocessing.get_context("forkserver")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, i, hot, seconds, out)) for i in range(16)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return float(total / seconds)


def contention(url: str, seconds: float) -> None:
    register(url, [ident("hot", i) for i in range(16)])
    register(url, [ident(f"d{i}", n) for i in range(16) for n in range(int(seconds * 2000))])
    for hot, label, target in ((False, "distinct rows", 0.6), (True, "16 hot rows", 0.4)):
        claims = _rate(_claim_worker, url, hot, seconds)
        updates = _rate(_update_worker, url, hot, seconds)
        ratio = claims / updates
        row(
            f"claims/s, 16 processes, {label}",
            f"{claims:,.0f}/s = {ratio:.0%}",
            f"UPDATE {updates:,.0f}/s; target >= {target:.0%}",
            "ok" if ratio >= target else "MISSED",
        )


# -- 4: merged/pipelined vs sequential (information; the ">= 2x" target is retired) -----------


def merged_vs_sequential(url: str, runs: int) -> None:
    # The baseline: the four steps as separate statements, each a durable autocommit.
    with (
        RunLedger(url, durable_lease_commits=True) as durable,
        psycopg.connect(url, autocommit=True) as registrar,
    ):
        started = time.perf_counter()
        for n in range(runs):
            i = ident("sequential", n)
            register(registrar, [i])
            lease = durable.claim(i.run_id, "w", 60)
            assert lease is not None
            durable.checkpoint(lease, {"documents": ["d"]})
            durable.complete(lease, {"summary": "s"}, notify({"summary": "s"}))
        sequential = runs / (time.perf_counter() - started)
    ledger = RunLedger(url)
    with ledger:
        started = time.perf_counter()
        for n in range(runs):
            run_idempotent(
                ledger,
                ident("merged", n),
                collect=noop_collect,
                transform=noop_model,
                notifications=notify,
            )
        merged = runs / (time.perf_counter() - started)
    ratio = merged / sequential
    row(
        "runs/s, merged + lease commits unflushed vs sequential",
        f"{merged:,.0f}/s = {ratio:.2f}x",
        f"4 durable autocommits {sequential:,.0f}/s; no target",
        "-",
    )


# -- 5: the ledger inside a Dagster run --------------------------------------------------------


def dagster_fraction(url: str, runs: int) -> None:
    os.environ["IDEMPOTENT_JOBS_DATABASE_URL"] = url
    from idempotent_jobs.location.definitions import defs

    job = defs.resolve_job_def("competitor_summary")
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    fractions = []
    for n in range(runs):
        ledger = CountingLedger(url)
        COUNTS.update(statements=0, seconds=0.0)
        key = f"workspace-acme|{(datetime(2026, 8, 1) + timedelta(days=n)):%Y-%m-%d}"
        started = time.perf_counter()
        job.execute_in_process(partition_key=key, resources={"ledger": ledger}, run_config=quiet)
        total = time.perf_counter() - started
        fractions.append(ledger.stats["seconds"] / total)
    median = statistics.median(fractions)
    row(
        "ledger time / execute_in_process (one partition)",
        f"{median:.1%}",
        "target <= 2%",
        "ok" if median <= 0.02 else "MISSED",
    )


# -- 6: reclaim after kill -9 ------------------------------------------------------------------


def _hold(url: str, run_id: str, lease: float, ready: Any) -> None:
    ledger = RunLedger(url)
    with ledger:
        assert ledger.claim(run_id, "doomed", lease) is not None
        ready.set()
        time.sleep(3600)


def reclaim_after_kill(url: str, lease: float) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ledger = RunLedger(url)
    with ledger:
        register(url, [ident("reclaim", 0)])
        run_id = ident("reclaim", 0).run_id
        ready = ctx.Event()
        holder = ctx.Process(target=_hold, args=(url, run_id, lease, ready))
        holder.start()
        ready.wait(60)
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        killed = time.perf_counter()
        holder.join()
        while ledger.claim(run_id, "survivor", 60) is None:
            time.sleep(0.01)
        waited = time.perf_counter() - killed
    row(
        "kill -9 of the holder -> reclaimed",
        f"{waited:.2f} s = {waited / lease:.2f}x lease",
        f"lease {lease:.1f} s; target <= lease + 1 s",
        "ok" if waited <= lease + 1 else "MISSED",
    )


def _interleaved(ledgers: dict[str, RunLedger], runs: int) -> dict[str, dict[str, list[float]]]:
    """Whole calls, new and reused, through each ledger in turn, block by block (so a noisy
    moment of the machine hits every variant alike)."""
    times: dict[str, dict[str, list[float]]] = {k: {"new": [], "reused": []} for k in ledgers}
    for name, ledger in ledgers.items():
        _timed_calls(ledger, f"{name}-warm", 20)
    for block in range(runs // 20):
        for name, ledger in ledgers.items():
            times[name]["new"] += _timed_calls(ledger, f"{name}-{block}", 20)
            times[name]["reused"] += _timed_calls(ledger, f"{name}-{block}", 20)
    return times


def pgbouncer_cost(url: str, runs: int) -> None:
    """What PgBouncer 1.18 in transaction mode costs: the ledger finds it and prepares nothing
    (prepared statements off, measured alone on a direct connection), and each statement takes
    one more hop."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from testkit.pgbouncer import PgBouncer

    dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    with PgBouncer(url) as bouncer:
        variants = {
            "prepared": RunLedger(url, pool_min_size=1, pool_max_size=1),
            "unprepared": RunLedger(
                url, pool_min_size=1, pool_max_size=1, prepared_statements=False
            ),
            "pgbouncer": RunLedger(bouncer.url(dbname), pool_min_size=1, pool_max_size=1),
        }
        try:
            times = _interleaved(variants, runs)
            assert variants["pgbouncer"].pooled, "PgBouncer was not detected"
        finally:
            for ledger in variants.values():
                ledger.close()
    # No target: what PgBouncer 1.18 costs is measured, not chosen (docs/deployment.md says
    # what lifts it: PgBouncer 1.21+ with max_prepared_statements and prepared_statements=True).
    for kind in ("new", "reused"):
        base = pct(times["prepared"][kind], 0.5)
        for name, label in (
            ("unprepared", "unprepared, direct"),
            ("pgbouncer", "via PgBouncer 1.18, transaction mode"),
        ):
            value = pct(times[name][kind], 0.5)
            row(
                f"whole call, {kind} run, {label} (p50)",
                f"{value * 1e3:.2f} ms = {value / base:.2f}x",
                f"prepared, direct {base * 1e3:.2f} ms",
                "-",
            )


def telemetry_cost(url: str, runs: int) -> None:
    """What the OpenTelemetry instrumentation costs the whole call: no observer of the engine at
    all (``none``: the telemetry observer removed), off (``IDEMPOTENT_JOBS_TELEMETRY=off``), the
    API only with no SDK (what every user without OpenTelemetry runs), and an SDK with an
    in-memory span exporter and metric reader; interleaved block by block in one process."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from idempotent_jobs.core import observers, telemetry
    from testkit.otel import installed

    times: dict[str, dict[str, list[float]]] = {
        k: {"new": [], "reused": []} for k in ("none", "off", "api", "sdk")
    }
    with RunLedger(url, pool_min_size=1, pool_max_size=1) as ledger:
        _timed_calls(ledger, "otel-warm", 40)
        for block in range(runs // 20):
            for name in ("none", "off", "api", "sdk"):
                telemetry.enabled = name != "off"
                tag = f"otel-{name}-{block}"
                if name == "none":
                    watching = observers.current_observers()
                    for observer in watching:  # the engine with nobody watching it
                        observers.remove_observer(observer)
                    times[name]["new"] += _timed_calls(ledger, tag, 20)
                    times[name]["reused"] += _timed_calls(ledger, tag, 20)
                    for observer in watching:
                        observers.add_observer(observer)
                elif name == "sdk":
                    with installed() as otel:
                        times[name]["new"] += _timed_calls(ledger, tag, 20)
                        times[name]["reused"] += _timed_calls(ledger, tag, 20)
                        otel.spans.clear()
                else:
                    times[name]["new"] += _timed_calls(ledger, tag, 20)
                    times[name]["reused"] += _timed_calls(ledger, tag, 20)
        telemetry.enabled = True
    for kind in ("new", "reused"):
        none = pct(times["none"][kind], 0.5)
        base = pct(times["off"][kind], 0.5)
        row(
            f"whole call, {kind} run, telemetry off, its observer told (p50)",
            f"{base * 1e3:.3f} ms = {base / none - 1:+.1%}",
            f"no observer {none * 1e3:.3f} ms; no target",
            "-",
        )
        api = pct(times["api"][kind], 0.5)
        sdk = pct(times["sdk"][kind], 0.5)
        overhead = api / base - 1
        row(
            f"whole call, {kind} run, OpenTelemetry API, no SDK (p50)",
            f"{api * 1e3:.3f} ms = {overhead:+.1%}",
            f"off {base * 1e3:.3f} ms; target < +3%",
            "ok" if overhead < 0.03 else "MISSED",
        )
        row(
            f"whole call, {kind} run, SDK + in-memory exporters (p50)",
            f"{sdk * 1e3:.3f} ms = {sdk / base - 1:+.1%}",
            f"off {base * 1e3:.3f} ms; no target",
            "-",
        )


def budget_cost(url: str, runs: int) -> None:
    """What a budget costs the whole call of a new run: the call's declared worst case reserved
    by the claim's statement (on the budget's counter row, whatever the number of
    subjects) and settled by the commit's trigger, interleaved with calls of a job no budget
    covers. Target: within 5%. Then the same pairs' statements, one by one: which of them the
    budget makes dearer (no target)."""
    from idempotent_jobs import Budget, ModelAnswer, ModelUsage

    def paid_model(raw: dict[str, Any]) -> ModelAnswer:
        return ModelAnswer({"summary": "s"}, ModelUsage("m", 100, 10))

    budgets = {"none": None, "budget": Budget(amount=10**15)}
    times: dict[str, list[float]] = {name: [] for name in budgets}
    STATEMENT_TIMES.clear()
    with CountingLedger(url, pool_min_size=1, pool_max_size=1) as ledger:
        # One call of each, in turn (the order flipped every pair), so both see the same
        # moments of a noisy machine; the first 40 pairs warm both up.
        for n in range(2 * runs + 40):
            order = list(budgets.items())
            for name, budget in order if n % 2 else order[::-1]:
                LABEL[0] = name if n >= 40 else "warm"
                started = time.perf_counter()
                run_idempotent(
                    ledger,
                    ident(f"budget-{name}", n, job=f"bench-{name}"),
                    collect=noop_collect,
                    transform=paid_model,
                    notifications=notify,
                    budget=budget,
                    max_tokens_per_call=200 if budget else None,
                )
                if n >= 40:
                    times[name].append(time.perf_counter() - started)
    base, budgeted = pct(times["none"], 0.5), pct(times["budget"], 0.5)
    row(
        "whole call, new run, with a budget (p50)",
        f"{budgeted * 1e3:.3f} ms = {budgeted / base - 1:+.1%}",
        f"without {base * 1e3:.3f} ms; target within 5%",
        "ok" if budgeted / base - 1 <= 0.05 else "MISSED",
    )
    statements = sorted({name for label, name in STATEMENT_TIMES if label != "warm"})
    for name in statements:
        without = STATEMENT_TIMES.get(("none", name), [])
        within = STATEMENT_TIMES.get(("budget", name), [])
        if not without or not within:
            continue
        delta = (pct(within, 0.5) - pct(without, 0.5)) * 1e6
        row(
            f"  statement {name}, with a budget (p50)",
            f"{pct(within, 0.5) * 1e6:.0f} us = {delta:+.0f} us",
            f"without {pct(without, 0.5) * 1e6:.0f} us",
            "-",
        )


SECTIONS = (
    "per-run",
    "contention",
    "merged",
    "dagster",
    "reclaim",
    "pgbouncer",
    "telemetry",
    "budget",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    args = parser.parse_args(argv)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["idempotent_jobs"])
    runs = 50 if args.quick else 400
    chosen = args.only or list(SECTIONS)
    header()
    with bench_database() as url:
        if "per-run" in chosen:
            per_run(url, runs)
        if "contention" in chosen:
            contention(url, 1.0 if args.quick else 3.0)
        if "merged" in chosen:
            merged_vs_sequential(url, runs)
        if "dagster" in chosen:
            dagster_fraction(url, 3 if args.quick else 10)
        if "reclaim" in chosen:
            reclaim_after_kill(url, 2.0)
        if "pgbouncer" in chosen:
            pgbouncer_cost(url, runs)
        if "telemetry" in chosen:
            telemetry_cost(url, 2 * runs)
        if "budget" in chosen:
            budget_cost(url, runs)
    tally()
    return 0


if __name__ == "__main__":
    sys.exit(main())
