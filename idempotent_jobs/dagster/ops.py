"""The four ops of an idempotent job, built for one :class:`IdempotentJobSpec`.

The ops are thin: :func:`~idempotent_jobs.core.leases.claim_or_reuse` decides whether a step
works (under a lease), reports a completed run's result, or stops because another worker holds
the run; the ledger fences every write. Between ops travels a frozen :class:`Ticket`.
"""

import uuid
from typing import Any

import dagster as dg

from idempotent_jobs.core.errors import (
    LeaseBusyError,
    LeaseLostError,
    LedgerError,
    StaleCandidateError,
)
from idempotent_jobs.core.heartbeat import LeaseHeartbeat
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.leases import Busy, Reused, claim_or_reuse
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.protocol import check_output, record_failure
from idempotent_jobs.core.records import (
    CallCosts,
    CallOrigin,
    CallOutcome,
    Completion,
    JobConfig,
    Lease,
    ModelUsage,
    RunRecord,
)
from idempotent_jobs.dagster.drill import fail_if_drilled
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resources import Collector, ModelStep, NotificationChannel, StepContext
from idempotent_jobs.dagster.ticket import Answer, Ticket


def _worker_id(context: dg.OpExecutionContext) -> str:
    """Unique per op execution, readable in the ledger: Dagster run, op, retry, random."""
    return (
        f"dagster:{context.run_id}:{context.op.name}:{context.retry_number}:{uuid.uuid4().hex[:6]}"
    )


def reuse_label(
    config: JobConfig, stored_parts: dict[str, str] | None, *, output_pruned: bool = False
) -> str:
    """``reused``; ``reused (config changed: prompt)`` when the stored result was computed
    under another prompt, model or validator than the job has now; ``reused (output pruned)``
    when retention has dropped the stored output (the run stays done: nothing is recomputed)."""
    notes = []
    changed = config.changed_since(stored_parts)
    if changed:
        notes.append(f"config changed: {', '.join(changed)}")
    if output_pruned:
        notes.append("output pruned")
    return f"reused ({'; '.join(notes)})" if notes else "reused"


def _report(
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
        "result": ticket.result,
        "lease_epoch": ticket.epoch,
        "attempts": ticket.attempts,
    }
    if usage is not None:
        metadata["model"] = usage.model_name or ""
        metadata["input_tokens"] = usage.input_tokens or 0
        metadata["output_tokens"] = usage.output_tokens or 0
    if costs is not None:
        metadata["model_calls"] = costs.calls
        metadata["tokens_accepted"] = costs.accepted_tokens
        metadata["tokens_wasted"] = costs.wasted_tokens
        metadata["cost"] = costs.summary()
    context.add_output_metadata(metadata)
    if ticket.result.startswith("reused"):
        context.log.info(f"ledger run {ticket.run_id}: {ticket.result}")
    return ticket


def _busy(record: RunRecord) -> LeaseBusyError:
    return LeaseBusyError(
        f"run {record.run_id} is held by {record.lease_owner} until {record.lease_expires_at}"
    )


