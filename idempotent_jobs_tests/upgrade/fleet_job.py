"""A team's job as both releases of the rolling-upgrade test run it (copied into a folder
outside the repository, loaded by each release's own ``idempotent-jobs -f``): per region and
day, ask the model once and post the answer once. Only the public API, as a user writes it."""

import json
import urllib.request
from typing import Any

import dagster as dg

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity
from idempotent_jobs.dagster import (
    Collector,
    IdempotentJobSpec,
    ModelStep,
    RunLedgerResource,
    StepContext,
    WebhookChannel,
    build_idempotent_job,
)


class RegionDay(Collector):
    """What the model is asked about: the region and the day."""

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"region": identity.subject_id, "day": str(identity.scheduled_at.date())}


class RemoteModel(ModelStep):
    """The model, behind a local fake provider that counts every call it is paid for."""

    url: str

    @property
    def model_name(self) -> str:
        return "fleet-model"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        request = urllib.request.Request(
            self.url,
            data=json.dumps({"job": "fleet-digest", **raw_input}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310
            body = json.load(answer)
        usage = ModelUsage(self.model_name, body["input_tokens"], body["output_tokens"])
        return ModelAnswer({"summary": body["summary"]}, usage)


def has_summary(output: dict[str, Any]) -> bool:
    return isinstance(output.get("summary"), str)


def digest(identity: RunIdentity, output: dict[str, Any]) -> dict[str, Any]:
    return {"region": identity.subject_id, **output}


FLEET_DIGEST = IdempotentJobSpec(
    name="fleet_digest",
    identity_job_name="fleet-digest",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01"),
    subjects=["emea", "amer", "apac"],
    prompt="Summarise the region's day.",
    collector="region_day",
    model="remote_model",
    validate=has_summary,
    payload=digest,
    channels=("hook",),
)

fleet_digest_job, fleet_digest_schedule = build_idempotent_job(FLEET_DIGEST)

defs = dg.Definitions(
    jobs=[fleet_digest_job],
    schedules=[fleet_digest_schedule],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")),
        "region_day": RegionDay(),
        "remote_model": RemoteModel(url=dg.EnvVar("FLEET_MODEL_URL")),
        "hook": WebhookChannel(url=dg.EnvVar("FLEET_HOOK_URL")),
    },
)
