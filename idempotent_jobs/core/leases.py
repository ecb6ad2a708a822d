"""Getting a lease: claim now, wait for the holder, or take over a lease handed on by a step."""

import time

from idempotent_jobs.core.errors import LeaseLostError, RunNotFoundError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease, RunRecord

MAX_POLL_SECONDS = 2.0


def acquire(
    ledger: RunLedger,
    run_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    wait_seconds: float = 0.0,
    caller_run_id: str | None = None,
    caller_step: str | None = None,
) -> Lease | RunRecord:
    """Claim the run, polling for up to ``wait_seconds`` while another worker holds it.

    Returns the new :class:`Lease`, or the run's current record when no lease was had: a
    ``completed`` record (reuse its output) or, once the wait is over, a ``running`` one.
    """
    deadline = time.monotonic() + wait_seconds
    pause = 0.1
    while True:
        lease = ledger.claim(
            run_id, worker_id, lease_seconds, caller_run_id=caller_run_id, caller_step=caller_step
        )
        if lease is not None:
            return lease
        record = ledger.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        remaining = deadline - time.monotonic()
        if record.status == "completed" or remaining <= 0:
            return record
        # Waiting on another process's lease: poll the database, backing off.
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, MAX_POLL_SECONDS)


def take_over(
    ledger: RunLedger,
    run_id: str,
    handed: Lease | None,
    worker_id: str,
    lease_seconds: float,
    *,
    wait_seconds: float = 0.0,
    caller_run_id: str | None = None,
    caller_step: str | None = None,
) -> Lease | RunRecord:
    """Continue under the lease an earlier step handed on (same epoch), or else claim anew.

    The hand-over works across processes because the owner and epoch, not the process, are
    the capability. If there is no handed lease, or it was lost, this worker claims the run
    itself (next epoch), waiting up to ``wait_seconds`` for another holder; see :func:`acquire`.
    """
    if handed is not None:
        try:
            return ledger.renew(handed)
        except LeaseLostError:
            pass
    return acquire(
        ledger,
        run_id,
        worker_id,
        lease_seconds,
        wait_seconds=wait_seconds,
        caller_run_id=caller_run_id,
        caller_step=caller_step,
    )
