"""The Dagster instance the operator tools use: ``$DAGSTER_HOME`` as it is, else the project's own.

A user's instance configuration is never written: with ``DAGSTER_HOME`` set, its folder and its
``dagster.yaml`` are used untouched. Only when it is unset does the project get a home of its own
(``.idempotent_jobs/dagster_home``), and a ``dagster.yaml`` is written there only if none exists:
Dagster's storage on the ledger's PostgreSQL, run retries and run monitoring on.
"""

import os
from pathlib import Path
from urllib.parse import quote, urlencode

from idempotent_jobs.core.database import parse_database_url
from idempotent_jobs.core.project_paths import keep_out_of_git, project_home

DAGSTER_HOME_ENV = "DAGSTER_HOME"
DAGSTER_STORAGE_URL_ENV = "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL"

#: What the project's own DAGSTER_HOME starts with (the repository's top-level dagster.yaml says
#: the same, for ``dagster dev`` run there).
DEFAULT_DAGSTER_YAML = """\
# Written by idempotent-jobs into the project's own DAGSTER_HOME (never over an existing file).
# Dagster's run, event-log and schedule storage on the ledger's PostgreSQL: the commands set
# IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL (a postgresql+psycopg2:// URL of the same database).
storage:
  postgres:
    postgres_url:
      env: IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL
run_retries:
  enabled: true
  max_retries: 2
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  poll_interval_seconds: 30
telemetry:
  enabled: false
"""


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


def prepare_dagster_home() -> Path:
    """The Dagster home to use, exported as ``DAGSTER_HOME``: the user's, untouched, when set;
    else the project's own, created with :data:`DEFAULT_DAGSTER_YAML` the first time."""
    configured = os.environ.get(DAGSTER_HOME_ENV)
    if configured:
        return Path(configured).resolve()
    keep_out_of_git(project_home())
    home = (project_home() / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DEFAULT_DAGSTER_YAML, encoding="utf-8")
    os.environ[DAGSTER_HOME_ENV] = str(home)
    return home
