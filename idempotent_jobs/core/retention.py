"""Retention apart from deduplication: the identity row lives forever, its payloads do not.

A run's row (identity, status, ``completed_at``, epoch, fingerprints, counts) is what makes a
second invocation a no-op, so it is never pruned. What a :class:`RetentionPolicy` bounds is the
bulk around it: the collected raw input, the accepted output, the attempt rows (with what the
ledger IO manager kept between the run's Dagster steps) and the payloads of delivered
notifications. :func:`prune` walks one job's runs in identity order (an index range)
in bounded batches, one short transaction each pruning all four parts of the batch's runs. It
touches only completed runs and delivered notifications: it never takes a lease, never waits on a
held one, and can run while the jobs run.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from idempotent_jobs.core.errors import InvalidInputError

if TYPE_CHECKING:
    from idempotent_jobs.core.admin import LedgerAdmin

DEFAULT_BATCH_SIZE = 5000
MAX_BATCH_SIZE = 100_000

#: What a policy can prune, in the order reports list them.
PARTS = ("raw_input", "output", "attempts", "delivered_payloads")
PART_TABLES = {
    "raw_input": "runs.raw_input",
    "output": "runs.output",
    "attempts": "run_attempts",  # and the step_outputs of the same completed runs
    "delivered_payloads": "notification_outbox.payload",
}


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each payload is kept (``None``: forever), counted from when its run completed
    (raw input, output), its attempt ended (attempts) or its notification was delivered."""

    raw_input: timedelta | None = None
    output: timedelta | None = None
    attempts: timedelta | None = None
    delivered_payloads: timedelta | None = None

    def __post_init__(self) -> None:
        for part in fields(self):
            kept = getattr(self, part.name)
            if kept is None:
                continue
            if not isinstance(kept, timedelta):
                raise InvalidInputError(part.name, f"must be a timedelta or None, got {kept!r}")
            if kept <= timedelta(0):
                raise InvalidInputError(part.name, f"must be longer than zero, got {kept}")

    @classmethod
    def of_days(cls, **days: float | None) -> "RetentionPolicy":
        """``RetentionPolicy.of_days(raw_input=30, output=365)``."""
        unknown = set(days) - set(PARTS)
        if unknown:
            raise InvalidInputError(sorted(unknown)[0], f"is not one of {', '.join(PARTS)}")
        return cls(**{k: None if v is None else timedelta(days=v) for k, v in days.items()})

    def overridden(self, **kept: timedelta | None) -> "RetentionPolicy":
        """This policy with the parts given replaced (a command line's overrides)."""
        return replace(self, **kept)

    @property
    def prunes_anything(self) -> bool:
        return any(getattr(self, part) is not None for part in PARTS)

    def describe(self) -> str:
        return ", ".join(f"{part} {describe_kept(getattr(self, part))}" for part in PARTS)


def describe_kept(kept: timedelta | None) -> str:
    """``30 days``, ``12 h``, ``0.864 s``, ``forever``."""
    if kept is None:
        return "forever"
    if kept >= timedelta(days=1):
        return f"{kept / timedelta(days=1):g} days"
    if kept >= timedelta(hours=1):
        return f"{kept / timedelta(hours=1):g} h"
    return f"{kept.total_seconds():g} s"


@dataclass
class PartCount:
    """What was (or would be) pruned of one part of one job: rows and their stored bytes."""

    rows: int = 0
    bytes: int = 0


@dataclass
class PruneReport:
    """What one :func:`prune` of one job found (``applied``: and pruned)."""

    job_name: str
    policy: RetentionPolicy
    applied: bool
    parts: dict[str, PartCount] = field(default_factory=lambda: {p: PartCount() for p in PARTS})
    batches: int = 0
    #: Spend rows (per day, per budget period, holds) older than the longest budget period.
    spend_rows: int = 0
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(count.rows for count in self.parts.values())

    @property
    def bytes(self) -> int:
        return sum(count.bytes for count in self.parts.values())


def prune(
    admin: "LedgerAdmin",
    job_name: str,
    policy: RetentionPolicy,
    *,
    apply: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: datetime | None = None,
    on_batch: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Prune (``apply``) or count (the default, a dry run) what ``policy`` lets go of
    ``job_name``'s runs (the identity job name), ``batch_size`` runs per transaction.

    Only completed runs lose their raw input, output and attempt rows, and only delivered
    notifications their payloads; a run revised or reopened meanwhile is left alone. The job's
    spend rows older than the longest budget period go too (:meth:`LedgerAdmin.prune_spend`).
    The cutoffs are fixed when the prune starts (``now``: the database's clock by default), so
    a dry run and the apply that follows it count the same rows unless runs completed in
    between.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidInputError("batch_size", f"must be a whole number, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidInputError("batch_size", f"must be 1 to {MAX_BATCH_SIZE}, got {batch_size}")
    started = time.perf_counter()
    now = now or admin.database_now()
    report = PruneReport(job_name, policy, apply)

    def cutoff(kept: timedelta | None) -> datetime | None:
        return None if kept is None else now - kept

    cutoffs = {
        "raw_input_before": cutoff(policy.raw_input),
        "output_before": cutoff(policy.output),
        "attempts_before": cutoff(policy.attempts),
        "payloads_before": cutoff(policy.delivered_payloads),
    }
    after: tuple[str, datetime, str] | None = ("", datetime(1970, 1, 1, tzinfo=UTC), "")
    while after is not None and policy.prunes_anything:
        began = time.perf_counter()
        found = admin.prune_batch(job_name, after, batch_size, apply=apply, **cutoffs)
        report.batches += 1
        report.longest_batch_seconds = max(
            report.longest_batch_seconds, time.perf_counter() - began
        )
        _add(report.parts["raw_input"], found.raw_rows, found.raw_bytes)
        _add(report.parts["output"], found.output_rows, found.output_bytes)
        _add(report.parts["attempts"], found.attempt_rows, found.attempt_bytes)
        _add(report.parts["delivered_payloads"], found.payload_rows, found.payload_bytes)
        if on_batch is not None:
            on_batch(report)
        after = found.last_key
    if cutoffs["attempts_before"] is not None:
        _prune_step_outputs(admin, job_name, cutoffs["attempts_before"], batch_size, apply, report)
    report.spend_rows = admin.prune_spend(job_name, apply)
    report.seconds = time.perf_counter() - started
    return report


def _prune_step_outputs(
    admin: "LedgerAdmin",
    job_name: str,
    before: datetime,
    batch_size: int,
    apply: bool,
    report: "PruneReport",
) -> None:
    """What the ledger IO manager kept between the steps of the job's completed runs, by the
    attempts' cutoff (counted with them): batch by batch with ``apply``, else one count of all."""
    while True:
        limit = batch_size if apply else None
        rows, size = admin.prune_step_outputs(job_name, before, limit, apply)
        _add(report.parts["attempts"], rows, size)
        if not apply or rows < batch_size:
            return


def _add(count: PartCount, rows: int, size: int) -> None:
    count.rows += rows
    count.bytes += size
