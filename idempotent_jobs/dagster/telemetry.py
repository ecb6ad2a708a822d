"""A span per Dagster step, under which the protocol's step spans nest.

Dagster has no OpenTelemetry of its own, so each op of an idempotent job opens one span,
``dagster step <op>``, with the Dagster run, job, step, partition and retry as attributes, and
works on its ledger run in :func:`~idempotent_jobs.core.telemetry.run_scope`. When the op runs
inside a span of the caller's, it nests under it; otherwise every step of one Dagster run joins
one trace whose id is the Dagster run id (a UUID; without its dashes), so a trace is found by
the run id the Dagster UI shows, whichever process or pod ran each step.
"""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import dagster as dg

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.dagster.op_frame import OpFrame


@contextmanager
def step_span(frame: OpFrame) -> Iterator[Any]:
    """The span of this Dagster step (``None`` without an SDK), with the step's ledger run as
    the run scope of everything under it."""
    if not telemetry.active():  # no SDK: nothing to name
        yield None
        return
    context = frame.context
    try:
        identity: RunIdentity | None = frame.identity
    except (LedgerError, dg.DagsterInvariantViolationError):
        identity = None
    scope = (
        telemetry.run_scope(
            identity.run_id,
            identity.job_name,
            identity.subject_id,
            identity.scheduled_at.isoformat(),
            identity.version,
        )
        if identity is not None
        else nullcontext()
    )
    with scope:
        if not telemetry.tracing():
            yield None
            return
        attributes: dict[str, str | int] = {
            "dagster.run_id": context.run_id,
            "dagster.job_name": context.job_name,
            "dagster.step_key": context.op.name,
            "dagster.partition_key": str(context.partition_key),
            "dagster.retry_number": context.retry_number,
        }
        name = f"dagster step {context.op.name}"
        with telemetry.joined_trace(context.run_id), telemetry.span(name, attributes) as span:
            yield span
