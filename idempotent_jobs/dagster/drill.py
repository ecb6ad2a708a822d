"""A failure drill that needs no code change: make the next N model calls of a job fail.

``idempotent-jobs drill fail-model-calls N [--job X]`` arms it in the ledger, so every worker of
every deployment sees the same drill. Each ``transform`` step of that job (or of every job) that
is about to call the model takes one failure from it, under the drill row's lock, and fails the
way an outage does, before any model call is made: the attempt ends with the outcome ``drill``,
and no model call or token is counted. The drill ends by itself when N is used up or when it
expires (``--expires-in``, one hour by default); ``drill off`` ends it at once; ``doctor`` shows
it while it is armed.
"""

from collections.abc import Callable

from idempotent_jobs.core.errors import DrilledFailure
from idempotent_jobs.core.ledger import RunLedger


class ModelOutageDrill(DrilledFailure, ConnectionError):
    """A model call failed on purpose: `idempotent-jobs drill fail-model-calls` is armed."""


def drill_for(ledger: RunLedger, job_name: str) -> Callable[[], None]:
    """The check a ``transform`` step runs before its model call: raise
    :class:`ModelOutageDrill` when an armed drill of ``job_name`` takes this call."""

    def fail_if_drilled() -> None:
        left = ledger.take_drill(job_name)
        if left is not None:
            raise ModelOutageDrill(
                f"model outage drill: this call failed on purpose ({left} more will)"
            )

    return fail_if_drilled
