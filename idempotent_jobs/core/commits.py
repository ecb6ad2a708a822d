"""The end of a protocol step that holds an answer, written once for every driver: the fenced
commit (:func:`commit`), an answer an earlier attempt recorded and paid for, reused
(:func:`recorded_answer`), and the attempt of a call paid for elsewhere, an item of a provider
batch (:func:`accept_paid_answer`). A failure ends the attempt through
:func:`~idempotent_jobs.core.steps.end_attempt`, as every step's does."""

from collections.abc import Callable, Mapping
from typing import Any

from idempotent_jobs.core import metrics, telemetry
from idempotent_jobs.core.errors import (
    LeaseLostError,
    PaidCallError,
    StaleCandidateError,
)
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import (
    USAGE_PARTS,
    Basis,
    CallOrigin,
    Completion,
    JobConfig,
    Lease,
    ModelUsage,
)
from idempotent_jobs.core.steps import (
    BoundAnswer,
    JSONDict,
    believed_usage,
    call_outcome,
    chat_span,
    checked_payload,
    end_attempt,
    lease_attributes,
    unpack_answer,
    usage_tokens,
)
from idempotent_jobs.core.usage import recordable_usage


def recorded_answer(ledger: RunLedger, lease: Lease, config: JobConfig) -> BoundAnswer | None:
    """The answer an earlier attempt paid for and recorded (:func:`call_model` with
    ``record_answer``) but never committed, when it is still valid: on the lease's revision and
    checkpoint, under the same configuration. It keeps its origin, so its commit updates the
    recorded call instead of adding one. ``None`` when there is none."""
    row = ledger.recorded_answer(lease)
    if row is None or dict(row["config_parts"] or {}) != dict(config.parts):
        return None
    usage = ModelUsage(
        row["model_name"],
        row["input_tokens"],
        row["output_tokens"],
        requested_model=row["requested_model"],
        **{name: row[name] for name in USAGE_PARTS},
    )
    origin = CallOrigin(
        caller_step=row["caller_step"],
        caller_run_id=row["caller_run_id"],
        retry_number=row["retry_number"],
    )
    telemetry.annotate_current(answer_reused=True)
    return BoundAnswer(
        output=row["answer"], usage=usage, basis=lease.basis, config=config, origin=origin
    )


def commit(
    ledger: RunLedger,
    lease: Lease,
    answer: BoundAnswer,
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None,
) -> Completion:
    """Accept ``answer`` and queue its notifications in one transaction (see
    :meth:`RunLedger.complete`). A lost lease or a stale basis raise as they are (the ledger
    recorded what it could); any other failure (a payload builder, a payload the ledger
    refuses) ends the attempt with the call ``rejected``."""
    with telemetry.span("idempotent_jobs.commit", lease_attributes(lease)) as span:
        try:
            messages = notifications(answer.output) if notifications is not None else None
            completion = ledger.complete(
                lease,
                answer.output,
                messages,
                answer.usage,
                basis=answer.basis,
                config=answer.config,
                origin=answer.origin,
                payload=answer.payload,
                carried_input=answer.carried_input,
            )
        except (LeaseLostError, StaleCandidateError) as exc:
            lost = isinstance(exc, LeaseLostError)
            _not_accepted(span, answer.usage, "lease_lost" if lost else "superseded")
            raise
        except BaseException as exc:
            end_attempt(
                ledger,
                lease,
                exc,
                answer.usage,
                call="rejected",
                origin=answer.origin,
                carried=answer.carried_input,
            )
            raise
        if completion.accepted:
            telemetry.annotate(span, outcome="accepted")
            metrics.count_run("executed")
        else:  # another answer of this run was accepted first: this one is not
            _not_accepted(span, answer.usage, "reused")
        return completion


def _not_accepted(span: Any, usage: ModelUsage | None, outcome: str) -> None:
    telemetry.annotate(span, outcome=outcome)
    metrics.count_run(outcome)
    if usage is not None:
        call = "stale" if outcome in ("superseded", "reused") else outcome
        metrics.count_tokens_not_accepted(usage_tokens(usage), usage.priced_model, call)


def accept_paid_answer(
    ledger: RunLedger,
    lease: Lease,
    produce: Callable[[], object],
    *,
    basis: Basis,
    config: JobConfig,
    origin: CallOrigin,
    validate: Callable[[JSONDict], object] | None = None,
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None,
) -> Completion:
    """The attempt of a call already made and paid for elsewhere (an item of a provider batch):
    ``produce()`` gives its answer as a model step would (a :class:`ModelAnswer`), or raises the
    provider's error for it (a :class:`PaidCallError` carries its usage). From there it goes the
    way :func:`~idempotent_jobs.core.steps.call_model` and :func:`commit` take every answer: the
    usage check, the output the ledger can store, ``validate``, the payload, the fenced commit on
    ``basis``, telemetry and cost. A failure ends the attempt through :func:`end_attempt` (the
    call ``failed`` or ``rejected``, recorded once; the lease and the hold given back) and
    propagates; a lost lease or a stale basis raise as :func:`commit` raises them."""
    answered = False
    usage: ModelUsage | None = None
    with chat_span(lease, config) as span:
        try:
            output, reported = unpack_answer(produce())
            answered = True
            usage = believed_usage(span, reported)
            payload = checked_payload(ledger, output, validate)
        except BaseException as exc:
            if isinstance(exc, PaidCallError):
                usage, answered = recordable_usage(exc.usage), exc.answered
            end_attempt(ledger, lease, exc, usage, call=call_outcome(True, answered), origin=origin)
            raise
    answer = BoundAnswer(
        output=payload.value,
        usage=usage,
        basis=basis,
        config=config,
        origin=origin,
        payload=payload,
    )
    return commit(ledger, lease, answer, notifications)
