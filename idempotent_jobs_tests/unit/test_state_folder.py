"""The project's state folder (``.idempotent_jobs``: the embedded PostgreSQL's files, the
project's Dagster home) keeps itself out of the project's git."""

import subprocess
from pathlib import Path

import pytest

from idempotent_jobs.core.project_paths import HOME_ENV
from idempotent_jobs.operator.dagster_home import DAGSTER_HOME_ENV, prepare_dagster_home


def test_the_state_folder_is_ignored_by_the_projects_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "my-project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "my-project"\n\n[tool.dagster]\nmodule_name = "my_defs"\n'
    )
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    monkeypatch.chdir(project)
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.delenv(DAGSTER_HOME_ENV, raising=False)
    home = prepare_dagster_home()
    assert home == project / ".idempotent_jobs" / "dagster_home"
    assert (home / "dagster.yaml").exists()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".idempotent_jobs" not in status and "pyproject.toml" in status
