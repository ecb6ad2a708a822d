"""Where this Dagster project keeps its state, and Dagster's storage URL for the ledger's database.

``project_root`` finds the project from the working directory, so ``dagster dev``'s processes (which
run inside DAGSTER_HOME) and a Celery worker started anywhere agree on one folder.
"""

import os
from pathlib import Path
from urllib.parse import quote, urlencode

from idempotent_jobs.core.database import parse_database_url

DAGSTER_STORAGE_URL_ENV = "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL"
HOME_ENV = "IDEMPOTENT_JOBS_HOME"
# The source checkout this package is in (the folder above ``idempotent_jobs/``).
CHECKOUT = Path(__file__).resolve().parent.parent.parent


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
    return CHECKOUT if (CHECKOUT / PROJECT_MARKER).is_file() else here


def project_home() -> Path:
    """The folder for local state (embedded database, Dagster home, the notifications file):
    ``$IDEMPOTENT_JOBS_HOME``, else ``.idempotent_jobs`` in :func:`project_root`. Git-ignored."""
    return Path(os.environ.get(HOME_ENV) or project_root() / ".idempotent_jobs").resolve()
