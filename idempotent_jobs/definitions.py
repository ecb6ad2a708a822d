"""The Dagster code location: one ``Definitions`` assembled from sibling modules."""

import dagster as dg

from idempotent_jobs.database import DATABASE_URL_ENV
from idempotent_jobs.ledger import RunLedger

defs = dg.Definitions(
    resources={"ledger": RunLedger(database_url=dg.EnvVar(DATABASE_URL_ENV))},
)
