"""Every default path is the same however the code location is started: from the project, from
inside DAGSTER_HOME (where `dagster dev` runs its processes), or from anywhere else."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from idempotent_jobs.core.project_paths import HOME_ENV, project_home, project_root
from idempotent_jobs.dagster.resources import JsonLinesChannel

CHECKOUT = Path(__file__).resolve().parents[2]


def default_notifications_file(cwd: Path) -> str:
    """What a fresh process started in ``cwd`` (no IDEMPOTENT_JOBS_HOME) writes to."""
    env = {k: v for k, v in os.environ.items() if k != HOME_ENV}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from idempotent_jobs.dagster.resources import JsonLinesChannel;"
            "print(JsonLinesChannel().target())",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def test_a_project_is_found_from_inside_its_dagster_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "my-project"
    dagster_home = project / ".idempotent_jobs" / "dagster_home"
    dagster_home.mkdir(parents=True)
    (project / "workspace.yaml").write_text("load_from: []\n")
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(project)
    at_root = JsonLinesChannel().target()
    monkeypatch.chdir(dagster_home)
    assert project_root() == project
    assert project_home() == project / ".idempotent_jobs"
    assert (
        JsonLinesChannel().target()
        == at_root
        == project / ".idempotent_jobs" / ("notifications.jsonl")
    )


def test_anywhere_else_the_checkout_is_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install of this repository: its checkout is the project (a wheel's is not,
    see test_outside_a_project_nothing_is_started)."""
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert project_home() == CHECKOUT / ".idempotent_jobs"


def test_a_pyproject_with_a_dagster_block_makes_a_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "leads"
    (project / "src" / "leads").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.dagster]\nmodule_name = "leads.defs"\n')
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "not-dagster"\n')
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(project / "src" / "leads")
    assert project_root() == project


def test_outside_a_project_nothing_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As with a wheel install: no project here or above, no database URL. The command says so
    (exit 2) and starts no server, creates no folder."""
    from idempotent_jobs.core import project_paths as project_module
    from idempotent_jobs.core.database import DATABASE_URL_ENV
    from idempotent_jobs.operator.cli import main

    monkeypatch.setattr(project_module, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for argv in (["runs", "list"], ["db", "url"], ["drill", "fail-model-calls", "1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "is not inside a Dagster project" in err and "Traceback" not in err, argv
    assert list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_fresh_processes_in_different_directories_agree(tmp_path: Path) -> None:
    inside = CHECKOUT / ".idempotent_jobs" / "dagster_home"
    inside.mkdir(parents=True, exist_ok=True)
    expected = str(CHECKOUT / ".idempotent_jobs" / "notifications.jsonl")
    for cwd in (CHECKOUT, inside, tmp_path):
        assert default_notifications_file(cwd) == expected, cwd


def test_the_variable_wins_and_commands_pass_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotent_jobs.core.database import DATABASE_URL_ENV
    from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV
    from idempotent_jobs.operator.embedded import ensure_database_url

    monkeypatch.delenv(DAGSTER_STORAGE_URL_ENV, raising=False)  # restored after the test
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "state"))
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://u@127.0.0.1:9/x")
    monkeypatch.chdir(tmp_path)
    assert JsonLinesChannel().target() == tmp_path / "state" / "notifications.jsonl"
    monkeypatch.delenv(HOME_ENV)
    ensure_database_url()  # what every command (and `dev`, before `dagster dev`) does
    assert os.environ[HOME_ENV] == str(CHECKOUT / ".idempotent_jobs")
