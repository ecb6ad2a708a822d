"""Two teams on one ledger: each side effect goes to the receiver of the job that made it.

Two projects outside this repository, each a code location of its own with a ``report`` webhook
channel pointing at its own receiver, share one ledger. Their ``outbox deliver`` commands run at
the same time, as real processes; each receiver must get exactly its own job's keys, once each.
A workspace file naming both locations keeps their channels apart too.
"""

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from idempotent_jobs import RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.cli import main
from idempotent_jobs.operator.location_targets import CODE_LOCATION_ENV
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.ledgers import HarnessLedger

DEFINITIONS = """\
import dagster as dg

from idempotent_jobs.dagster import (
    IdempotentJobSpec, RunLedgerResource, WebhookChannel, build_idempotent_job,
)
from idempotent_jobs.dagster.resources import LocalExtractiveSummarizer, SampleDocumentsCollector

SPEC = IdempotentJobSpec(
    name="{job}",
    identity_job_name="{identity}",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01"),
    subjects=["north", "south"],
    channels=("report",),
)
job, schedule = build_idempotent_job(SPEC)
defs = dg.Definitions(
    jobs=[job],
    resources={{
        "ledger": RunLedgerResource(database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")),
        "collector": SampleDocumentsCollector(),
        "model": LocalExtractiveSummarizer(),
        "report": WebhookChannel(url=dg.EnvVar("{variable}")),
    }},
)
"""

TEAMS = {
    "a": {"job": "weekly_report", "identity": "team-a-report", "variable": "TEAM_A_REPORT_URL"},
    "b": {"job": "weekly_report", "identity": "team-b-report", "variable": "TEAM_B_REPORT_URL"},
}


def write_project(root: Path, team: str) -> Path:
    folder = root / f"team-{team}"
    folder.mkdir()
    module = f"team_{team}_defs"
    (folder / f"{module}.py").write_text(DEFINITIONS.format(**TEAMS[team]))
    (folder / "pyproject.toml").write_text(f'[tool.dagster]\nmodule_name = "{module}"\n')
    return folder


def plant(ledger: HarnessLedger, identity_job: str, days: int, first: int = 1) -> list[str]:
    """Completed runs of ``identity_job``, each with a pending ``report`` row: their keys."""
    keys = []
    for day in range(first, first + days):
        for subject in ("north", "south"):
            run = RunIdentity(identity_job, subject, datetime(2026, 11, day, tzinfo=UTC), "v1")
            _, lease = ledger.begin(run, "planter", 60)
            assert lease is not None
            lease = ledger.checkpoint(lease, {"n": day})
            ledger.complete(lease, {"summary": "s"}, {"report": {"day": day}})
            keys.append(f"{run.run_id}:report")
    return keys


@pytest.fixture
def teams(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, tuple[Path, Receiver]]:
    receivers = {team: Receiver() for team in TEAMS}
    for team, receiver in receivers.items():
        monkeypatch.setenv(TEAMS[team]["variable"], receiver.url)
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", database)
    monkeypatch.setenv("IDEMPOTENT_JOBS_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(CODE_LOCATION_ENV, raising=False)
    return {team: (write_project(tmp_path, team), receivers[team]) for team in TEAMS}


def deliver(folder: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "idempotent_jobs.operator.cli", *argv, "outbox", "deliver"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_teams_delivering_at_once_each_reach_only_their_own_receiver(
    teams: dict[str, tuple[Path, Receiver]], ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    keys = {team: plant(ledger, TEAMS[team]["identity"], days=6) for team in TEAMS}
    # Team A alone first: B's rows stay pending, and A is told so in one line.
    (folder_a, receiver_a), (folder_b, receiver_b) = teams["a"], teams["b"]
    first = deliver(folder_a, "--connect-timeout", "10")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "left pending: 12 row(s) of job team-b-report" in out
    assert set(receiver_a.effects) == set(keys["a"]) and not receiver_b.requests
    # More rows for both, then both teams deliver at the same time.
    more = {team: plant(ledger, TEAMS[team]["identity"], days=6, first=7) for team in TEAMS}
    racing = [deliver(folder) for folder in (folder_a, folder_b, folder_a, folder_b)]
    for process in racing:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    for team, (_, receiver) in teams.items():
        assert set(receiver.requests) == set(keys[team] + more[team]), team
        assert all(n == 1 for n in receiver.effects.values()), team
    assert operator.outbox(pending_only=True) == []


def test_a_workspace_of_two_locations_keeps_their_channels_apart(
    teams: dict[str, tuple[Path, Receiver]],
    ledger: HarnessLedger,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = {team: plant(ledger, TEAMS[team]["identity"], days=1) for team in TEAMS}
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        textwrap.dedent(
            """\
            load_from:
              - python_module: {module_name: team_a_defs, working_directory: team-a}
              - python_module: {module_name: team_b_defs, working_directory: team-b}
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["-w", str(workspace), "outbox", "deliver", "--job", "team-b-report"]) == 0
    out = capsys.readouterr().out
    assert "left pending: 2 row(s) of job team-a-report, which --job does not name" in out
    assert set(teams["b"][1].requests) == set(keys["b"]) and not teams["a"][1].requests
    assert main(["-w", str(workspace), "outbox", "deliver"]) == 0
    for team, (_, receiver) in teams.items():
        assert set(receiver.requests) == set(keys[team]), team


def test_a_missing_channel_variable_is_one_line_naming_it(
    teams: dict[str, tuple[Path, Receiver]],
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plant(ledger, TEAMS["a"]["identity"], days=1)
    monkeypatch.delenv(TEAMS["a"]["variable"])
    monkeypatch.chdir(teams["a"][0])
    assert main(["outbox", "deliver"]) == 2
    err = capsys.readouterr().err
    assert TEAMS["a"]["variable"] in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert len(operator.outbox(pending_only=True)) == 2
