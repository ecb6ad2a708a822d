"""The code location of ``bench_launched.py``: the factory's job, and the same four ops without
the ledger (the baseline), on the same trivial collector, model and channel.

The ledger's database comes from ``IDEMPOTENT_JOBS_DATABASE_URL``.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.protocol import ModelAnswer
from idempotent_jobs.core.records import ModelUsage, OutboxRecord
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import Collector, ModelStep, NotificationChannel
from idempotent_jobs.dagster.resources.steps import StepContext

SUBJECT = "bench"
WINDOW = dg.DailyPartitionsDefinition(start_date="2025-01-01")


class TrivialCollector(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"subject": identity.subject_id, "documents": ["one document"]}


class TrivialModel(ModelStep):
    @property
    def model_name(self) -> str:
        return "trivial"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        return ModelAnswer({"summary": "s"}, ModelUsage("trivial", 1, 1))


class NullChannel(NotificationChannel):
    def send(self, row: OutboxRecord) -> None:
        pass


SPEC = IdempotentJobSpec(
    name="bench_ledger_job",
    identity_job_name="bench-ledger-job",
    version="v1",
    window=WINDOW,
    subjects=[SUBJECT],
    channels=("null_channel",),
)
ledger_job, _ = build_idempotent_job(SPEC)


def _identity(context: dg.OpExecutionContext) -> RunIdentity:
    return SPEC.identity_for(context.partition_key)


@dg.op(required_resource_keys={"collector"})
def collect(context: dg.OpExecutionContext) -> dict[str, Any]:
    return context.resources.collector.collect(_identity(context))  # type: ignore[no-any-return]


@dg.op(required_resource_keys={"model"})
def transform(context: dg.OpExecutionContext, raw: dict[str, Any]) -> dict[str, Any]:
    step = StepContext(_identity(context), SPEC.prompt, _identity(context).run_id, context.run_id)
    answer: ModelAnswer = context.resources.model.generate(raw, step)
    return answer.output


@dg.op
def persist(context: dg.OpExecutionContext, answer: dict[str, Any]) -> dict[str, Any]:
    SPEC.validate(answer)
    return SPEC.payload(_identity(context), answer)


@dg.op(required_resource_keys={"null_channel"})
def deliver(context: dg.OpExecutionContext, payload: dict[str, Any]) -> None:
    row = OutboxRecord(
        run_id=_identity(context).run_id,
        channel="null_channel",
        payload=payload,
        created_at=datetime.now(UTC),
        delivered_at=None,
        delivery_attempts=0,
        last_error=None,
    )
    context.resources.null_channel.send(row)


@dg.job(
    name="bench_baseline_job",
    partitions_def=SPEC.partitions_def,
    executor_def=dg.in_process_executor,
)
def baseline_job() -> None:
    """The same four ops, the same work, no ledger."""
    deliver(persist(transform(collect())))


defs = dg.Definitions(
    jobs=[ledger_job, baseline_job],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "collector": TrivialCollector(),
        "model": TrivialModel(),
        "null_channel": NullChannel(),
    },
)
