"""The embedded PostgreSQL (fresh machines) and the command line, as real processes."""

import os
import subprocess
import sys
from pathlib import Path

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
