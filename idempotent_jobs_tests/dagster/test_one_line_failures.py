"""Every configuration a user can get wrong is one line on stderr, exit 2, naming the file or
the variable: never a traceback. And a user's module cannot break the CLI's own output: what it
prints goes to stderr (``--json`` stays valid), a ``sys.exit()`` in it is one line too."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from idempotent_jobs.core import project_paths as project_module
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.project_paths import HOME_ENV
from idempotent_jobs.operator.cli import main
from idempotent_jobs.operator.location_targets import CODE_LOCATION_ENV
from idempotent_jobs_tests.dagster.test_your_own_job import EXAMPLE
from idempotent_jobs_tests.ledgers import HarnessLedger
from idempotent_jobs_tests.system.test_outbox_ownership import DEFINITIONS, TEAMS

GOOD = DEFINITIONS.format(**TEAMS["a"])
TWO_JOBS_ONE_NAME = """\
import dagster as dg

@dg.op
def step() -> None: ...

@dg.job(name="same")
def first() -> None:
    step()

@dg.job(name="same")
def second() -> None:
    step()

defs = dg.Definitions(jobs=[first, second])
"""

Setup = Callable[[Path, pytest.MonkeyPatch], list[str]]


def _file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def two_jobs_one_name(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
    _file(root / "dup_defs.py", TWO_JOBS_ONE_NAME)
    return ["-f", str(root / "dup_defs.py"), "outbox", "deliver"]


def symlink_loop(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
    (root / "loop_a.py").symlink_to(root / "loop_b.py")
    (root / "loop_b.py").symlink_to(root / "loop_a.py")
    return ["-f", str(root / "loop_a.py"), "outbox", "deliver"]


def workspace(text: str) -> Setup:
    def setup(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
        _file(root / "workspace.yaml", text)
        return ["-w", str(root / "workspace.yaml"), "outbox", "deliver"]

    return setup


def pyproject(text: str, *argv: str) -> Setup:
    def setup(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
        _file(root / "pyproject.toml", text)
        mp.chdir(root)
        return list(argv)

    return setup


def webhook_unset(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
    """The docs' ticket-triage example with TRIAGE_WEBHOOK_URL unset."""
    _file(root / "triage_unset_defs.py", EXAMPLE.read_text())
    mp.delenv("TRIAGE_WEBHOOK_URL", raising=False)
    mp.setenv("HELPDESK_TICKETS_URL", "http://127.0.0.1:9/")
    return ["-f", str(root / "triage_unset_defs.py"), "outbox", "deliver"]


