"""Failure drills for Dagster's steps: the core's (:mod:`idempotent_jobs.core.drills`), which
every model call of both drivers takes; kept here for code that imported them from here."""

from collections.abc import Callable

from idempotent_jobs.core.drills import ModelOutageDrill, fail_if_drilled
from idempotent_jobs.core.ledger import RunLedger


def drill_for(ledger: RunLedger, job_name: str) -> Callable[[], None]:
    """A ``before_call`` check raising :class:`ModelOutageDrill` when an armed drill of
    ``job_name`` takes this call (the shared steps take drills themselves: see
    :func:`~idempotent_jobs.core.steps.call_model`'s ``drill_job``)."""
    return lambda: fail_if_drilled(ledger, job_name)


__all__ = ["ModelOutageDrill", "drill_for"]
