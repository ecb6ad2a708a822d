"""A failure drill that needs no code change: make the next N model calls fail.

``idempotent-jobs drill fail-model-calls N`` writes N to ``$IDEMPOTENT_JOBS_HOME/drill/``; each
``transform`` step of this code location that is about to call the model takes one failure from
it (under a file lock, so every process of every run counts against the same N) and fails the
way an outage does, before any model call is made. ``drill off`` (or N reaching 0) ends it.
"""

import fcntl
from pathlib import Path

from idempotent_jobs.dagster.project import project_home


class ModelOutageDrill(ConnectionError):
    """A model call failed on purpose: `idempotent-jobs drill fail-model-calls` is armed."""


def drill_file() -> Path:
    return project_home() / "drill" / "fail_model_calls"


def arm(calls: int) -> Path:
    """Make the next ``calls`` model calls fail (0 turns the drill off)."""
    path = drill_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{max(0, calls)}\n")
    return path


def remaining() -> int:
    """How many model calls the drill will still fail."""
    try:
        return int(drill_file().read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def take_failure() -> bool:
    """If the drill is armed, use up one failure and return ``True``."""
    path = drill_file()
    if not path.exists():
        return False
    with path.open("r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            left = int(handle.read().strip() or 0)
        except ValueError:
            left = 0
        if left <= 0:
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"{left - 1}\n")
        return True


def fail_if_drilled() -> None:
    """Raise :class:`ModelOutageDrill` when the drill takes this call."""
    if take_failure():
        raise ModelOutageDrill(
            f"model outage drill: this call failed on purpose ({remaining()} more will)"
        )
