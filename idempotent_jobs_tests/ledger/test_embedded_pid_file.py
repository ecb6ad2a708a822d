"""``db status`` and ``db stop`` trust no pid file: the pid must be a postmaster serving this
project's data directory. A stale file (its server crashed, its pid reused, even by another
project's PostgreSQL) is one line and exit 2, and no process is ever signalled."""

import os
from pathlib import Path

import psycopg
import pytest

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.project_paths import HOME_ENV
from idempotent_jobs.operator.cli import main


def another_servers_postmaster(server_url: str) -> int:
    """The postmaster pid of the PostgreSQL the tests use: another project's server here."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None
    return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])


def unused_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


@pytest.mark.parametrize("whose", ["another server", "this test process", "nobody"])
def test_a_stale_pid_file_is_reported_and_nothing_is_signalled(
    whose: str,
    server_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pid = {
        "another server": lambda: another_servers_postmaster(server_url),
        "this test process": os.getpid,
        "nobody": unused_pid,
    }[whose]()
    pgdata = tmp_path / "state" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "postmaster.pid").write_text(f"{pid}\n{pgdata}\n1700000000\n5432\n")
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "state"))
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    for command in ("status", "stop"):
        assert main(["db", command]) == 2, command
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and "stale" in lines[0] and f"pid {pid}" in lines[0], lines
        assert "Traceback" not in captured.err and captured.out == ""
    if whose == "another server":  # still serving: it was never signalled
        with psycopg.connect(server_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert Path(f"/proc/{pid}").exists()


def test_no_pid_file_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state" / "pgdata").mkdir(parents=True)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "state"))
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    assert main(["db", "status"]) == 0
    assert "embedded PostgreSQL: stopped" in capsys.readouterr().out
    assert main(["db", "stop"]) == 0
    assert "is not running" in capsys.readouterr().out


@pytest.mark.slow
def test_the_projects_own_server_is_found_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "state"))
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    assert main(["db", "url"]) == 0  # starts it
    capsys.readouterr()
    assert main(["db", "status"]) == 0
    out = capsys.readouterr().out
    assert "embedded PostgreSQL: running (pid " in out
    pid = int(out.split("(pid ")[1].split(")")[0])
    assert main(["db", "stop"]) == 0
    assert "stopped" in capsys.readouterr().out
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    assert main(["db", "status"]) == 0
    assert "embedded PostgreSQL: stopped" in capsys.readouterr().out
