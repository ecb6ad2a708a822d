"""What the ledger hands back: plain frozen records, one per table row or claim."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

RunStatus = Literal["pending", "running", "completed", "failed"]
AttemptOutcome = Literal["completed", "failed", "lease_lost", "superseded"]


@dataclass(frozen=True)
class Lease:
    """Proof of a successful claim. Every later write names the owner *and* the epoch.

    ``epoch`` is a fencing token: each successful claim of the run adds one, so a worker whose
    lease was taken over can never write again, even if it still believes it holds the lease.
    ``stored_raw_input`` is the checkpoint found at claim time (``None`` if not collected yet).
    ``expires_at`` is ``None`` for a lease rebuilt from a hand-over ticket until it is renewed.
    ``attempts`` is the run's claim count as of this claim or renewal (for reporting).
    """

    run_id: str
    worker_id: str
    epoch: int
    expires_at: datetime | None
    lease_seconds: float
    stored_raw_input: dict[str, Any] | None = None
    attempts: int = 0

    def ticket(self) -> dict[str, Any]:
        """The JSON-able part another step (or process) needs to take the lease over."""
        return {
            "run_id": self.run_id,
            "worker_id": self.worker_id,
            "epoch": self.epoch,
            "lease_seconds": self.lease_seconds,
        }

    @classmethod
    def from_ticket(cls, ticket: dict[str, Any]) -> "Lease":
        return cls(
            ticket["run_id"],
            ticket["worker_id"],
            int(ticket["epoch"]),
            None,
            float(ticket["lease_seconds"]),
        )


@dataclass(frozen=True)
class ModelUsage:
    """What a model call cost, recorded on the attempt that made it."""

    model_name: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class RunRecord:
    """One row of ``runs``: the durable record of a logical run."""

    run_id: str
    job_name: str
    subject_id: str
    scheduled_at: datetime
    version: str
    status: RunStatus
    raw_input: dict[str, Any] | None
    output: dict[str, Any] | None
    lock_owner: str | None
    lock_expires_at: datetime | None
    lease_epoch: int
    attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    revision: int = 0


@dataclass(frozen=True)
class AttemptRecord:
    """One row of the ``attempts`` view: one successful claim and how it ended.

    ``outcome`` and ``ended_at`` are ``None`` for the claim still open (its details live on the
    run until it ends; ended claims are rows of ``run_attempts``).
    """

    run_id: str
    lease_epoch: int
    worker_id: str
    dagster_run_id: str | None
    step_key: str | None
    started_at: datetime
    ended_at: datetime | None
    outcome: AttemptOutcome | None
    error: str | None
    model_name: str | None
    input_tokens: int | None
    output_tokens: int | None


@dataclass(frozen=True)
class OutboxRecord:
    """One row of ``notification_outbox``: a side effect to perform once per (run, channel)."""

    run_id: str
    channel: str
    payload: dict[str, Any]
    created_at: datetime
    delivered_at: datetime | None
    delivery_attempts: int
    last_error: str | None
    revision: int = 0

    @property
    def idempotency_key(self) -> str:
        """The key receivers deduplicate on: a re-sent notification carries the same one.

        ``<run_id>:<channel>``; a revised result's notification adds ``:r<revision>``.
        """
        base = f"{self.run_id}:{self.channel}"
        return base if self.revision == 0 else f"{base}:r{self.revision}"


@dataclass(frozen=True)
class Completion:
    """The answer of ``complete``: the accepted output and whether this lease produced it."""

    output: dict[str, Any]
    accepted: bool


@dataclass(frozen=True)
class DeliveryReport:
    """What one outbox delivery pass sent, and what failed with the reason."""

    delivered: list[OutboxRecord]
    failed: list[tuple[OutboxRecord, str]]


@dataclass(frozen=True)
class RevisionRecord:
    """One row of ``run_revisions``: an accepted result replaced on an operator's request."""

    run_id: str
    revision: int
    reason: str
    channels: list[str]
    previous_output: dict[str, Any]
    previous_completed_at: datetime
    previous_epoch: int
    recollect: bool
    requested_by: str | None
    requested_at: datetime
