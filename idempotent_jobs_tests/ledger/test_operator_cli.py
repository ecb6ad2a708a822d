"""The operator CLI against a real ledger holding runs in every state."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idempotent_jobs import CallOrigin, RunIdentity, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.health import MAX_FINDINGS_PER_CHECK
from idempotent_jobs.core.testing import ScriptedModel
from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY
from idempotent_jobs.operator.cli import main
from idempotent_jobs.operator.code_location import load_workspace
from idempotent_jobs.operator.rerun import partition_for_run, rerun_partition
from idempotent_jobs_tests.helpers import (
    Collector,
    backdate,
    deliver_all,
    email,
    expire_lease,
    identity,
)
from idempotent_jobs_tests.ledgers import HarnessLedger


@pytest.fixture
def cli_env(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", database)
    monkeypatch.setenv("IDEMPOTENT_JOBS_HOME", str(tmp_path / "home"))
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse refuses bad arguments this way
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def as_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out = run(capsys, *argv, "--json")
    assert code in (0, 1), out
    return json.loads(out)


@pytest.fixture
def planted(ledger: HarnessLedger, db: psycopg.Connection) -> dict[str, str]:
    """One run per state; returns {state: run_id}."""
    runs = {
        "pending": identity("pending-co", 1),
        "running": identity("running-co", 2),
        "expired": identity("expired-co", 3),
        "completed": identity("completed-co", 4),
        "failed": identity("failed-co", 5),
    }
    for ident in runs.values():
        ledger.register(ident)
    assert ledger.claim(runs["running"].run_id, "live-worker", 600) is not None
    assert ledger.claim(runs["expired"].run_id, "dead-worker", 600) is not None
    expire_lease(db, runs["expired"].run_id)
    lease = ledger.claim(
        runs["completed"].run_id, "w", 60, origin=CallOrigin(caller_run_id="dagster-1")
    )
    assert lease is not None
    ledger.complete(lease, {"summary": "done"}, {"report_file": {"n": 1}, "fax": {"n": 2}})
    db.execute(
        "UPDATE idempotent_jobs.notification_outbox SET created_at = now() - interval '1 hour'"
    )
    for attempt in range(3):
        failing = ledger.claim(runs["failed"].run_id, f"w{attempt}", 60)
        assert failing is not None
        ledger.fail(failing, f"TimeoutError: attempt {attempt}")
    return {state: ident.run_id for state, ident in runs.items()}


def test_runs_list_as_table_and_json_with_filters(
    cli_env: Path, planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, "runs", "list")
    assert code == 0
    header, *rows = out.strip().splitlines()
    assert header.split()[:6] == ["RUN", "JOB", "SUBJECT", "WINDOW", "VERSION", "STATUS"]
    assert len(rows) == 5 and any("dead-worker" in r for r in rows)

    listed = as_json(capsys, "runs", "list")
    statuses = {r["run_id"]: r["status"] for r in listed}
    assert statuses == {
        planted["pending"]: "pending",
        planted["running"]: "running",
        planted["expired"]: "running",
        planted["completed"]: "completed",
        planted["failed"]: "failed",
    }
    assert [r["run_id"] for r in as_json(capsys, "runs", "list", "--status", "failed")] == [
        planted["failed"]
    ]
    assert [
        r["subject_id"] for r in as_json(capsys, "runs", "list", "--subject", "pending-co")
    ] == ["pending-co"]
    window = as_json(
        capsys, "runs", "list", "--since", "2026-08-07T02:00Z", "--until", "2026-08-07T04:00Z"
    )
    assert sorted(r["subject_id"] for r in window) == ["expired-co", "running-co"]
    code, out = run(capsys, "runs", "list", "--job", "another-job")  # a typo is never "(none)"
    assert code == 2 and "the ledger's jobs are competitor-summary" in out
    assert as_json(capsys, "runs", "list", "--job", "competitor_summary")  # the Dagster name
    by_day = as_json(capsys, "runs", "list", "--since", "2026-08-07")  # a plain date: UTC
    assert len(by_day) == len(as_json(capsys, "runs", "list", "--since", "2026-08-07T00:00Z"))
    code, out = run(capsys, "runs", "list", "--since", "2026-08-07T09:00")
    assert code == 2 and "needs a timezone" in out
    code, out = run(capsys, "runs", "list", "--since", "yesterday")
    assert code == 2 and "is not a date" in out


def test_runs_list_pages_by_keyset_through_ties(
    cli_env: Path, ledger: HarnessLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pages of --limit 3 chained by --after cover every run once, in order, even where two
    versions share a job, subject and window."""
    for hour in range(4):
        for subject in ("a-co", "b-co"):
            ledger.register(identity(subject, hour))
            ledger.register(
                RunIdentity(
                    "competitor-summary", subject, identity(subject, hour).scheduled_at, "v2"
                )
            )
    everything = [r["run_id"] for r in as_json(capsys, "runs", "list")]
    assert len(everything) == 16
    pages: list[list[str]] = []
    after: list[str] = []
    while True:
        page = [r["run_id"] for r in as_json(capsys, "runs", "list", "--limit", "3", *after)]
        if not page:
            break
        pages.append(page)
        after = ["--after", page[-1][:12]]
    assert [run_id for page in pages for run_id in page] == everything
    assert [len(page) for page in pages] == [3, 3, 3, 3, 3, 1]
    code, out = run(capsys, "runs", "list", "--limit", "3")
    assert code == 0 and out.strip().endswith(f"next page: --after {everything[2][:12]}")
    code, out = run(capsys, "runs", "list", "--after", "0" * 12)
    assert code == 2 and "matches no run" in out