def home(kind: str) -> Setup:
    def setup(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
        mp.delenv(DATABASE_URL_ENV)
        state = root / "state"
        if kind == "a file":
            _file(state, "not a folder")
        elif kind == "another major version":
            _file(state / "pgdata" / "PG_VERSION", "12\n")
        else:  # unreadable: a folder where the file should be
            (state / "pgdata" / "PG_VERSION").mkdir(parents=True)
        mp.setenv(HOME_ENV, str(state))
        return ["runs", "list"]

    return setup


def prices(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
    return ["prices", "set", "m", "--input", "1000000000", "--output", "1"]


def exits(root: Path, mp: pytest.MonkeyPatch) -> list[str]:
    _file(root / "exiting_defs.py", "import sys\nsys.exit(3)\n")
    return ["-f", str(root / "exiting_defs.py"), "outbox", "deliver"]


CASES: dict[str, tuple[Setup, str]] = {
    "two jobs with the same name": (two_jobs_one_name, "dup_defs.py"),
    "a symlink loop given to -f": (symlink_loop, "loop_a.py"),
    "a workspace whose top level is a list": (workspace("- python_module: x\n"), "workspace"),
    "a workspace whose load_from is a number": (workspace("load_from: 5\n"), "load_from"),
    "a workspace entry of the wrong type": (
        workspace("load_from:\n  - python_module: 5\n"),
        "python_module",
    ),
    "a workspace module_name of the wrong type": (
        workspace("load_from:\n  - python_module: {module_name: 7}\n"),
        "module_name",
    ),
    "a workspace file entry without relative_path": (
        workspace("load_from:\n  - python_file: {attribute: defs}\n"),
        "relative_path",
    ),
    "tool = 'x' in pyproject.toml, runs list": (
        pyproject('tool = "x"\n', "runs", "list", "--job", "no-such-job"),
        "pyproject.toml",
    ),
    "working_directory = 5, outbox deliver": (
        pyproject(
            '[tool.dagster]\nmodule_name = "m"\nworking_directory = 5\n', "outbox", "deliver"
        ),
        "working_directory",
    ),
    "the ticket-triage example without TRIAGE_WEBHOOK_URL": (webhook_unset, "TRIAGE_WEBHOOK_URL"),
    "IDEMPOTENT_JOBS_HOME pointing to a file": (home("a file"), "state"),
    "a pgdata of another major version": (home("another major version"), "PostgreSQL 12"),
    "an unreadable PG_VERSION": (home("unreadable"), "PG_VERSION"),
    "a price past the column": (prices, "--input: must be from 0 to below 1,000,000,000"),
    "a module calling sys.exit(3)": (exits, "sys.exit(3)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_failure_is_one_line_naming_its_cause(
    name: str,
    database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup, named = CASES[name]
    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(CODE_LOCATION_ENV, raising=False)
    monkeypatch.setattr(project_module, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    argv = setup(tmp_path, monkeypatch)
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (code, captured.out, captured.err)
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert named in lines[0], lines[0]


def test_what_a_users_module_prints_keeps_json_valid(
    database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _file(tmp_path / "chatty_defs.py", 'print("hello from my module")\n' + GOOD)
    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.setenv(TEAMS["a"]["variable"], "http://127.0.0.1:9/")
    monkeypatch.chdir(tmp_path)
    assert main(["-f", str(tmp_path / "chatty_defs.py"), "outbox", "deliver", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["delivered"] == []
    assert "hello from my module" in captured.err


@pytest.mark.slow
def test_output_piped_into_head_ends_quietly(database: str, tmp_path: Path) -> None:
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "idempotent_jobs.operator.cli", "runs", "stats"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, DATABASE_URL_ENV: database},
        cwd=tmp_path,
    )
    assert reader_gone.stdout is not None
    reader_gone.stdout.close()  # as `| head` does once it has its lines
    _, err = reader_gone.communicate(timeout=60)
    assert reader_gone.returncode == 0, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


CONTRACTS = """\
import dagster as dg

from idempotent_jobs.dagster import (
    IdempotentJobSpec, RunLedgerResource, WebhookChannel, build_idempotent_job,
)
from idempotent_jobs.dagster.resources import OpenAICompatibleModel, SampleDocumentsCollector

SPEC = IdempotentJobSpec(
    name="contract_review",
    identity_job_name="contract-review",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01"),
    subjects=["acme"],
    channels=("legal",),
)
job, schedule = build_idempotent_job(SPEC)
defs = dg.Definitions(
    jobs=[job],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")),
        "collector": SampleDocumentsCollector(),
        "model": OpenAICompatibleModel(
            base_url="http://127.0.0.1:9/v1", model="gpt-x", api_key=dg.EnvVar("CONTRACT_API_KEY")
        ),
        "legal": WebhookChannel(url=dg.EnvVar("CONTRACT_WEBHOOK_URL")),
    },
)
"""


@pytest.fixture
def contracts(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], str]:
    """A new user's own job whose model key and webhook come from variables, both unset;
    one completed run of it in the ledger."""
    from idempotent_jobs.core.identity import RunIdentity

    _file(tmp_path / "contract_defs.py", CONTRACTS)
    for name in ("CONTRACT_API_KEY", "CONTRACT_WEBHOOK_URL", CODE_LOCATION_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(DATABASE_URL_ENV, database)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))
    (tmp_path / "dagster-home").mkdir()
    monkeypatch.chdir(tmp_path)
    from datetime import UTC, datetime

    run = RunIdentity("contract-review", "acme", datetime(2026, 11, 2, tzinfo=UTC), "v1")
    with HarnessLedger(database) as ledger:
        _, lease = ledger.begin(run, "w", 60)
        assert lease is not None
        ledger.complete(ledger.checkpoint(lease, {"docs": []}), {"summary": "fine"})
    return ["-f", str(tmp_path / "contract_defs.py")], run.run_id


def test_revise_now_checks_the_environment_before_it_writes(
    contracts: tuple[list[str], str], database: str, capsys: pytest.CaptureFixture[str]
) -> None:

    location, run_id = contracts
    code = main([*location, "revise", run_id, "--reason", "new prompt", "--now"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "CONTRACT_API_KEY" in err[0], err
    with LedgerAdmin(database) as operator:
        record = operator.get(run_id)
        assert record is not None and operator.revisions(run_id) == []
        assert (record.status, record.revision, record.output) == (
            "completed",
            0,
            {"summary": "fine"},
        )


@pytest.mark.dagster_instance
def test_reconcile_needs_no_model_or_channel_secret(
    contracts: tuple[list[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    location, _ = contracts
    code = main([*location, "reconcile"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    assert "Traceback" not in captured.err and "CONTRACT_API_KEY" not in captured.err
    assert "contract_review" in captured.out
