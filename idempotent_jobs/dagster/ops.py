"""The four ops of an idempotent job: thin module-level steps around the core's.

Each step function takes the op's :class:`~idempotent_jobs.dagster.op_frame.OpFrame` (its
context, the job's :class:`IdempotentJobSpec` and the ledger, and what follows from them, worked
out once), so it can be called directly in a test with ``build_op_context``;
:func:`build_ops` wraps them as ops named for the job. The work is the core's
(:mod:`idempotent_jobs.core.steps`), the same steps
:func:`~idempotent_jobs.core.protocol.run_idempotent` composes: a failure ends the attempt the
same way through either. :func:`~idempotent_jobs.core.leases.claim_or_reuse` decides whether a
step works (under a lease), reports a completed run's result, or stops because another worker
holds the run. Between ops travels a frozen :class:`Ticket`.
"""

from typing import Any

import dagster as dg

from idempotent_jobs.core.collecting import collect_once
from idempotent_jobs.core.commits import commit, recorded_answer
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    LeaseBusyError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    StaleCandidateError,
    sent_nothing,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.leases import Busy, Reused, claim_or_reuse
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import (
    AdvanceHold,
    CallCosts,
    Completion,
    JobConfig,
    Lease,
)
from idempotent_jobs.core.steps import (
    BoundAnswer,
    advance_hold,
    call_model,
    end_attempt,
)
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.op_frame import OpFrame
from idempotent_jobs.dagster.resources import Collector, NotificationChannel, StepContext
from idempotent_jobs.dagster.step_reports import (
    budget_metadata,
    busy_error,
    report,
    reuse_notes,
    traced,
)
from idempotent_jobs.dagster.telemetry import step_span
from idempotent_jobs.dagster.ticket import StepResult, Ticket
from idempotent_jobs.models.errors import ProviderError


def lease_for(
    frame: OpFrame,
    run: RunIdentity | str,
    handed: Lease | None,
    config: JobConfig,
    hold: AdvanceHold | None = None,
) -> Lease | Ticket:
    """The lease to work under, or the ticket to report a completed run with; raises when
    another worker still holds the run after the spec's wait. ``hold``: reserved with the
    takeover of ``handed``."""
    got = claim_or_reuse(
        frame.ledger,
        run,
        frame.worker_id,
        frame.spec.lease_seconds,
        handed=handed,
        wait_seconds=frame.spec.holder_wait_seconds,
        origin=frame.origin,
        hold=hold,
    )
    if isinstance(got, Busy):
        raise busy_error(got.record)
    if isinstance(got, Reused):
        done = got.record
        pruned = done.output is None and done.output_pruned_at is not None
        return Ticket.of_completed(
            done, reuse_notes(config, done.config_parts, output_pruned=pruned)
        )
    return got


def collect_step(frame: OpFrame) -> Ticket:
    """Register the run, take its lease and checkpoint the collected input (once)."""
    context, identity = frame.context, frame.identity
    collector: Collector = getattr(context.resources, frame.spec.collector)
    lease = lease_for(frame, identity, None, frame.config)
    if isinstance(lease, Ticket):
        return report(context, lease)
    reused_input = lease.stored_raw_input is not None
    lease = collect_once(frame.ledger, lease, lambda: collector.collect(identity))
    result = StepResult.INPUT_REUSED if reused_input else StepResult.COLLECTED
    return report(context, Ticket.under(lease, context.run_id, result))


