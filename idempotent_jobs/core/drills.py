"""Failure drills, taken by every model call of the shared steps (both drivers).

``idempotent-jobs drill fail-model-calls N [--job X]`` arms a drill in the ledger, so every
worker of every deployment sees it. Each model call of that job (or of every job) takes one
failure from it, under the drill row's lock, and fails the way an outage does, before the call
is made: the attempt ends ``drill`` and no call or token is counted. Whether a drill is armed
comes back with the claim (``Lease.drill_armed``), so a run with none armed costs no statement
more; a drill armed after the claim is taken by the next claim's calls.
"""

from idempotent_jobs.core.errors import DrilledFailure
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease


class ModelOutageDrill(DrilledFailure, ConnectionError):
    """A model call failed on purpose: `idempotent-jobs drill fail-model-calls` is armed."""


def fail_if_drilled(ledger: RunLedger, job_name: str) -> None:
    """Raise :class:`ModelOutageDrill` when an armed drill of ``job_name`` (the identity job
    name, normalised as the drill was armed) takes this call."""
    left = ledger.take_drill(normalize_text(job_name))
    if left is not None:
        raise ModelOutageDrill(
            f"model outage drill: this call failed on purpose ({left} more will)"
        )


def take_drill(ledger: RunLedger, lease: Lease, job_name: str) -> None:
    """:func:`fail_if_drilled`, unless the lease's claim saw no drill armed (no statement)."""
    if lease.drill_armed is not False:
        fail_if_drilled(ledger, job_name)
