"""The four ops of an idempotent job, built for one :class:`IdempotentJobSpec`.

Between ops travels a small JSON "ticket": the ledger run id, whether the run is already
completed, and the lease (owner + epoch) handed on to the next step of the *same* Dagster run.
A step in another Dagster run (re-execution, run retry) never uses a ticket it did not issue:
it claims the lease itself, waiting for the previous holder to finish or expire. The model's
answer travels with its basis (the revision and checkpoint fingerprint it was computed on) and
the job's configuration; ``persist`` commits it only on that basis.
"""

import uuid
from dataclasses import asdict
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
from idempotent_jobs.core.leases import take_over
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.protocol import check_output, record_failure
from idempotent_jobs.core.records import (
    Basis,
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
from idempotent_jobs.dagster.resources import DocumentCollector, NotificationChannel, SummaryModel

Ticket = dict[str, Any]


def _worker_id(context: dg.OpExecutionContext) -> str:
    """Unique per op execution, readable in the ledger: Dagster run, op, retry, random."""
    return (
        f"dagster:{context.run_id}:{context.op.name}:{context.retry_number}:{uuid.uuid4().hex[:6]}"
    )


def reuse_label(config: JobConfig, stored_parts: dict[str, str] | None) -> str:
    """``reused``, or ``reused (config changed: prompt)`` when the stored result was computed
    under another prompt, model or validator than the job has now."""
    changed = config.changed_since(stored_parts)
    return f"reused (config changed: {', '.join(changed)})" if changed else "reused"


def _completed_ticket(record: RunRecord | Ticket, result: str = "reused") -> Ticket:
    """The ticket of a run already completed: later ops only report it (as ``result``)."""
    if isinstance(record, RunRecord):
        record = {"run_id": record.run_id, "epoch": record.lease_epoch, "attempts": record.attempts}
    return {
        "run_id": record["run_id"],
        "completed": True,
        "lease": None,
        "caller_run_id": None,
        "epoch": record["epoch"],
        "attempts": record["attempts"],
        "result": result,
    }


def _lease_ticket(context: dg.OpExecutionContext, lease: Lease, **extra: Any) -> Ticket:
    return {
        "run_id": lease.run_id,
        "completed": False,
        "lease": lease.ticket(),
        "caller_run_id": context.run_id,
        "epoch": lease.epoch,
        "attempts": lease.attempts,
        **extra,
    }


def _handed_lease(context: dg.OpExecutionContext, ticket: Ticket) -> Lease | None:
    """The lease an upstream step of this very Dagster run handed on, if any."""
    if ticket.get("lease") and ticket.get("caller_run_id") == context.run_id:
        return Lease.from_ticket(ticket["lease"])
    return None


def _report(
    context: dg.OpExecutionContext,
    ticket: Ticket,
    result: str,
    usage: ModelUsage | None = None,
    costs: CallCosts | None = None,
) -> Ticket:
    """Output metadata (from what the step already knows, and ``costs`` where the step read
    them), so the run page answers "did this Dagster run do the work, and what did the logical
    run cost?". Returns ``ticket`` for chaining."""
    metadata: dict[str, Any] = {
        "ledger_run_id": ticket["run_id"],
        "result": result,
        "lease_epoch": ticket["epoch"],
        "attempts": ticket["attempts"],
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
    context.log.info(f"ledger run {ticket['run_id']}: {result}")
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

    def claim(
        context: dg.OpExecutionContext, ledger: RunLedger, run_id: str, handed: Lease | None
    ) -> Lease | RunRecord:
        return take_over(
            ledger,
            run_id,
            handed,
            _worker_id(context),
            spec.lease_seconds,
            wait_seconds=spec.holder_wait_seconds,
            caller_run_id=context.run_id,
            caller_step=context.op.name,
        )

    def reused(context: dg.OpExecutionContext, record: RunRecord, model: SummaryModel) -> Ticket:
        label = reuse_label(spec.config(model.model_name), record.config_parts)
        return _report(context, _completed_ticket(record, label), label)

    @dg.op(name=f"{spec.name}_collect", out=dg.Out(Ticket), tags={"kind": "ledger"})
    def collect(
        context: dg.OpExecutionContext,
        ledger: dg.ResourceParam[RunLedger],
        collector: DocumentCollector,
        model: SummaryModel,
    ) -> Ticket:
        """Register the run, take its lease and checkpoint the collected input (once)."""
        identity = identity_of(context)
        record, lease = ledger.begin(
            identity,
            _worker_id(context),
            spec.lease_seconds,
            caller_run_id=context.run_id,
            caller_step=context.op.name,
        )
        if record.status == "completed":
            return reused(context, record, model)
        if lease is None:  # another worker holds it: wait for it to finish or expire
            got = claim(context, ledger, record.run_id, None)
            if isinstance(got, RunRecord):
                if got.status != "completed":
                    raise _busy(got)
                return reused(context, got, model)
            lease = got
        reused_input = lease.stored_raw_input is not None
        if not reused_input:
            try:
                raw_input = collector.collect(identity)
            except Exception as exc:
                record_failure(ledger, lease, exc, None)
                raise
            ledger.checkpoint(lease, raw_input)
        result = "reused input" if reused_input else "collected"
        return _report(context, _lease_ticket(context, lease), result)

    @dg.op(
        name=f"{spec.name}_transform",
        out=dg.Out(Ticket),
        retry_policy=spec.model_retry,
        tags={"kind": "model"},
    )
    def transform(
        context: dg.OpExecutionContext,
        collected: Ticket,
        ledger: dg.ResourceParam[RunLedger],
        model: SummaryModel,
    ) -> Ticket:
        """Call the model on the checkpointed input (read from the ledger) under a live lease."""
        run_id = collected["run_id"]
        if collected["completed"]:
            return _report(context, collected, collected.get("result", "reused"))
        lease = claim(context, ledger, run_id, _handed_lease(context, collected))
        if isinstance(lease, RunRecord):
            if lease.status != "completed":
                raise _busy(lease)
            return reused(context, lease, model)
        raw_input = lease.stored_raw_input
        if raw_input is None:
            raise LedgerError(f"run {run_id} has no raw-input checkpoint; re-run collect")
        origin = CallOrigin(context.op.name, context.run_id, context.retry_number)
        answer = None
        with LeaseHeartbeat(ledger, lease, spec.lease_seconds / 3) as heartbeat:
            try:
                fail_if_drilled()
                answer = model.summarize(spec.prompt, raw_input)
                check_output(answer.output, spec.validate)
            except Exception as exc:  # the call failed, or its answer was rejected: both cost
                usage = answer.usage if answer is not None else None
                call: CallOutcome = "failed" if answer is None else "rejected"
                record_failure(ledger, lease, exc, usage, call=call, origin=origin)
                raise
        heartbeat.raise_if_lost()
        ticket = _lease_ticket(
            context,
            heartbeat.lease,
            output=answer.output,
            usage=asdict(answer.usage),
            basis=asdict(lease.basis),  # what the answer was computed on: this checkpoint
            config=dict(spec.config(model.model_name).parts),
            origin=asdict(origin),
        )
        return _report(context, ticket, "model called", answer.usage)

    @dg.op(name=f"{spec.name}_persist", out=dg.Out(Ticket), tags={"kind": "ledger"})
    def persist(
        context: dg.OpExecutionContext, transformed: Ticket, ledger: dg.ResourceParam[RunLedger]
    ) -> Ticket:
        """Commit the answer, its usage and the outbox rows in one transaction."""
        run_id = transformed["run_id"]
        if transformed["completed"]:
            return _report(context, transformed, transformed.get("result", "reused"))
        identity = identity_of(context)
        output = transformed["output"]
        usage = ModelUsage(**transformed["usage"])
        if "basis" not in transformed:  # an answer from a run older than candidate binding
            raise dg.Failure(
                description="this answer does not say which revision and checkpoint it was "
                "computed on (its run predates that); re-execute from transform",
                allow_retries=False,
            )
        basis = Basis(**transformed["basis"])
        config = JobConfig(transformed.get("config", {}))
        origin = CallOrigin(**transformed.get("origin", {}))
        notifications = spec.notifications(identity, output)
        completion: Completion | None = None
        handed = _handed_lease(context, transformed)
        ticket = transformed

        def commit(lease: Lease) -> Completion:
            try:
                return ledger.complete(
                    lease,
                    output,
                    notifications,
                    usage,
                    basis=basis,
                    config=config,
                    origin=origin,
                )
            except StaleCandidateError as exc:  # revised since: this answer is not the result
                raise dg.Failure(
                    description=f"stale answer, not accepted: {exc}",
                    metadata={"ledger_run_id": run_id, "result": "superseded"},
                    allow_retries=False,
                ) from None

        if handed is not None:
            try:
                completion = commit(handed)
            except LeaseLostError:
                completion = None
        if completion is None:
            # The handed lease was lost, or this is a re-execution: claim, then commit the
            # answer this run already paid for (first commit wins), but only on the revision
            # and checkpoint it was computed on.
            lease = claim(context, ledger, run_id, None)
            if isinstance(lease, RunRecord):
                if lease.status != "completed":
                    raise _busy(lease)
                label = reuse_label(config, lease.config_parts)
                costs = CallCosts.of(ledger.model_calls(run_id))
                return _report(context, _completed_ticket(lease, label), label, costs=costs)
            completion = commit(lease)
            ticket = _lease_ticket(context, lease)
        result = "new" if completion.accepted else reuse_label(config, completion.config_parts)
        done = _completed_ticket(ticket, result)
        costs = CallCosts.of(ledger.model_calls(run_id))
        return _report(context, done, result, usage if completion.accepted else None, costs)

    @dg.op(
        name=f"{spec.name}_deliver",
        required_resource_keys={"ledger", *spec.channels},
        retry_policy=dg.RetryPolicy(max_retries=3, delay=1.0, backoff=dg.Backoff.EXPONENTIAL),
        tags={"kind": "outbox"},
    )
    def deliver(context: dg.OpExecutionContext, persisted: Ticket) -> None:
        """Send this run's undelivered outbox rows, once each, keyed ``<run_id>:<channel>``."""
        run_id = persisted["run_id"]
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