def transform_step(frame: OpFrame, collected: Ticket) -> Ticket:
    """Call the model on the checkpointed input (read from the ledger) under a live lease."""
    context, spec, ledger = frame.context, frame.spec, frame.ledger
    if collected.completed:
        return report(context, collected)
    model, config = frame.model, frame.config
    handed = collected.handed_lease(context.run_id)
    # A first attempt goes straight to the call: its worst case rides on the takeover. A later
    # one may find the answer recorded and make no call, so it reserves only if it calls.
    hold = (
        advance_hold(handed, spec.max_tokens_per_call, config.parts.get("model"))
        if handed is not None and handed.attempts <= 1 and context.retry_number == 0
        else None
    )
    lease = lease_for(frame, collected.run_id, handed, config, hold)
    if isinstance(lease, Ticket):
        return report(context, lease)
    if lease.attempts > 1 or context.retry_number > 0:  # an earlier attempt may have paid
        recorded = recorded_answer(ledger, lease, config)
        if recorded is not None:
            ticket = Ticket.under(lease, context.run_id, StepResult.ANSWER_REUSED, recorded)
            return report(context, ticket, recorded.usage)
    step = StepContext(frame.identity, spec.prompt, lease.run_id, context.run_id, context.op.name)
    try:
        answer = call_model(
            ledger,
            lease,
            lambda raw_input: model.generate(raw_input, step),
            validate=spec.validate,
            config=config,
            origin=frame.origin,
            heartbeat_seconds=spec.lease_seconds / 3,
            # Declared inside the call's guard: a ledger that cannot take the job's budgets or
            # limits ends the attempt (lease given back, no call recorded).
            policy=frame.policy,
            announces_requests=bool(getattr(model, "announces_requests", False)),
            record_answer=True,  # before the answer goes to the IO manager
        )
    except BudgetExceededError as exc:  # retrying today would be refused again: no retry
        raise dg.Failure(
            description=str(exc),
            metadata=budget_metadata(lease.run_id, exc),
            allow_retries=False,
        ) from None
    except ProviderError as exc:
        if not exc.final:
            raise  # may pass (a 429, a 5xx, a timeout): the step's retry policy, with backoff
        # The provider's answer is final (a 4xx other than 408/409/429, a redirect, an answer
        # still outside the schema after its repair turns): another try would pay again for
        # the same refusal. Fix the cause (the request, base_url, the prompt), then re-execute.
        raise dg.Failure(
            description=f"the provider's answer is final, not retried: {describe_error(exc)}",
            metadata={"ledger_run_id": lease.run_id, "result": "failed, final"},
            allow_retries=False,
        ) from exc
    except Exception as exc:
        if not sent_nothing(exc) or isinstance(exc, _MAY_PASS):
            raise
        # Ended before any request reached the provider (a prompt that cannot be built from
        # the stored input, a drill, a lost lease): nothing was paid, and a retry of this step
        # would read the same stored input. Re-execute once the cause is fixed.
        raise dg.Failure(
            description=f"no request was sent: {describe_error(exc)}",
            metadata={"ledger_run_id": lease.run_id, "result": "refused before any request"},
            allow_retries=False,
        ) from exc
    ticket = Ticket.under(lease, context.run_id, StepResult.MODEL_CALLED, answer)
    if answer.usage is not None:  # priced as it was recorded: no read of its own
        context.add_output_metadata({"model_cost": answer.cost or "unknown"})
    if answer.rate_wait_seconds:
        context.add_output_metadata(
            {"rate_limit_wait_seconds": dg.MetadataValue.float(round(answer.rate_wait_seconds, 3))}
        )
    return report(context, ticket, answer.usage)


#: Errors before any request that a retry may not meet again (the ledger out of reach, a lease
#: taken meanwhile): the step's retry policy still applies to them.
_MAY_PASS = (LedgerConnectionError, LeaseLostError, LeaseBusyError, OSError, TimeoutError)


def _commit_or_fail(
    ledger: RunLedger,
    spec: IdempotentJobSpec,
    identity: RunIdentity,
    lease: Lease,
    answer: BoundAnswer,
) -> Completion:
    try:
        return commit(ledger, lease, answer, lambda output: spec.notifications(identity, output))
    except StaleCandidateError as exc:  # revised since: this answer is not the result
        raise dg.Failure(
            description=f"stale answer, not accepted: {exc}",
            metadata={"ledger_run_id": lease.run_id, "result": "superseded"},
            allow_retries=False,
        ) from None


