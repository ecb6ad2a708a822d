"""The end of a protocol step that holds an answer, written once for every driver: the fenced
commit (:func:`commit`), an answer an earlier attempt recorded and paid for, reused
(:func:`recorded_answer`), and the attempt of a call paid for elsewhere, an item of a provider
batch (:func:`accept_paid_answer`). A failure ends the attempt through
:func:`~idempotent_jobs.core.steps.end_attempt`, as every step's does."""

from collections.abc import Callable, Mapping

from idempotent_jobs.core.errors import (
    LeaseLostError,
    PaidCallError,
    StaleCandidateError,
)
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.observers import watch
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
    checked_payload,
    end_attempt,
    unpack_answer,
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
    watch.reused("answer")
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
    with watch.step("commit", lease):
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
            watch.committed("lease_lost" if lost else "superseded", answer.usage)
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
        # `reused`: another answer of this run was accepted first, and this one is not.
        watch.committed("accepted" if completion.accepted else "reused", answer.usage)
        return completion


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
    ``basis``, what the engine's observers are told, and cost. A failure ends the attempt
    through :func:`end_attempt` (the call ``failed`` or ``rejected``, recorded once; the lease
    and the hold given back) and propagates; a lost lease or a stale basis raise as
    :func:`commit` raises them."""
    answered = False
    usage: ModelUsage | None = None
    with watch.step("chat", lease, model=config.parts.get("model")):
        try:
            output, reported = unpack_answer(produce())
            answered = True
            usage = believed_usage(reported)
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
