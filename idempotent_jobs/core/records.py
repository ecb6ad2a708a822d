"""What the ledger hands back: plain frozen records, one per table row or claim."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

from idempotent_jobs.core.json_values import json_fingerprint
from idempotent_jobs.core.values import USAGE_PARTS as USAGE_PARTS
from idempotent_jobs.core.values import Basis as Basis  # part of the records (see values.py)
from idempotent_jobs.core.values import ModelUsage as ModelUsage

RunStatus = Literal["pending", "running", "completed", "failed"]
AttemptOutcome = Literal["completed", "failed", "lease_lost", "superseded", "drill", "budget"]
#: How a failing attempt ends: ``failed``, or ``drill`` (failed on purpose by a failure drill),
#: or ``budget`` (the job's token budget refused its model call).
FailedOutcome = Literal["failed", "drill", "budget"]


class FenceOutcome(StrEnum):
    """What a fenced statement (``complete``, ``fail``, ``release``) says happened, in its own
    words: the caller never infers it from a later read."""

    APPLIED = "applied"  # written now, under this lease
    ALREADY_DONE = "already_done"  # landed before (a retry after a lost answer), or completed
    LEASE_LOST = "lease_lost"  # another claim moved the run on: nothing written
    STALE = "stale"  # the candidate's basis no longer holds: refused, nothing of it kept


@dataclass(frozen=True, kw_only=True)
class Lease:
    """Proof of a successful claim. Every later write names the owner *and* the epoch.

    ``epoch`` is a fencing token: each successful claim of the run adds one, so a worker whose
    lease was taken over can never write again, even if it still believes it holds the lease.
    ``stored_raw_input`` is the checkpoint found at claim time (``None`` if not collected yet).
    ``expires_at`` is ``None`` for a lease handed on to a later step until it is renewed.
    ``attempts`` is the run's claim count as of this claim or renewal (for reporting).
    ``revision`` and ``input_fingerprint`` are the run's as of this claim, renewal or checkpoint:
    the :class:`Basis` of an answer computed on ``stored_raw_input``.
    """

    run_id: str
    worker_id: str
    epoch: int
    expires_at: datetime | None
    lease_seconds: float
    stored_raw_input: dict[str, Any] | None = None
    attempts: int = 0
    revision: int = 0
    input_fingerprint: str | None = None
    #: Whether a failure drill of the run's job was armed when ``begin`` claimed it (``None``:
    #: not known, the model call asks the ledger).
    drill_armed: bool | None = None
    #: Whether a budget covered the run's job when ``begin`` claimed it (``None``: not known,
    #: the model call asks the ledger).
    budgeted: bool | None = None
    #: The worst case, in tokens, already held of the job's budgets for the next request: the
    #: :class:`AdvanceHold` the claim, the checkpoint or the handover reserved (``None``:
    #: nothing held).
    held_tokens: int | None = None

    @property
    def basis(self) -> Basis:
        return Basis(revision=self.revision, input_fingerprint=self.input_fingerprint)


@dataclass(frozen=True)
class AdvanceHold:
    """A model call's worst case, reserved under the job's budgets by the statement that hands
    the lease to the call (``run_idempotent``'s claim, a Dagster step's checkpoint or a later
    step's takeover), so a budget costs the
    call no round trip of its own: ``max_tokens`` (the step's declared most tokens per call)
    at the dearest price of ``requested_model``."""

    max_tokens: int
    requested_model: str | None = None


@dataclass(frozen=True, kw_only=True)
class CallOrigin:
    """Where a model call was made: the caller's step that made it (a Dagster op), the caller's
    run and the step's retry. The attempt names the step that *claimed* the lease, which may be
    an earlier one."""

    caller_step: str | None = None
    caller_run_id: str | None = None
    retry_number: int | None = None


#: ``answered``: paid for and recorded with its answer (Dagster's ``transform``), waiting for
#: the commit that accepts or refuses it.
CallOutcome = Literal["accepted", "stale", "rejected", "failed", "lease_lost", "answered"]


@dataclass(frozen=True, kw_only=True)
class ModelCallRecord:
    """One row of ``model_calls``: a model call, what it cost and what became of its answer."""

    call_id: int
    run_id: str
    lease_epoch: int
    revision: int
    worker_id: str
    caller_run_id: str | None
    caller_step: str | None
    retry_number: int | None
    model_name: str | None
    input_tokens: int | None
    output_tokens: int | None
    outcome: CallOutcome
    error: str | None
    called_at: datetime
    #: The model the call asked for (``model_name`` is the one that answered); ``None`` when
    #: the worker did not say (an earlier release's).
    requested_model: str | None = None
    #: Set for a call recorded while its attempt went on (a repair turn followed it, or it
    #: failed and was retried), numbered within the attempt; ``None`` for the attempt's last.
    turn: int | None = None
    #: The parts of the usage the provider broke out (see :class:`ModelUsage`).
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    reasoning_tokens: int | None = None
    provider_name: str | None = None
    tier: str | None = None
    #: The price row the call was priced by (fixed when its request was admitted) and its
    #: money at that row: ``None`` when unknown (no price, or in doubt until settled).
    price_id: int | None = None
    money: Decimal | None = None
    #: ``billed``, ``unbilled`` (the provider answered an error and billed nothing: money 0),
    #: ``in_doubt`` (no usage known) or ``settled`` (was in doubt; an operator settled it).
    billing: str | None = None
    settled_at: datetime | None = None
    settled_by: str | None = None

    @property
    def usage(self) -> ModelUsage:
        """The call's usage, as it was recorded."""
        return ModelUsage(
            self.model_name,
            self.input_tokens,
            self.output_tokens,
            requested_model=self.requested_model,
            **{name: getattr(self, name) for name in USAGE_PARTS},
        )

    @property
    def priced_model(self) -> str | None:
        """The model its price is looked up by: the requested one, else the response's."""
        return self.requested_model or self.model_name

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)


@dataclass(frozen=True, kw_only=True)
class DrillRecord:
    """An armed failure drill: the next ``remaining`` model calls of ``job_name`` (an identity
    job name, ``*`` for every job) fail before the call, until ``expires_at``."""

    job_name: str
    remaining: int
    expires_at: datetime
    armed_by: str | None
    armed_at: datetime


@dataclass(frozen=True, kw_only=True)
class CallCosts:
    """What a logical run's model calls cost: the accepted answers' tokens, and the rest."""

    calls: int
    accepted_calls: int
    accepted_tokens: int
    wasted_tokens: int

    @classmethod
    def of(cls, calls: "list[ModelCallRecord]") -> "CallCosts":
        accepted = [c for c in calls if c.outcome == "accepted"]
        return cls(
            calls=len(calls),
            accepted_calls=len(accepted),
            accepted_tokens=sum(c.tokens for c in accepted),
            wasted_tokens=sum(c.tokens for c in calls if c.outcome != "accepted"),
        )

    def summary(self) -> str:
        """The one-line answer to "what did the retries of this run cost?"."""
        wasted = self.calls - self.accepted_calls
        return (
            f"{self.calls} model call(s): {self.accepted_tokens:,} tokens accepted, "
            f"{self.wasted_tokens:,} wasted on {wasted} call(s) not accepted"
        )


@dataclass(frozen=True, kw_only=True)
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
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_epoch: int
    attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    revision: int = 0
    input_fingerprint: str | None = None
    config_fingerprint: str | None = None
    config_parts: dict[str, str] | None = None
    raw_input_pruned_at: datetime | None = None
    output_pruned_at: datetime | None = None
    attempts_pruned_at: datetime | None = None  # when ended attempt rows were last deleted

    @property
    def pruned(self) -> list[str]:
        """What retention pruned of this run, with when (``output pruned 2026-...``)."""
        return [
            f"{part} pruned {when.isoformat(timespec='seconds')}"
            for part, when in (
                ("raw input", self.raw_input_pruned_at),
                ("output", self.output_pruned_at),
                ("ended attempts", self.attempts_pruned_at),
            )
            if when is not None
        ]


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One row of the ``attempts`` view: one successful claim and how it ended.

    ``outcome`` and ``ended_at`` are ``None`` for the claim still open (its details live on the
    run until it ends; ended claims are rows of ``run_attempts``).
    """

    run_id: str
    lease_epoch: int
    worker_id: str
    caller_run_id: str | None
    caller_step: str | None
    started_at: datetime
    ended_at: datetime | None
    outcome: AttemptOutcome | None
    error: str | None
    model_name: str | None
    input_tokens: int | None
    output_tokens: int | None


@dataclass(frozen=True, kw_only=True)
class OutboxRecord:
    """One row of ``notification_outbox``: a side effect to perform once per (run, channel)."""

    run_id: str
    channel: str
    payload: dict[str, Any] | None  # None once retention pruned a delivered row's payload
    created_at: datetime
    delivered_at: datetime | None
    delivery_attempts: int
    last_error: str | None
    revision: int = 0
    payload_pruned_at: datetime | None = None
    #: The identity job of the row's run (the job whose code location's channel sends it).
    job_name: str | None = None

    @property
    def idempotency_key(self) -> str:
        """The key receivers deduplicate on: a re-sent notification carries the same one.

        ``<run_id>:<channel>``; a revised result's notification adds ``:r<revision>``.
        """
        base = f"{self.run_id}:{self.channel}"
        return base if self.revision == 0 else f"{base}:r{self.revision}"


@dataclass(frozen=True)
class JobConfig:
    """The configuration an answer is computed under, beyond the run's identity.

    The identity (job, subject, window, version) deliberately leaves these out: changing the
    prompt, the model or the validator without bumping ``version`` reuses completed runs. Each
    accepted result records this, so such a reuse is reported instead of silent. Each part is a
    short text; a long one (a prompt) is kept as its sha256.
    """

    parts: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, *, prompt: str, model: str, validator: str, **settings: str) -> "JobConfig":
        """The parts of a job's configuration: the prompt (as its fingerprint), the model, the
        validator's name, and any ``settings`` of the model step (short texts)."""
        parts = {"prompt": json_fingerprint(prompt), "model": model, "validator": validator}
        return cls({**settings, **parts})

    @property
    def fingerprint(self) -> str:
        return json_fingerprint(dict(self.parts), "config")

    def changed_since(self, stored: Mapping[str, str] | None) -> list[str]:
        """The parts that differ from a stored result's ``config_parts`` (``[]``: none, or
        nothing stored to compare with)."""
        if stored is None:
            return []
        names = sorted(set(self.parts) | set(stored))
        return [n for n in names if self.parts.get(n) != stored.get(n)]


@dataclass(frozen=True, kw_only=True)
class Completion:
    """The answer of ``complete``: the accepted output, whether this lease produced it, and
    the configuration parts it was computed under."""

    output: dict[str, Any]
    accepted: bool
    config_parts: dict[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class DeliveryReport:
    """What one outbox delivery pass sent, and what failed with the reason."""

    delivered: list[OutboxRecord]
    failed: list[tuple[OutboxRecord, str]]
    #: Undelivered rows of jobs the deliverer does not own, by identity job: left pending.
    left_pending: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RevisionRecord:
    """One row of ``run_revisions``: an accepted result replaced on an operator's request."""

    run_id: str
    revision: int
    reason: str
    channels: list[str]
    previous_output: dict[str, Any] | None  # None when retention had pruned it
    previous_completed_at: datetime
    previous_epoch: int
    recollect: bool
    requested_by: str | None
    requested_at: datetime


@dataclass(frozen=True)
class ShadowLease:
    """Proof that this process advances the shadow: every write names the owner and epoch."""

    shadow_id: str
    worker_id: str
    epoch: int
    lease_seconds: float

    def params(self) -> dict[str, Any]:
        return {"shadow_id": self.shadow_id, "worker_id": self.worker_id, "epoch": self.epoch}

    @property
    def call_worker(self) -> str:
        """The worker id the shadow's calls and holds are recorded under."""
        return f"shadow:{self.shadow_id}"
