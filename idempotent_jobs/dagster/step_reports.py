"""What a Dagster step of an idempotent job says about its ledger run: its output metadata (did
this Dagster run do the work, what did the logical run cost), its span's outcome, a reused
result's notes, a budget's refusal and a run held elsewhere, in words."""

from typing import Any

import dagster as dg

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.batch_book import batch_holding
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    LeaseBusyError,
)
from idempotent_jobs.core.records import (
    CallCosts,
    JobConfig,
    ModelUsage,
    RunRecord,
)
from idempotent_jobs.dagster.ticket import StepResult, Ticket


def reuse_notes(
    config: JobConfig, stored_parts: dict[str, str] | None, *, output_pruned: bool = False
) -> tuple[str, ...]:
    """What qualifies a reused result: ``config changed: prompt`` when it was computed under
    another prompt, model or validator than the job has now; ``output pruned`` when retention
    has dropped the stored output (the run stays done: nothing is recomputed)."""
    notes = []
    changed = config.changed_since(stored_parts)
    if changed:
        notes.append(f"config changed: {', '.join(changed)}")
    if output_pruned:
        notes.append("output pruned")
    return tuple(notes)


def report(
    context: dg.OpExecutionContext,
    ticket: Ticket,
    usage: ModelUsage | None = None,
    costs: CallCosts | None = None,
) -> Ticket:
    """Output metadata (from what the step already knows, and ``costs`` where the step read
    them), so the run page answers "did this Dagster run do the work, and what did the logical
    run cost?". A step that reused a completed run also says so in the run's log (one event-log
    write; the steps that did the work only report metadata, as every log line costs a write to
    Dagster's event log). Returns ``ticket`` for chaining."""
    metadata: dict[str, Any] = {
        "ledger_run_id": ticket.run_id,
        "result": ticket.label,
        "lease_epoch": ticket.epoch,
        "attempts": ticket.attempts,
    }
    if usage is not None:
        metadata["model"] = usage.priced_model or ""
        if usage.model_name and usage.model_name != usage.priced_model:
            metadata["response_model"] = usage.model_name
        metadata["input_tokens"] = usage.input_tokens or 0
        metadata["output_tokens"] = usage.output_tokens or 0
        for kind in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
            if getattr(usage, kind) is not None:
                metadata[kind] = getattr(usage, kind)
    if costs is not None:
        metadata["model_calls"] = costs.calls
        metadata["tokens_accepted"] = costs.accepted_tokens
        metadata["tokens_wasted"] = costs.wasted_tokens
        metadata["cost"] = costs.summary()
    context.add_output_metadata(metadata)
    if ticket.result in (StepResult.REUSED, StepResult.INPUT_REUSED, StepResult.ANSWER_REUSED):
        context.log.info(f"ledger run {ticket.run_id}: {ticket.label}")
    return ticket


def busy_error(record: RunRecord) -> LeaseBusyError:
    batch_id = batch_holding(record.lease_owner)
    if batch_id is not None:
        return LeaseBusyError(
            f"run {record.run_id} is in batch {batch_id} of the batch lane, which computes it "
            f"(held until {record.lease_expires_at}); nothing is paid for it here, and its "
            "result is reused once the batch is collected"
        )
    return LeaseBusyError(
        f"run {record.run_id} is held by {record.lease_owner} until {record.lease_expires_at}"
    )


def budget_metadata(run_id: str, exc: BudgetExceededError) -> dict[str, Any]:
    """The metadata of a step a budget refused: which budget, what it holds, what was wanted."""

    def figure(value: object) -> Any:
        number = float(str(value))
        return dg.MetadataValue.int(int(number)) if exc.unit == "tokens" else number

    return {
        "ledger_run_id": run_id,
        "result": "refused by budget",
        "budget": exc.budget_id,
        "budget_scope": exc.scope,
        "budget_unit": exc.unit,
        "budget_spent": figure(exc.spent),
        "budget_reserved": figure(exc.reserved),
        "budget_wanted": figure(exc.wanted),
        "budget_amount": figure(exc.budget),
        "budget_period_start": exc.day_start.date().isoformat(),
    }


def traced(span: Any, ticket: Ticket) -> Ticket:
    """``ticket``, its result and epoch set on the step's span."""
    telemetry.annotate(
        span,
        outcome=ticket.label,
        lease_epoch=ticket.epoch,
        reused=ticket.result == StepResult.REUSED or None,
    )
    return ticket
