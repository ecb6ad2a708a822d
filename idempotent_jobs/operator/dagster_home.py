"""A DAGSTER_HOME for this project: the project's dagster.yaml under ``.idempotent_jobs/``."""

import os
import shutil
from pathlib import Path

from idempotent_jobs.dagster.project import CHECKOUT, project_home, project_root

PACKAGE_ROOT = CHECKOUT


def project_dagster_yaml() -> Path:
    for candidate in (project_root() / "dagster.yaml", PACKAGE_ROOT / "dagster.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("dagster.yaml not found in the working directory or project root")


def prepare_dagster_home(home: Path | None = None) -> Path:
    """Create (or refresh) the Dagster home with the project's dagster.yaml and export it."""
    home = (
        home or Path(os.environ.get("DAGSTER_HOME") or project_home() / "dagster_home")
    ).resolve()
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(project_dagster_yaml(), home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home
