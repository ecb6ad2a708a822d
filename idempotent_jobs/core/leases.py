"""Getting a lease: claim now, wait for the holder, or take over a lease handed on by a step.

:func:`claim_or_reuse` is the one decision every caller makes before doing work: a
:class:`Lease` (do the work), :class:`Reused` (the run is completed: report its result) or
:class:`Busy` (another worker holds it: do nothing).
"""

import time
from dataclasses import dataclass

from idempotent_jobs.core.batch_book import batch_holding
from idempotent_jobs.core.errors import LeaseLostError, RunNotFoundError
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.observers import WaitOutcome, watch
from idempotent_jobs.core.records import AdvanceHold, CallOrigin, Lease, RunRecord

MAX_POLL_SECONDS = 2.0


def acquire(
    ledger: RunLedger,
    run_id: str,
    worker_id: str,
    lease_seconds: float,
    *,
    wait_seconds: float = 0.0,
    origin: CallOrigin | None = None,
) -> Lease | RunRecord:
    """Claim the run, polling for up to ``wait_seconds`` while another worker holds it.

    Returns the new :class:`Lease`, or the run's current record when no lease was had: a
    ``completed`` record (reuse its output) or, once the wait is over, a ``running`` one.
    """
    began = time.monotonic()
    deadline = began + wait_seconds
    pause = 0.1
    waited = False
    while True:
        lease = ledger.claim(run_id, worker_id, lease_seconds, origin=origin)
        if lease is not None:
            if waited:
                watch.waited(time.monotonic() - began, "claimed")
            return lease
        record = ledger.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        remaining = deadline - time.monotonic()
        # A batch holds its runs for hours: stepping aside at once, not after the wait.
        if record.status == "completed" or remaining <= 0 or batch_holding(record.lease_owner):
            if waited:
                ended: WaitOutcome = "reused" if record.status == "completed" else "busy"
                watch.waited(time.monotonic() - began, ended)
            return record
        waited = True
        # Waiting on another process's lease: poll the database, backing off.
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, MAX_POLL_SECONDS)


@dataclass(frozen=True)
class Reused:
    """The run is completed: its stored record (output, configuration) is the answer."""

    record: RunRecord


@dataclass(frozen=True)
class Busy:
    """Another worker still holds the run's lease (after any wait), or a batch of the batch
    lane does (at once: :attr:`batch_id`): do no work."""

    record: RunRecord

    @property
    def batch_id(self) -> str | None:
        """The batch holding the run, when a batch does."""
        return batch_holding(self.record.lease_owner)


def claim_or_reuse(
    ledger: RunLedger,
    run: RunIdentity | str,
    worker_id: str,
    lease_seconds: float,
    *,
    handed: Lease | None = None,
    wait_seconds: float = 0.0,
    origin: CallOrigin | None = None,
    hold: AdvanceHold | None = None,
) -> Lease | Reused | Busy:
    """The lease to work under, or why there is none.

    ``run`` is an identity (a first step: register and claim in one round trip) or the run id of
    a registered run (a later step). A lease ``handed`` on by an earlier step of the same caller
    run is taken over when it still holds; otherwise this worker claims the run, waiting up to
    ``wait_seconds`` for another holder to finish or expire. ``origin``, the caller's run and
    step, is recorded with a claim. ``hold``: the coming model call's worst case, reserved with
    the takeover of a ``handed`` lease (:meth:`RunLedger.renew`), or by ``begin``'s claim of a
    new run when a budget covers its job.
    """
    started = time.time_ns()
    got = _claim_or_reuse(
        ledger,
        run,
        worker_id,
        lease_seconds,
        handed=handed,
        wait_seconds=wait_seconds,
        origin=origin,
        hold=hold,
    )
    lease = got if isinstance(got, Lease) else None
    watch.claimed(
        "reused" if isinstance(got, Reused) else "busy" if lease is None else "claimed",
        lease,
        started_ns=started,
        handed_over=lease is not None and handed is not None and lease.epoch == handed.epoch,
    )
    return got


def _claim_or_reuse(
    ledger: RunLedger,
    run: RunIdentity | str,
    worker_id: str,
    lease_seconds: float,
    *,
    handed: Lease | None,
    wait_seconds: float,
    origin: CallOrigin | None,
    hold: AdvanceHold | None,
) -> Lease | Reused | Busy:
    if handed is not None:
        try:
            step = origin.caller_step if origin is not None else None
            return ledger.renew(handed, hold=hold, step=step)
        except LeaseLostError:
            pass
    if isinstance(run, RunIdentity):
        record, lease = ledger.begin(run, worker_id, lease_seconds, origin=origin, hold=hold)
        if lease is not None:
            return lease
        if record.status == "completed":
            return Reused(record)
        if wait_seconds <= 0 or batch_holding(record.lease_owner):
            return Busy(record)
        run = record.run_id
    got = acquire(
        ledger,
        run,
        worker_id,
        lease_seconds,
        wait_seconds=wait_seconds,
        origin=origin,
    )
    if isinstance(got, Lease):
        return got
    return Reused(got) if got.status == "completed" else Busy(got)
