"""OpenTelemetry watching the attempt engine from outside: spans and metrics made of what the
engine reports (:mod:`~idempotent_jobs.core.observers`), so no step calls telemetry itself.

Added to the engine's observers when :mod:`idempotent_jobs.core` is imported. Every hook goes
through :mod:`~idempotent_jobs.core.telemetry` and :mod:`~idempotent_jobs.core.metrics`, whose
functions keep their own failures in and return at once when no SDK is set.
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import Any, Literal

from idempotent_jobs.core import metrics, telemetry
from idempotent_jobs.core.observers import (
    ClaimOutcome,
    CommitOutcome,
    EngineObserver,
    FailedAttempt,
    StepName,
    WaitOutcome,
)
from idempotent_jobs.core.records import Lease, ModelUsage


def lease_attributes(lease: Lease) -> dict[str, int]:
    return {"idempotent_jobs.lease_epoch": lease.epoch, "idempotent_jobs.revision": lease.revision}


def tokens_of(usage: ModelUsage) -> int:
    return (usage.input_tokens or 0) + (usage.output_tokens or 0)


class TelemetryObserver(EngineObserver):
    """A span per step (``idempotent_jobs.collect``, ``chat <model>`` as a client span,
    ``idempotent_jobs.commit``, ``idempotent_jobs.deliver``), a past span per claim, the
    outcome on the span it happened in, and the metrics of
    :mod:`~idempotent_jobs.core.metrics`."""

    never_raises = True

    def step(
        self, name: StepName, lease: Lease | None, *, model: str | None = None
    ) -> AbstractContextManager[object]:
        attributes: dict[str, str | int] = {**lease_attributes(lease)} if lease is not None else {}
        if name != "chat":
            return telemetry.span(f"idempotent_jobs.{name}", attributes)
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.request.model"] = model or ""
        return telemetry.span(f"chat {model or ''}".strip(), attributes, client=True)

    def claimed(
        self, outcome: ClaimOutcome, lease: Lease | None, *, started_ns: int, handed_over: bool
    ) -> None:
        if outcome == "reused":  # one short span, marked reused: no step span under it
            telemetry.annotate_current(reused=True, outcome="reused")
            metrics.count_run("reused")
            return
        if not telemetry.tracing():
            return
        attributes: dict[str, Any] = {"idempotent_jobs.outcome": outcome}
        if lease is not None:
            attributes["idempotent_jobs.lease_epoch"] = lease.epoch
            attributes["idempotent_jobs.revision"] = lease.revision
            attributes["idempotent_jobs.handed_over"] = handed_over
        else:
            telemetry.annotate_current(outcome=outcome)
        telemetry.past_span("idempotent_jobs.claim", started_ns, attributes)

    def waited(self, seconds: float, outcome: WaitOutcome) -> None:
        metrics.record_lease_wait(seconds, outcome)

    def reused(self, what: Literal["input", "answer"]) -> None:
        telemetry.annotate_current(**{f"{what}_reused": True})

    def answered(self, usage: ModelUsage) -> None:
        telemetry.annotate_current(**metrics.usage_attributes(usage))
        metrics.record_usage(usage)

    def priced(self, money: Decimal, currency: str, usage: ModelUsage) -> None:
        metrics.record_cost(money, currency, usage.priced_model)

    def in_doubt(self, usage: ModelUsage | None) -> None:
        metrics.count_call_in_doubt(usage.priced_model if usage else None)

    def not_accepted(self, usage: ModelUsage, call: str) -> None:
        metrics.count_tokens_not_accepted(tokens_of(usage), usage.priced_model, call)

    def attempt_failed(self, failure: FailedAttempt) -> None:
        error_type = type(failure.error).__name__
        telemetry.annotate_current(outcome=failure.ends, **{"error.type": error_type})
        metrics.count_run("failed")
        if failure.call is not None and failure.usage is not None:
            self.not_accepted(failure.usage, failure.call)

    def call_lost(self, usage: ModelUsage | None) -> None:
        metrics.count_run("lease_lost")
        if usage is not None:
            self.not_accepted(usage, "lease_lost")

    def committed(self, outcome: CommitOutcome, usage: ModelUsage | None) -> None:
        telemetry.annotate_current(outcome=outcome)
        if outcome == "accepted":
            metrics.count_run("executed")
            return
        metrics.count_run(outcome)
        if usage is not None:
            self.not_accepted(usage, "lease_lost" if outcome == "lease_lost" else "stale")

    def delivered(self, delivered: Sequence[str], failed: Sequence[str]) -> None:
        telemetry.annotate_current(delivered=len(delivered), failed=len(failed))
        for channel in delivered:
            metrics.count_notification(channel, "delivered")
        for channel in failed:
            metrics.count_notification(channel, "failed")
