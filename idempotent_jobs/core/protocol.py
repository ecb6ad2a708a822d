"""The idempotent-run protocol without Dagster: register, claim, collect once, transform, commit.

Dagster ops call the same ledger steps; other schedulers can call :func:`run_idempotent` directly.
"""

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from idempotent_jobs.core.errors import (
    LeaseLostError,
    LedgerError,
    OutputRejectedError,
    StaleCandidateError,
)
from idempotent_jobs.core.heartbeat import LeaseHeartbeat
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.leases import Busy, Reused, claim_or_reuse
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import (
    CallOrigin,
    CallOutcome,
    JobConfig,
    Lease,
    ModelUsage,
    RunStatus,
)

JSONDict = dict[str, Any]
DEFAULT_LEASE_SECONDS = 300.0


@dataclass(frozen=True)
class ModelAnswer:
    """What a ``transform`` may return instead of a bare dict, to have its usage recorded."""

    output: JSONDict
    usage: ModelUsage


@dataclass(frozen=True)
class RunOutcome:
    """What one call of :func:`run_idempotent` saw and did.

    ``executed`` is true only when this call ran the model and its output is the accepted one.
    ``status`` is ``running`` (and ``output`` ``None``) when another worker holds the lease.
    ``config_changed`` names the parts of ``config`` (prompt, model, validator) that differ
    from those the reused result was computed under (empty when nothing was reused).
    ``output_pruned_at`` says when retention dropped a reused run's output (``output`` is then
    ``None``; the run is still done, and nothing is recomputed or sent again).
    """

    run_id: str
    status: RunStatus
    output: JSONDict | None
    executed: bool
    worker_id: str
    epoch: int | None = None
    config_changed: tuple[str, ...] = ()
    output_pruned_at: datetime | None = None


def default_worker_id() -> str:
    """A worker id unique to this call: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def describe_error(exc: BaseException) -> str:
    """The reason stored for a failed attempt."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _unpack(answer: JSONDict | ModelAnswer) -> tuple[JSONDict, ModelUsage | None]:
    if isinstance(answer, ModelAnswer):
        return answer.output, answer.usage
    return answer, None


def check_output(output: JSONDict, validate: Callable[[JSONDict], object] | None) -> None:
    """Raise if ``validate`` raises or returns ``False`` (:class:`OutputRejectedError`)."""
    if validate is not None and validate(output) is False:
        raise OutputRejectedError()


def run_idempotent(
    ledger: RunLedger,
    identity: RunIdentity,
    *,
    collect: Callable[[RunIdentity], JSONDict],
    transform: Callable[[JSONDict], JSONDict | ModelAnswer],
    validate: Callable[[JSONDict], object] | None = None,
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None,
    worker_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    heartbeat_seconds: float | None = None,
    wait_seconds: float = 0.0,
    caller_run_id: str | None = None,
    caller_step: str | None = None,
    config: JobConfig | None = None,
) -> RunOutcome:
    """Run one logical run at most once to completion, however often it is called.

    - A completed run returns its stored output; nothing is collected or transformed.
    - Without the lease (another worker holds it) nothing runs; the outcome says ``running``.
      With ``wait_seconds``, the call first waits that long for the holder to finish or expire.
    - The input is collected once: a stored checkpoint is reused by every later attempt.
    - The lease is renewed while ``transform`` runs (every ``heartbeat_seconds``, by default a
      third of the lease); a lost lease raises :class:`LeaseLostError` and never commits.
    - ``validate`` raising, or returning ``False``, fails the attempt; so does any error in
      ``collect`` or ``transform``: the reason is recorded, the run stays retryable, and the
      exception propagates.
    - The answer is bound to the revision and checkpoint it was computed on; ``config`` (the
      prompt, model and validator) is recorded with it, and a reused result computed under
      another configuration says so in ``config_changed``.
    """
    config = config or JobConfig()
    worker_id = worker_id or default_worker_id()
    lease = claim_or_reuse(
        ledger,
        identity,
        worker_id,
        lease_seconds,
        wait_seconds=wait_seconds,
        caller_run_id=caller_run_id,
        caller_step=caller_step,
    )
    if isinstance(lease, Busy):
        return RunOutcome(lease.record.run_id, lease.record.status, None, False, worker_id)
    if isinstance(lease, Reused):
        done = lease.record
        changed = tuple(config.changed_since(done.config_parts))
        return RunOutcome(
            done.run_id,
            "completed",
            done.output,
            False,
            worker_id,
            None,
            changed,
            done.output_pruned_at,
        )

    usage: ModelUsage | None = None
    origin = CallOrigin(caller_step, caller_run_id)
    call: CallOutcome | None = None  # how the model call ended, if one was made
    try:
        if lease.stored_raw_input is None:
            lease = ledger.checkpoint(lease, collect(identity))
        raw_input = lease.stored_raw_input
        assert raw_input is not None
        with LeaseHeartbeat(ledger, lease, heartbeat_seconds or lease_seconds / 3) as heartbeat:
            call = "failed"
            output, usage = _unpack(transform(raw_input))
        heartbeat.raise_if_lost()
        call = "rejected"
        check_output(output, validate)
        call = "failed"
        messages = notifications(output) if notifications is not None else None
        completion = ledger.complete(lease, output, messages, usage, config=config, origin=origin)
    except (LeaseLostError, StaleCandidateError):
        raise
    except BaseException as exc:
        record_failure(ledger, lease, exc, usage, call=call, origin=origin)
        raise
    return RunOutcome(
        lease.run_id, "completed", completion.output, completion.accepted, worker_id, lease.epoch
    )


def record_failure(
    ledger: RunLedger,
    lease: Lease,
    exc: BaseException,
    usage: ModelUsage | None,
    *,
    call: CallOutcome | None = None,
    origin: CallOrigin | None = None,
) -> None:
    """Mark the attempt failed if this lease still holds the run (and the model call, if one
    ended this way: ``failed`` or ``rejected``); never hide the first error."""
    try:
        ledger.fail(lease, describe_error(exc), usage, call=call, origin=origin)
    except LedgerError:
        pass
