"""Retention apart from deduplication: the identity row lives forever, its payloads do not.

A run's row (identity, status, ``completed_at``, epoch, fingerprints, counts) is what makes a
second invocation a no-op, so it is never pruned. What a :class:`RetentionPolicy` bounds is the
bulk around it: the collected raw input, the accepted output, the attempt rows and the payloads
of delivered notifications. :func:`prune` walks the tables in primary-key order in bounded
batches (one short transaction each), touching only completed runs and delivered notifications:
it never takes a lease, never waits on a held one, and can run while the jobs run.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.ledger import RunLedger

DEFAULT_BATCH_SIZE = 5000
MAX_BATCH_SIZE = 100_000

#: What a policy can prune, in the order reports list them.
PARTS = ("raw_input", "output", "attempts", "delivered_payloads")
PART_TABLES = {
    "raw_input": "runs.raw_input",
    "output": "runs.output",
    "attempts": "run_attempts",
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
        return ", ".join(f"{part} {_days(getattr(self, part))}" for part in PARTS)


def _days(kept: timedelta | None) -> str:
    if kept is None:
        return "forever"
    days = kept / timedelta(days=1)
    return f"{days:g} days" if days >= 1 else f"{kept.total_seconds():g} s"


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
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(count.rows for count in self.parts.values())

    @property
    def bytes(self) -> int:
        return sum(count.bytes for count in self.parts.values())


def prune(
    ledger: RunLedger,
    job_name: str,
    policy: RetentionPolicy,
    *,
    apply: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: datetime | None = None,
    on_batch: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Prune (``apply``) or count (the default, a dry run) what ``policy`` lets go of
    ``job_name``'s runs (the identity job name), ``batch_size`` rows of a table per transaction.

    Only completed runs lose their raw input, output and attempt rows, and only delivered
    notifications their payloads; a run revised or reopened meanwhile is left alone. The cutoffs
    are fixed when the prune starts (``now``: the database's clock by default), so a dry run and
    the apply that follows it count the same rows unless runs completed in between.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidInputError("batch_size", f"must be a whole number, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidInputError("batch_size", f"must be 1 to {MAX_BATCH_SIZE}, got {batch_size}")
    started = time.perf_counter()
    now = now or ledger.database_now()
    report = PruneReport(job_name, policy, apply)

    def cutoff(kept: timedelta | None) -> datetime | None:
        return None if kept is None else now - kept

    def batch(run: Callable[[], bool]) -> bool:
        began = time.perf_counter()
        more = run()
        took = time.perf_counter() - began
        report.batches += 1
        report.longest_batch_seconds = max(report.longest_batch_seconds, took)
        if on_batch is not None:
            on_batch(report)
        return more

    raw_before, output_before = cutoff(policy.raw_input), cutoff(policy.output)
    if raw_before is not None or output_before is not None:
        after = ""

        def runs_batch() -> bool:
            nonlocal after
            found = ledger.prune_run_payloads(
                job_name, after, batch_size, raw_before, output_before, apply=apply
            )
            _add(report.parts["raw_input"], found.raw_rows, found.raw_bytes)
            _add(report.parts["output"], found.output_rows, found.output_bytes)
            after = found.last_key[0] if found.last_key else after
            return found.last_key is not None

        while batch(runs_batch):
            pass
    attempts_before = cutoff(policy.attempts)
    if attempts_before is not None:
        attempt_after: tuple[str, int] = ("", -1)

        def attempts_batch() -> bool:
            nonlocal attempt_after
            found = ledger.prune_attempts(
                job_name, attempt_after, batch_size, attempts_before, apply=apply
            )
            _add(report.parts["attempts"], found.rows, found.bytes)
            if found.last_key is None:
                return False
            attempt_after = (str(found.last_key[0]), int(found.last_key[1]))
            return True

        while batch(attempts_batch):
            pass
    payloads_before = cutoff(policy.delivered_payloads)
    if payloads_before is not None:
        outbox_after: tuple[str, str, int] = ("", "", -1)

        def outbox_batch() -> bool:
            nonlocal outbox_after
            found = ledger.prune_delivered_payloads(
                job_name, outbox_after, batch_size, payloads_before, apply=apply
            )
            _add(report.parts["delivered_payloads"], found.rows, found.bytes)
            if found.last_key is None:
                return False
            key = found.last_key
            outbox_after = (str(key[0]), str(key[1]), int(key[2]))
            return True

        while batch(outbox_batch):
            pass
    report.seconds = time.perf_counter() - started
    return report


def _add(count: PartCount, rows: int, size: int) -> None:
    count.rows += rows
    count.bytes += size
