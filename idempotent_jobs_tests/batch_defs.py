"""A code location for the batch lane's system test: a job of 5 subjects by day, its batch job
and its sensor (on, ticking every second), a model step on the fake OpenAI server at
``$IJ_FAKE_OPENAI_URL`` and notifications to ``$IJ_TEST_NOTIFICATIONS``."""

from typing import Any

import dagster as dg

from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.dagster import (
    IdempotentJobSpec,
    OpenAICompatibleModel,
    RunLedgerResource,
    build_batch_lane,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string"}},
    "required": ["label"],
}


class Tickets(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"tickets": [f"{identity.subject_id} {identity.scheduled_at:%Y-%m-%d}"]}


def has_label(output: dict[str, Any]) -> bool:
    return bool(output.get("label"))


SPEC = IdempotentJobSpec(
    name="ticket_labels",
    identity_job_name="ticket-labels",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-12-01"),
    subjects=["emea", "amer", "apac", "nordics", "iberia"],
    validate=has_label,
)
JOB, SCHEDULE = build_idempotent_job(SPEC)
BATCH_JOB, SENSOR = build_batch_lane(
    SPEC, minimum_interval_seconds=1, sensor_status=dg.DefaultSensorStatus.RUNNING
)

defs = dg.Definitions(
    jobs=[JOB, BATCH_JOB],
    sensors=[SENSOR],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "collector": Tickets(),
        "model": OpenAICompatibleModel(
            model="gpt-4o-mini",
            api_key="sk-local-fake",
            base_url=dg.EnvVar("IJ_FAKE_OPENAI_URL"),
            output_schema="idempotent_jobs_tests.batch_defs:LABEL",
        ),
        "report_file": JsonLinesChannel(path=dg.EnvVar("IJ_TEST_NOTIFICATIONS")),
    },
)
