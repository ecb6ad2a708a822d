"""One way a test builds the job spec it runs: the defaults every test job shares written once,
and only what the test is about written in the test."""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from idempotent_jobs.dagster import IdempotentJobSpec


def job_spec(
    name: str,
    *,
    subjects: Sequence[str] = ("acme",),
    start: str = "2026-08-01",
    **options: Any,
) -> IdempotentJobSpec:
    """A test's job spec: the Dagster job ``name``, its identity job name the same with dashes,
    version ``v1``, daily windows from ``start`` for ``subjects``, a 30-second lease and no op
    retries; any other option of :class:`IdempotentJobSpec` as given (each of these too)."""
    settings: dict[str, Any] = {
        "identity_job_name": name.replace("_", "-"),
        "version": "v1",
        "window": dg.DailyPartitionsDefinition(start_date=start),
        "lease_seconds": 30.0,
        "model_retry": dg.RetryPolicy(max_retries=0),
        **options,
    }
    return IdempotentJobSpec(name=name, subjects=list(subjects), **settings)


__all__ = ["job_spec"]
