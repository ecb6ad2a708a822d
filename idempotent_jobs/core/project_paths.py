"""Where a project keeps its local state: its root, found from the working directory, and its
state folder (``.idempotent_jobs``: the embedded database, Dagster's home, the notifications file).

``project_root`` finds the project from the working directory, so ``dagster dev``'s processes (which
run inside DAGSTER_HOME), a Celery worker started anywhere and the CLI agree on one folder. Plain
paths, no Dagster: the operator tools and the notification channel's default file both need them.
"""

import os
import tomllib
from pathlib import Path

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.errors import InvalidInputError

HOME_ENV = "IDEMPOTENT_JOBS_HOME"
# The source checkout this package is in (the folder above ``idempotent_jobs/``).
CHECKOUT = Path(__file__).resolve().parents[2]


PROJECT_MARKER = "workspace.yaml"
_MARKERS = ("workspace.yaml", "workspace.yml", "dg.toml", ".idempotent_jobs")


class ProjectNotFoundError(InvalidInputError):
    """Not inside a Dagster project, so there is no project database or state folder to use."""

    def __init__(self, here: Path) -> None:
        super().__init__(
            "project",
            f"{here} is not inside a Dagster project (no pyproject.toml with [tool.dagster] or "
            "[tool.dg], dg.toml, workspace.yaml or .idempotent_jobs/ here or above): run the "
            f"command in your project, or set {DATABASE_URL_ENV} (the ledger's database) or "
            f"{HOME_ENV} (the folder of the project's embedded database and state)",
        )


def _has_dagster_block(pyproject: Path) -> bool:
    try:
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False
    tool = config.get("tool", {})
    return isinstance(tool, dict) and any(isinstance(tool.get(k), dict) for k in ("dagster", "dg"))


def find_project_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (the working directory) that is a Dagster
    project: a ``workspace.yaml`` or ``dg.toml``, a ``pyproject.toml`` with ``[tool.dagster]``
    or ``[tool.dg]`` (a ``create-dagster`` project), or this
    package's ``.idempotent_jobs`` state folder. Else the source checkout this package runs from,
    if that is a project (an editable install of this repository); else ``None``."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in _MARKERS):
            return folder
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and _has_dagster_block(pyproject):
            return folder
    return CHECKOUT if (CHECKOUT / PROJECT_MARKER).is_file() else None


def project_root() -> Path:
    """The Dagster project this process works for (see :func:`find_project_root`); raise
    :class:`ProjectNotFoundError` outside any. ``dagster dev``'s processes run inside
    DAGSTER_HOME (under ``.idempotent_jobs/``) and find the same project."""
    root = find_project_root()
    if root is None:
        raise ProjectNotFoundError(Path.cwd().resolve())
    return root


def project_home() -> Path:
    """The folder for local state (embedded database, Dagster home, the notifications file):
    ``$IDEMPOTENT_JOBS_HOME``, else ``.idempotent_jobs`` in :func:`project_root` (a
    ``.gitignore`` in it keeps it out of the project's git: :func:`keep_out_of_git`). Outside a
    project, without the variable: :class:`ProjectNotFoundError` (never a new folder, never a
    new database)."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).resolve()
    return (project_root() / ".idempotent_jobs").resolve()


#: What keeps the state folder out of a project's git (written once, inside the folder).
STATE_GITIGNORE = (
    "# idempotent-jobs' local state (embedded PostgreSQL, Dagster home): not code\n*\n"
)


def keep_out_of_git(folder: Path) -> None:
    """Create ``folder``'s parents and, when the folder is the project's state folder (the
    default ``.idempotent_jobs``), a ``.gitignore`` in it that ignores everything in it, so a
    project's ``git add .`` never takes its database files."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.name != ".idempotent_jobs":
        return
    ignore = folder / ".gitignore"
    if not ignore.exists():
        try:
            ignore.write_text(STATE_GITIGNORE, encoding="utf-8")
        except OSError:  # a read-only checkout: git status shows it, nothing breaks
            pass
