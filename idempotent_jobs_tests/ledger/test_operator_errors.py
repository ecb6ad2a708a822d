"""Operator commands are all-or-nothing and say what went wrong: checked before any write, one
clear line and exit 2 on bad input, escaped table cells, no password anywhere."""

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idempotent_jobs import LedgerPermissionError, RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.database import ledger_conninfo
from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY
from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs.operator.render import escape_controls
from idempotent_jobs_tests.helpers import claimed, identity
from idempotent_jobs_tests.ledger.test_operator_cli import cli_env, run  # noqa: F401 - the fixture
from idempotent_jobs_tests.ledgers import HarnessLedger

HOSTILE = "\x1b[2J\x1b]0;owned\x07\rover\nnext\x9b31m\u202eevil"
TERMINAL_ACTIONS = ["\x1b", "\x07", "\r", "\x9b", "\u202e"]


def completed(ledger: HarnessLedger, ident: RunIdentity, **details: Any) -> str:
    lease = claimed(ledger, ident, details.pop("worker", "w"))
    ledger.complete(lease, {"summary": "done"}, {"report_file": {"n": 1}}, **details)
    return ident.run_id


def revisions(db: psycopg.Connection, run_id: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM idempotent_jobs.run_revisions WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- revise, reconcile, runs list: checked before any write ------------------------------------


def test_revise_with_an_unknown_channel_writes_nothing(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    db: psycopg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = completed(ledger, COMPETITOR_SUMMARY.identity_for("workspace-acme|2026-08-07"))
    code, out = run(capsys, "revise", run_id, "--reason", "typo", "--channel", "report_fil")
    assert code == 2, out
    assert "'report_fil' is not a channel of job competitor_summary" in out
    assert "its channels: report_file" in out and "Traceback" not in out
    record = ledger.get(run_id)
    assert record is not None and (record.status, record.revision) == ("completed", 0)
    assert revisions(db, run_id) == 0


def test_revise_now_of_a_run_with_no_partition_here_writes_nothing(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    db: psycopg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """09:00 is no start of a daily window: no partition of this code location computes it."""
    run_id = completed(ledger, identity("workspace-acme", 9))
    code, out = run(capsys, "revise", run_id, "--reason", "again", "--now")
    assert code == 2 and "maps to no partition of job competitor_summary" in out, out
    record = ledger.get(run_id)
    assert record is not None and (record.status, record.revision) == ("completed", 0)
    assert revisions(db, run_id) == 0


def test_reconcile_of_an_unknown_job_and_a_negative_limit_exit_2(
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "reconcile", "--job", "no_such_job")
    assert code == 2 and "no job named 'no_such_job'" in out and "Traceback" not in out
    for argv in (["runs", "list"], ["outbox", "list"], ["outbox", "deliver"]):
        code, out = run(capsys, *argv, "--limit", "-1")
        assert code == 2 and "--limit: must be greater than 0, got -1" in out, out
    code, out = run(capsys, "--connect-timeout", "0", "doctor")
    assert code == 2 and "--connect-timeout: must be greater than 0" in out


# -- escaped table cells ------------------------------------------------------------------------


def test_table_cells_escape_what_a_terminal_would_act_on(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    db: psycopg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ident = COMPETITOR_SUMMARY.identity_for("workspace-acme|2026-08-07")
    lease = claimed(ledger, ident, "w", 30)
    ledger.complete(lease, {"summary": HOSTILE}, {"report_file": {"summary": HOSTILE}})
    # What the ledger would refuse today may be in older rows, or written by other tools.
    db.execute(
        "UPDATE idempotent_jobs.runs SET last_error = %s WHERE run_id = %s", (HOSTILE, ident.run_id)
    )
    db.execute(
        "UPDATE idempotent_jobs.run_attempts SET worker_id = %s, caller_step = %s, error = %s,"
        " model_name = %s",
        (HOSTILE, HOSTILE, HOSTILE, HOSTILE),
    )
    db.execute("UPDATE idempotent_jobs.notification_outbox SET last_error = %s", (HOSTILE,))
    for argv in (
        ["runs", "list"],
        ["runs", "show", ident.run_id],
        ["outbox", "list"],
        ["doctor", "--outbox-age", "0"],
    ):
        code, out = run(capsys, *argv)
        assert code in (0, 1), out
        assert not [c for c in TERMINAL_ACTIONS if c in out], (argv, out)
        if argv[0] != "doctor":  # its detail column is cut before the hostile text
            assert "\\x1b[2J" in out or "\\u001b[2J" in out, argv
    shown = as_raw_json(capsys, "runs", "show", ident.run_id)
    assert shown["run"]["output"]["summary"] == HOSTILE, "--json is unchanged"
    assert shown["attempts"][0]["worker_id"] == HOSTILE


def as_raw_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out = run(capsys, *argv, "--json")
    assert code == 0, out
    return json.loads(out)


def test_escape_controls_keeps_ordinary_text() -> None:
    assert escape_controls("café, 東京 — ok") == "café, 東京 — ok"
    assert escape_controls("a\x1bb\u2028c\x00") == "a\\x1bb\\u2028c\\x00"


# -- filters normalise like the library ---------------------------------------------------------


def test_cli_filters_strip_and_normalise_like_the_identity(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    nfc = RunIdentity(
        "competitor-summary",
        "caf\u00e9",
        COMPETITOR_SUMMARY.identity_for("workspace-acme|2026-08-07").scheduled_at,
        "v1",
    )
    ledger.register(nfc)
    listed = as_raw_json(
        capsys, "runs", "list", "--subject", "  cafe\u0301 ", "--job", " competitor-summary"
    )
    assert [r["run_id"] for r in listed] == [nfc.run_id]


# -- connections: one conversion path, the real cause at once, never a password ------------------


def test_migrate_and_open_accept_a_sqlalchemy_style_url(fresh_database: str) -> None:
    url = dagster_storage_url(fresh_database)
    assert url.startswith("postgresql+psycopg2://")
    assert LedgerAdmin(url).migrate() != []
    with HarnessLedger(url) as ledger, LedgerAdmin.beside(ledger) as operator:
        assert ledger.get("0" * 64) is None and operator.list_runs() == []


def test_a_malformed_url_is_one_clear_line_without_the_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Hunter2-" + uuid.uuid4().hex[:6]
    for url in (
        f"postgresql://ledger:{secret}@db.example:5432/x?sslmode=require&bogus_option=1",
        f"host=db.example password={secret} dbname",
    ):
        monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", url)
        for argv in (["migrate"], ["runs", "list"], ["doctor"]):
            code, out = run(capsys, *argv)
            assert code in (1, 2) and secret not in out, out
            assert "Traceback" not in out and "database_url" in out, out


def test_wrong_database_and_bad_sslmode_fail_at_once_with_the_real_cause(
    server_url: str,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(server_url)
    missing = psycopg.conninfo.make_conninfo("", **{**params, "dbname": "no_such_db_ij"})
    bad_ssl = psycopg.conninfo.make_conninfo("", **{**params, "sslmode": "sometimes"})
    for url, cause in ((missing, 'database "no_such_db_ij" does not exist'), (bad_ssl, "sslmode")):
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            HarnessLedger(url, connect_timeout_seconds=8).open()
        assert time.monotonic() - started < 4, "reported at once, not after the timeout"
        assert cause in str(info.value)


def test_a_sub_second_connect_timeout_never_becomes_wait_forever() -> None:
    conninfo = ledger_conninfo("postgresql://u@127.0.0.1/x", 0.5)
    assert psycopg.conninfo.conninfo_to_dict(conninfo)["connect_timeout"] == "1"
    assert "TimeZone=UTC" in str(psycopg.conninfo.conninfo_to_dict(conninfo)["options"])


@pytest.fixture
def grantless_role(server_url: str, database: str) -> Iterator[str]:
    """A role that may connect but holds no privilege on the ledger's schema; yields its URL."""
    role = f"ij_nogrant_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    params = psycopg.conninfo.conninfo_to_dict(database)
    yield psycopg.conninfo.make_conninfo("", **{**params, "user": role})
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_a_role_without_grants_is_told_which_privilege_it_lacks(
    grantless_role: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(LedgerPermissionError, match="permission denied for schema idempotent_jobs"):
        HarnessLedger(grantless_role).open()
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", grantless_role)
    code, out = run(capsys, "runs", "list")
    assert code == 2 and "LedgerPermissionError" in out and "USAGE on schema" in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("name", ["ledger\n", "pg_ledger", "information_schema", "Ledger", ""])
def test_schema_names_are_checked_whole(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--schema", name, "runs", "list")
    assert code == 2 and "schema_name" in out, out


def test_reads_are_utc_whatever_the_servers_time_zone(
    database: str, db: psycopg.Connection
) -> None:
    """A 9999-12-31T23:00Z window is 10000-01-01 in Tokyo: unreadable unless the session is
    UTC. (The ledger refuses such windows now; older rows or other tools may have them.)"""
    dbname = str(psycopg.conninfo.conninfo_to_dict(database)["dbname"])
    db.execute(
        sql.SQL("ALTER DATABASE {} SET TimeZone = 'Asia/Tokyo'").format(sql.Identifier(dbname))
    )
    db.execute(
        "INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version)"
        " VALUES (%s, 'job', 'far', '9999-12-31 23:00+00', 'v1')",
        ("e" * 64,),
    )
    with LedgerAdmin(database) as operator:
        [far] = operator.list_runs()
    offset = far.scheduled_at.utcoffset()
    assert far.scheduled_at.year == 9999 and offset is not None and offset.total_seconds() == 0


@pytest.mark.slow
def test_no_command_prints_the_password(tmp_path: Path, server_url: str) -> None:
    """Every command, as a real process, with a password in the URL and a database it cannot
    use: stdout, stderr and logs are grepped for the password."""
    import os
    import subprocess
    import sys

    password = "Pw-" + uuid.uuid4().hex[:10]
    params = psycopg.conninfo.conninfo_to_dict(server_url)
    missing = psycopg.conninfo.make_conninfo(
        "", **{**params, "dbname": "no_such_db_ij", "password": password}
    )
    urls = {
        "unreachable": f"postgresql://ledger:{password}@127.0.0.1:9/ledger",
        "missing database, +psycopg2": dagster_storage_url(missing),
        "malformed": f"postgresql://ledger:{password}@db.example/x?not_an_option=1",
    }
    commands = [
        ["migrate"],
        ["runs", "list"],
        ["doctor"],
        ["reconcile"],
        ["revise", "abc", "--reason", "r"],
        ["outbox", "deliver"],
    ]
    for name, url in urls.items():
        assert password in url, name  # else the grep below would prove nothing
        for argv in commands if name == "unreachable" else commands[:2]:
            env = {**os.environ, "IDEMPOTENT_JOBS_DATABASE_URL": url}
            env.pop("IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL", None)
            env["IDEMPOTENT_JOBS_HOME"] = str(tmp_path / "home")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "idempotent_jobs.operator.cli",
                    "--connect-timeout",
                    "2",
                    *argv,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            out = done.stdout + done.stderr
            assert done.returncode in (1, 2), (name, argv, out)
            assert password not in out and "Traceback" not in out, (name, argv, out)
            assert "****" in out or "database_url" in out or "could not connect" in out, out