def build_ops(
    spec: IdempotentJobSpec,
) -> tuple[dg.OpDefinition, dg.OpDefinition, dg.OpDefinition, dg.OpDefinition]:
    """collect, transform, persist and deliver for ``spec``.

    Op definition names carry the job's name (Dagster wants them unique per code location);
    the job uses them under the plain node names ``collect``, ``transform``, ...
    """

    def identity_of(context: dg.OpExecutionContext) -> RunIdentity:
        return spec.identity_for(context.partition_key)

    def model_of(context: dg.OpExecutionContext) -> ModelStep:
        model: ModelStep = getattr(context.resources, spec.model)
        return model

    def lease_for(
        context: dg.OpExecutionContext,
        ledger: RunLedger,
        run: RunIdentity | str,
        handed: Lease | None,
        config: JobConfig,
    ) -> Lease | Ticket:
        """The lease to work under, or the ticket to report a completed run with; raises when
        another worker still holds the run after the spec's wait."""
        got = claim_or_reuse(
            ledger,
            run,
            _worker_id(context),
            spec.lease_seconds,
            handed=handed,
            wait_seconds=spec.holder_wait_seconds,
            caller_run_id=context.run_id,
            caller_step=context.op.name,
        )
        if isinstance(got, Busy):
            raise _busy(got.record)
        if isinstance(got, Reused):
            done = got.record
            pruned = done.output is None and done.output_pruned_at is not None
            return Ticket.of_completed(
                done, reuse_label(config, done.config_parts, output_pruned=pruned)
            )
        return got

    @dg.op(
        name=f"{spec.name}_collect",
        out=dg.Out(Ticket),
        required_resource_keys={"ledger", spec.collector, spec.model},
        tags={"kind": "ledger"},
    )
    def collect(context: dg.OpExecutionContext) -> Ticket:
        """Register the run, take its lease and checkpoint the collected input (once)."""
        identity = identity_of(context)
        ledger: RunLedger = context.resources.ledger
        collector: Collector = getattr(context.resources, spec.collector)
        lease = lease_for(context, ledger, identity, None, spec.config_of(model_of(context)))
        if isinstance(lease, Ticket):
            return _report(context, lease)
        reused_input = lease.stored_raw_input is not None
        if not reused_input:
            try:
                raw_input = collector.collect(identity)
            except Exception as exc:
                record_failure(ledger, lease, exc, None)
                raise
            ledger.checkpoint(lease, raw_input)
        result = "reused input" if reused_input else "collected"
        return _report(context, Ticket.under(lease, context.run_id, result))

    @dg.op(
        name=f"{spec.name}_transform",
        out=dg.Out(Ticket),
        required_resource_keys={"ledger", spec.model},
        retry_policy=spec.model_retry,
        tags={"kind": "model"},
    )
    def transform(context: dg.OpExecutionContext, collected: Ticket) -> Ticket:
        """Call the model on the checkpointed input (read from the ledger) under a live lease."""
        if collected.completed:
            return _report(context, collected)
        ledger: RunLedger = context.resources.ledger
        model = model_of(context)
        config = spec.config_of(model)
        handed = collected.handed_lease(context.run_id)
        lease = lease_for(context, ledger, collected.run_id, handed, config)
        if isinstance(lease, Ticket):
            return _report(context, lease)
        raw_input = lease.stored_raw_input
        if raw_input is None:
            raise LedgerError(f"run {lease.run_id} has no raw-input checkpoint; re-run collect")
        origin = CallOrigin(context.op.name, context.run_id, context.retry_number)
        answer = None
        with LeaseHeartbeat(ledger, lease, spec.lease_seconds / 3) as heartbeat:
            try:
                fail_if_drilled()
                step = StepContext(
                    identity_of(context), spec.prompt, lease.run_id, context.run_id, context.op.name
                )
                answer = model.generate(raw_input, step)
                check_output(answer.output, spec.validate)
            except Exception as exc:  # the call failed, or its answer was rejected: both cost
                usage = answer.usage if answer is not None else None
                call: CallOutcome = "failed" if answer is None else "rejected"
                record_failure(ledger, lease, exc, usage, call=call, origin=origin)
                raise
        heartbeat.raise_if_lost()
        # The answer is bound to what it was computed on: this lease's checkpoint.
        bound = Answer(answer.output, answer.usage, lease.basis, config, origin)
        ticket = Ticket.under(heartbeat.lease, context.run_id, "model called", bound)
        return _report(context, ticket, answer.usage)

    @dg.op(name=f"{spec.name}_persist", out=dg.Out(Ticket), tags={"kind": "ledger"})
    def persist(
        context: dg.OpExecutionContext, transformed: Ticket, ledger: dg.ResourceParam[RunLedger]
    ) -> Ticket:
        """Commit the answer, its usage and the outbox rows in one transaction."""
        answer = transformed.answer
        if transformed.completed:
            return _report(context, transformed)
        if answer is None:  # a ticket no transform produced: nothing to commit, say so
            raise LedgerError(f"run {transformed.run_id}: the ticket carries no model answer")
        run_id = transformed.run_id
        notifications = spec.notifications(identity_of(context), answer.output)

        def commit(lease: Lease) -> Completion:
            try:
                return ledger.complete(
                    lease,
                    answer.output,
                    notifications,
                    answer.usage,
                    basis=answer.basis,
                    config=answer.config,
                    origin=answer.origin,
                )
            except StaleCandidateError as exc:  # revised since: this answer is not the result
                raise dg.Failure(
                    description=f"stale answer, not accepted: {exc}",
                    metadata={"ledger_run_id": run_id, "result": "superseded"},
                    allow_retries=False,
                ) from None

        completion: Completion | None = None
        ticket = transformed
        handed = transformed.handed_lease(context.run_id)
        if handed is not None:
            try:
                completion = commit(handed)
            except LeaseLostError:
                completion = None
        if completion is None:
            # The handed lease was lost, or this is a re-execution: claim, then commit the
            # answer this run already paid for (first commit wins), but only on the revision
            # and checkpoint it was computed on.
            lease = lease_for(context, ledger, run_id, None, answer.config)
            if isinstance(lease, Ticket):
                return _report(context, lease, costs=CallCosts.of(ledger.model_calls(run_id)))
            completion = commit(lease)
            ticket = Ticket.under(lease, context.run_id, ticket.result)
        new = completion.accepted
        result = "new" if new else reuse_label(answer.config, completion.config_parts)
        costs = CallCosts.of(ledger.model_calls(run_id))
        return _report(context, ticket.done(result), answer.usage if new else None, costs)

    @dg.op(
        name=f"{spec.name}_deliver",
        required_resource_keys={"ledger", *spec.channels},
        retry_policy=dg.RetryPolicy(max_retries=3, delay=1.0, backoff=dg.Backoff.EXPONENTIAL),
        tags={"kind": "outbox"},
    )
    def deliver(context: dg.OpExecutionContext, persisted: Ticket) -> None:
        """Send this run's undelivered outbox rows, once each, keyed ``<run_id>:<channel>``."""
        run_id = persisted.run_id
        ledger: RunLedger = context.resources.ledger

        def send(row: Any) -> None:
            channel: NotificationChannel = getattr(context.resources, row.channel)
            channel.send(row)

        report = ledger.deliver_outbox(send, run_id=run_id)
        context.add_output_metadata(
            {
                "ledger_run_id": run_id,
                "delivered_now": len(report.delivered),
                "failed": len(report.failed),
            }
        )
        if report.failed:
            reasons = "; ".join(f"{row.channel}: {reason}" for row, reason in report.failed)
            raise dg.Failure(f"delivery failed, will retry: {reasons}", allow_retries=True)

    return collect, transform, persist, deliver
