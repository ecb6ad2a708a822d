"""Dagster glue: the ledger resource, the job spec and factory, ops, partitions, resources.

What a job of your own needs is importable from here (loaded on first use, so that importing a
submodule such as ``idempotent_jobs.dagster.ticket`` does not import Dagster)::

    from idempotent_jobs.dagster import IdempotentJobSpec, build_idempotent_job, ModelStep
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idempotent_jobs.dagster.batch_lane import BatchRange, build_batch_lane
    from idempotent_jobs.dagster.component import IdempotentJob
    from idempotent_jobs.dagster.job_factory import build_idempotent_job
    from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
    from idempotent_jobs.dagster.ledger_io import ledger_io_manager
    from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
    from idempotent_jobs.dagster.resource import RunLedgerResource
    from idempotent_jobs.dagster.resources import (
        AnthropicModel,
        Collector,
        JsonLinesChannel,
        ModelStep,
        NotificationChannel,
        OpenAICompatibleModel,
        StepContext,
        StructuredModel,
        WebhookChannel,
    )
    from idempotent_jobs.dagster.retention_job import build_retention_job
    from idempotent_jobs.dagster.shadow_lane import build_shadow_sensor
    from idempotent_jobs.shadows.job import ShadowRule

_HOMES = {
    "BatchRange": "batch_lane",
    "build_batch_lane": "batch_lane",
    "IdempotentJob": "component",
    "IdempotentJobSpec": "job_spec",
    "build_idempotent_job": "job_factory",
    "build_reconciliation_job": "reconciliation_job",
    "build_retention_job": "retention_job",
    "ledger_io_manager": "ledger_io",
    "RunLedgerResource": "resource",
    "ShadowRule": "shadow_lane",
    "build_shadow_sensor": "shadow_lane",
    **dict.fromkeys(
        (
            "AnthropicModel",
            "Collector",
            "JsonLinesChannel",
            "ModelStep",
            "NotificationChannel",
            "OpenAICompatibleModel",
            "StepContext",
            "StructuredModel",
            "WebhookChannel",
        ),
        "resources",
    ),
}

__all__ = [
    "AnthropicModel",
    "BatchRange",
    "Collector",
    "IdempotentJob",
    "IdempotentJobSpec",
    "JsonLinesChannel",
    "ModelStep",
    "NotificationChannel",
    "OpenAICompatibleModel",
    "RunLedgerResource",
    "ShadowRule",
    "StepContext",
    "StructuredModel",
    "WebhookChannel",
    "build_batch_lane",
    "build_idempotent_job",
    "build_reconciliation_job",
    "build_shadow_sensor",
    "build_retention_job",
    "ledger_io_manager",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'idempotent_jobs.dagster' has no attribute {name!r}")
    return getattr(import_module(f"idempotent_jobs.dagster.{home}"), name)


def __dir__() -> list[str]:  # what `dg list components` looks through
    return sorted({*globals(), *__all__})