def persist_step(frame: OpFrame, transformed: Ticket) -> Ticket:
    """Commit the answer, its usage and the outbox rows in one transaction."""
    context, spec, ledger = frame.context, frame.spec, frame.ledger
    if transformed.completed:
        return report(context, transformed)
    answer: BoundAnswer | None = transformed.answer
    if answer is None:  # a ticket no transform produced: nothing to commit, say so
        missing = LedgerError(f"run {transformed.run_id}: the ticket carries no model answer")
        handed_over = transformed.handed_lease(context.run_id)
        if handed_over is not None:
            end_attempt(ledger, handed_over, missing)
        raise missing
    run_id = transformed.run_id
    identity = frame.identity
    completion: Completion | None = None
    ticket = transformed
    handed = transformed.handed_lease(context.run_id)
    if handed is not None:
        try:
            completion = _commit_or_fail(ledger, spec, identity, handed, answer)
        except LeaseLostError:
            completion = None
    if completion is None:
        # The handed lease was lost, or this is a re-execution: claim, then commit the answer
        # this run already paid for (first commit wins), but only on the revision and
        # checkpoint it was computed on.
        lease = lease_for(frame, run_id, None, answer.config)
        if isinstance(lease, Ticket):
            return report(context, lease, costs=CallCosts.of(ledger.model_calls(run_id)))
        completion = _commit_or_fail(ledger, spec, identity, lease, answer)
        ticket = Ticket.under(lease, context.run_id, ticket.result)
    costs = CallCosts.of(ledger.model_calls(run_id))
    if completion.accepted:
        return report(context, ticket.done(StepResult.NEW), answer.usage, costs)
    notes = reuse_notes(answer.config, completion.config_parts)
    return report(context, ticket.done(StepResult.REUSED, notes), None, costs)


def deliver_step(context: dg.OpExecutionContext, persisted: Ticket) -> None:
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


def build_ops(
    spec: IdempotentJobSpec, io_manager_key: str = "io_manager"
) -> tuple[dg.OpDefinition, dg.OpDefinition, dg.OpDefinition, dg.OpDefinition]:
    """collect, transform, persist and deliver for ``spec``.

    Op definition names carry the job's name (Dagster wants them unique per code location);
    the job uses them under the plain node names ``collect``, ``transform``, ... Their tickets
    go through the IO manager under ``io_manager_key``.
    """
    ticket = dg.Out(Ticket, io_manager_key=io_manager_key)

    @dg.op(
        name=f"{spec.name}_collect",
        out=ticket,
        required_resource_keys={"ledger", spec.collector, spec.model},
        tags={"kind": "ledger"},
    )
    def collect(context: dg.OpExecutionContext) -> Ticket:
        """Register the run, take its lease and checkpoint the collected input (once)."""
        frame = OpFrame.of(context, spec)
        with step_span(frame) as span:
            return traced(span, collect_step(frame))

    @dg.op(
        name=f"{spec.name}_transform",
        out=ticket,
        required_resource_keys={"ledger", spec.model},
        retry_policy=spec.model_retry,
        tags={"kind": "model"},
    )
    def transform(context: dg.OpExecutionContext, collected: Ticket) -> Ticket:
        """Call the model on the checkpointed input (read from the ledger) under a live lease."""
        frame = OpFrame.of(context, spec)
        with step_span(frame) as span:
            return traced(span, transform_step(frame, collected))

    @dg.op(name=f"{spec.name}_persist", out=ticket, tags={"kind": "ledger"})
    def persist(
        context: dg.OpExecutionContext, transformed: Ticket, ledger: dg.ResourceParam[RunLedger]
    ) -> Ticket:
        """Commit the answer, its usage and the outbox rows in one transaction."""
        frame = OpFrame.of(context, spec, ledger)
        with step_span(frame) as span:
            return traced(span, persist_step(frame, transformed))

    @dg.op(
        name=f"{spec.name}_deliver",
        required_resource_keys={"ledger", *spec.channels},
        retry_policy=dg.RetryPolicy(max_retries=3, delay=1.0, backoff=dg.Backoff.EXPONENTIAL),
        tags={"kind": "outbox"},
    )
    def deliver(context: dg.OpExecutionContext, persisted: Ticket) -> None:
        """Send this run's undelivered outbox rows, once each, keyed ``<run_id>:<channel>``."""
        with step_span(OpFrame.of(context, spec)):
            deliver_step(context, persisted)

    return collect, transform, persist, deliver
