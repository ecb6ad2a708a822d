"""The Dagster code location: one ``Definitions`` assembled from sibling modules."""

import dagster as dg

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import (
    JsonLinesChannel,
    LocalExtractiveSummarizer,
    SampleDocumentsCollector,
)
from idempotent_jobs.dagster.retention_job import build_retention_job
from idempotent_jobs.location.jobs import JOB_SPECS

built = [build_idempotent_job(spec) for spec in JOB_SPECS]
built.append(build_reconciliation_job(JOB_SPECS))
built.append(build_retention_job(JOB_SPECS))

defs = dg.Definitions(
    jobs=[job for job, _ in built],
    schedules=[schedule for _, schedule in built],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "model": LocalExtractiveSummarizer(),
        "collector": SampleDocumentsCollector(),
        "report_file": JsonLinesChannel(),
    },
)