def test_prune_counts_first_and_prunes_with_apply(
    cli_env: Path, ledger: HarnessLedger, db: psycopg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    """The location's policy for competitor-summary (raw input 30 days, output 365, attempts
    90, delivered payloads 30): a run completed 400 days ago loses all four."""
    done = run_idempotent(
        ledger,
        identity(),
        collect=Collector(),
        transform=ScriptedModel([{"summary": "old news"}]),
        notifications=email,
    )
    deliver_all(ledger)
    backdate(db, done.run_id, 400)

    code, out = run(capsys, "prune")
    assert code == 0 and "\ndry run, nothing was pruned" in out, out
    assert out.startswith("jobs of module idempotent_jobs.location.definitions"), out
    lines = out.splitlines()
    for part in ("runs.raw_input", "runs.output", "run_attempts", "notification_outbox.payload"):
        [line] = [ln for ln in lines if ln.startswith("competitor-summary") and part in ln]
        assert line.split()[2] == "1", line
    assert [ln.split()[2] for ln in lines if ln.startswith("hourly-digest")] == ["0"] * 4
    record = ledger.get(done.run_id)
    assert record is not None and record.output == {"summary": "old news"}

    code, out = run(capsys, "prune", "--apply", "--batch-size", "1")
    assert code == 0 and "\npruned:" in out, out
    record = ledger.get(done.run_id)
    assert record is not None and (record.status, record.output, record.raw_input) == (
        "completed",
        None,
        None,
    )
    code, out = run(capsys, "runs", "show", done.run_id[:12])
    assert "ended attempts pruned" in out and "PAYLOAD PRUNED" in out
    shown = as_json(capsys, "runs", "show", done.run_id)
    assert all(
        shown["run"][f] for f in ("raw_input_pruned_at", "output_pruned_at", "attempts_pruned_at")
    )
    assert shown["outbox"][0]["payload_pruned_at"] and shown["outbox"][0]["payload"] is None
    [report] = as_json(capsys, "prune", "--job", "competitor_summary")
    assert report["job_name"] == "competitor-summary" and report["applied"] is False
    assert {p: c["rows"] for p, c in report["parts"].items()} == dict.fromkeys(
        ("raw_input", "output", "attempts", "delivered_payloads"), 0
    )
    code, out = run(capsys, "prune", "--job", "no-such-job")  # a typo: never an empty table
    assert code == 2 and "no job named 'no-such-job'" in out
    assert "the jobs are: competitor_summary (identity competitor-summary)" in out
    code, out = run(capsys, "prune", "--job", "evil\x1b[2Jjob")
    assert code == 2 and "\x1b" not in out and "evil\\x1b[2Jjob" in out
    code, out = run(capsys, "prune", "--output-days", "0")
    assert code == 2 and "must be greater than 0" in out


def test_runs_stats_counts_rows_and_bytes_per_job_and_part(
    cli_env: Path, planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stats = as_json(capsys, "runs", "stats")
    parts = {(p["job_name"], p["part"]): p for p in stats["parts"]}
    assert parts[("competitor-summary", "runs")]["rows"] == 5
    assert parts[("competitor-summary", "runs.output")]["bytes"] > 0  # the completed run's
    assert parts[("competitor-summary", "notification_outbox.payload")]["rows"] == 2
    # 1 completed + 3 failed claims; the open claims (running, expired) live on their runs
    assert parts[("competitor-summary", "run_attempts")]["rows"] == 4
    assert not any(p["estimated"] for p in stats["parts"])
    assert {t["table_name"] for t in stats["tables"]} >= {"runs", "run_attempts"}
    code, out = run(capsys, "runs", "stats")
    assert code == 0 and "on disk (indexes and TOAST included):" in out


def test_runs_show_tells_the_whole_story(
    cli_env: Path, planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    failed = planted["failed"]
    code, out = run(capsys, "runs", "show", failed[:10])
    assert code == 0
    assert failed in out and "attempts:" in out and "TimeoutError: attempt 2" in out
    shown = as_json(capsys, "runs", "show", failed)
    assert shown["run"]["status"] == "failed" and shown["run"]["attempts"] == 3
    assert [a["outcome"] for a in shown["attempts"]] == ["failed"] * 3
    assert [a["worker_id"] for a in shown["attempts"]] == ["w0", "w1", "w2"]
    completed = as_json(capsys, "runs", "show", planted["completed"])
    assert completed["attempts"][0]["caller_run_id"] == "dagster-1"
    assert sorted(o["channel"] for o in completed["outbox"]) == ["fax", "report_file"]
    code, out = run(capsys, "runs", "show", "ffff")
    assert code == 2 and "matches no run" in out
    code, out = run(capsys, "runs", "show", "not-hex")
    assert code == 2 and "run_id: 'not-hex' is not a run id" in out


def test_outbox_list_and_deliver(
    cli_env: Path, planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pending = as_json(capsys, "outbox", "list", "--pending")
    assert sorted(o["channel"] for o in pending) == ["fax", "report_file"]
    code, out = run(capsys, "outbox", "deliver")
    assert code == 1, "the unknown channel fails"
    assert "delivered" in out and "names no channel 'fax'" in out
    delivered = (cli_env / "home" / "notifications.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in delivered] == [
        f"{planted['completed']}:report_file"
    ]
    left = as_json(capsys, "outbox", "list", "--pending", "--run", planted["completed"][:12])
    assert [(o["channel"], o["delivery_attempts"]) for o in left] == [("fax", 1)]


def test_doctor_flags_each_problem_and_passes_a_clean_ledger(
    cli_env: Path,
    planted: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    db: psycopg.Connection,
) -> None:
    report = as_json(capsys, "doctor")
    kinds = {(f["kind"], f["run_id"]) for f in report["findings"]}
    assert kinds == {
        ("expired_lease", planted["expired"]),
        ("undelivered_outbox", planted["completed"]),
        ("failed_past_retries", planted["failed"]),
    }
    assert main(["doctor"]) == 1
    db.execute("TRUNCATE idempotent_jobs.runs CASCADE")
    capsys.readouterr()
    code, out = run(capsys, "doctor")
    assert code == 0 and "0 problem(s)" in out


def test_doctor_lists_the_oldest_problems_and_says_there_are_more(
    cli_env: Path, db: psycopg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    db.execute(
        """
        INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version,
            status, attempts, last_error, updated_at)
        SELECT md5(g::text) || md5(g::text), 'job', 's' || g, now(), 'v1', 'failed', 3,
            'boom', now() - make_interval(mins => g)
        FROM generate_series(1, %s) AS g
        """,
        (MAX_FINDINGS_PER_CHECK + 5,),
    )
    findings = as_json(capsys, "doctor")["findings"]
    listed = [f["run_id"] for f in findings if f["run_id"]]
    oldest = [
        str(r[0])
        for r in db.execute(
            "SELECT run_id FROM idempotent_jobs.runs ORDER BY updated_at LIMIT %s",
            (MAX_FINDINGS_PER_CHECK,),
        )
    ]
    assert listed == oldest
    assert [f["detail"] for f in findings if not f["run_id"]] == [
        f"more than {MAX_FINDINGS_PER_CHECK} of these; the others are left out here "
        "(`runs list --status failed`)"
    ]


def test_doctor_imports_no_dagster(cli_env: Path) -> None:
    code = (
        "import sys\n"
        "from idempotent_jobs.operator.cli import main\n"
        "main(['doctor'])\n"
        "print('dagster' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr


def test_doctor_reports_an_unreachable_database(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "IDEMPOTENT_JOBS_DATABASE_URL", "postgresql://u:pw-secret@127.0.0.1:9/x?connect_timeout=1"
    )
    code, out = run(capsys, "--connect-timeout", "1", "doctor")
    assert code == 1 and "problem: ledger database" in out and "pw-secret" not in out


def test_revise_keeps_history_and_notifies_only_named_channels(
    cli_env: Path, ledger: HarnessLedger, operator: LedgerAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "workspace-acme|2026-08-07"
    ident = COMPETITOR_SUMMARY.identity_for(key)
    ledger.register(ident)
    workspace = load_workspace(module="idempotent_jobs.location.definitions")
    record = ledger.get(ident.run_id)
    assert record is not None
    first = rerun_partition(workspace, *partition_for_run(workspace, record))
    assert first.success
    original = ledger.get(ident.run_id)
    assert original is not None and original.status == "completed"
    assert [o.idempotency_key for o in operator.outbox(ident.run_id)] == [
        f"{ident.run_id}:report_file"
    ]

    code, out = run(
        capsys,
        "revise",
        ident.run_id[:16],
        "--reason",
        "prompt fixed",
        "--channel",
        "report_file",
        "--requested-by",
        "ops@acme",
        "--now",
    )
    assert code == 0, out
    revised = ledger.get(ident.run_id)
    assert revised is not None and (revised.status, revised.revision) == ("completed", 1)
    [history] = operator.revisions(ident.run_id)
    assert (history.reason, history.channels, history.requested_by) == (
        "prompt fixed",
        ["report_file"],
        "ops@acme",
    )
    assert history.previous_output == original.output
    assert history.previous_completed_at == original.completed_at
    keys = sorted(o.idempotency_key for o in operator.outbox(ident.run_id))
    assert keys == [f"{ident.run_id}:report_file", f"{ident.run_id}:report_file:r1"]
    assert all(o.delivered_at for o in operator.outbox(ident.run_id))

    # A silent revision (no channel): recomputed, kept in history, nothing sent.
    assert main(["revise", ident.run_id, "--reason", "model upgrade", "--now"]) == 0
    assert len(operator.revisions(ident.run_id)) == 2
    assert len(operator.outbox(ident.run_id)) == 2
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["completed"] * 3


def test_revise_refuses_what_is_not_completed(
    cli_env: Path, planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, "revise", planted["running"], "--reason", "why not")
    assert code == 2 and "only a completed run can be revised" in out
    code, out = run(capsys, "revise", planted["completed"], "--reason", "   ")
    assert code == 2 and "reason: must say why" in out


def test_the_cli_parses_without_importing_dagster_or_psycopg() -> None:
    """`--help` and the ledger commands' start-up import neither: Dagster is imported only by
    the commands that need it, psycopg only once a command talks to the ledger."""
    code = (
        "import sys\n"
        "from idempotent_jobs.operator import cli\n"
        "cli.build_parser().parse_args(['runs', 'list', '--limit', '5'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'psycopg', 'pydantic'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_constants_are_defined_once() -> None:
    """The database variable, the default schema and the run statuses have one definition,
    which the CLI, the core and the Dagster layer all import."""
    from typing import get_args

    from idempotent_jobs.core import constants, database, records, settings
    from idempotent_jobs.core import project_paths as project

    assert database.DATABASE_URL_ENV is constants.DATABASE_URL_ENV
    assert vars(project)["DATABASE_URL_ENV"] is constants.DATABASE_URL_ENV
    assert constants.RUN_STATUSES == get_args(records.RunStatus)
    assert settings.LedgerSettings("").schema == constants.DEFAULT_SCHEMA
    sources = "\n".join(
        p.read_text()
        for p in Path(constants.__file__).parents[1].rglob("*.py")
        if p.name != "constants.py"
    )
    assert sources.count('"IDEMPOTENT_JOBS_DATABASE_URL"') == 0
    assert sources.count('"pending", "running", "completed", "failed"') == 1  # RunStatus
