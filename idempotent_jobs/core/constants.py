"""Names and defaults shared by the library, the Dagster jobs and the command line, defined once.

A module of plain values: importing it imports nothing else, so the command line's parser can
use it without loading psycopg or Dagster.
"""

#: The environment variable holding the ledger's PostgreSQL URL (with a password: an EnvVar).
DATABASE_URL_ENV = "IDEMPOTENT_JOBS_DATABASE_URL"
#: The PostgreSQL schema of a ledger unless told otherwise.
DEFAULT_SCHEMA = "idempotent_jobs"
#: Every status a run can have (``records.RunStatus``; a test keeps the two the same).
RUN_STATUSES: tuple[str, ...] = ("pending", "running", "completed", "failed")
#: Health checks (doctor, reconcile, the reconciliation job): an undelivered notification older
#: than this is a problem; a failed run with this many attempts is a problem.
DEFAULT_OUTBOX_AGE_SECONDS = 900.0
DEFAULT_MAX_ATTEMPTS = 3
