"""The protocol's steps, written once: collect once, call the model, commit; and the one way an
attempt ends on failure.

:func:`~idempotent_jobs.core.protocol.run_idempotent` composes them in one call; the Dagster ops
call one each, with a lease handed from op to op. Either way a failure leaves the same ledger
state, because it goes through the same :func:`end_attempt`:

- the attempt ends and the lease is given back at once (the next attempt claims now, not after
  the lease expires);
- the error is stored made safe (NUL and lone surrogates escaped, capped);
- a model call that was made is recorded with its usage: ``failed`` when it raised, ``rejected``
  when its answer was refused (the validator, unbelievable token counts, an output the ledger
  cannot store, or a commit that failed). A failure before the call (a drill, a spent
  token budget, a missing checkpoint) records no call. A lease lost meanwhile (another worker
  took the run over) lets its holder write nothing of the run, but the call it paid for is
  still recorded, as ``lease_lost``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from idempotent_jobs.core.calls import CallBook, keeping
from idempotent_jobs.core.checks import JsonPayload
from idempotent_jobs.core.drills import take_drill
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    DrilledFailure,
    InvalidInputError,
    LeaseLostError,
    LedgerError,
    OutputRejectedError,
    PaidCallError,
    UsageRejectedError,
    mark_unsent,
)
from idempotent_jobs.core.heartbeat import LeaseHeartbeat
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.observers import FailedAttempt, watch
from idempotent_jobs.core.policy import NO_POLICY, CallPolicy
from idempotent_jobs.core.records import (
    AdvanceHold,
    Basis,
    CallOrigin,
    CallOutcome,
    FailedOutcome,
    FenceOutcome,
    JobConfig,
    Lease,
    ModelUsage,
)
from idempotent_jobs.core.usage import check_usage, recordable_usage

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class ModelAnswer:
    """What a model call returns instead of a bare dict, to have its usage recorded (positional
    fields, as users' model steps have always built it)."""

    output: JSONDict
    usage: ModelUsage


@dataclass(frozen=True, kw_only=True)
class BoundAnswer:
    """A checked answer on its way to :func:`~idempotent_jobs.core.commits.commit`: the output,
    what the call cost, the revision and checkpoint it was computed on, the configuration, and
    where the call was made. It is accepted only while the run is still on ``basis``."""

    output: JSONDict
    usage: ModelUsage | None
    basis: Basis
    config: JobConfig
    origin: CallOrigin
    #: ``output`` as checked and serialised by :func:`call_model`, committed as it is (no
    #: second serialisation); ``None`` for an answer read back from storage (a ticket, the
    #: ledger), which the commit serialises.
    payload: JsonPayload | None = field(default=None, compare=False, repr=False)
    #: Seconds the call waited for places under a provider's rate limit (the run's metadata).
    rate_wait_seconds: float = field(default=0.0, compare=False)
    #: What the call cost (``0.0012 USD``) at the price in force when it was recorded, ``None``
    #: when unknown or not recorded yet (the step's metadata).
    cost: str | None = field(default=None, compare=False)
    #: The checkpoint ``basis`` names, when it travelled with the call and is not stored yet:
    #: the commit stores it (:func:`~idempotent_jobs.core.collecting.collect_to_carry`).
    carried_input: JsonPayload | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the payloads (Dagster's default IO manager pickles the answer between
        steps): a step of another release unpickles it, and the commit serialises again."""
        return {k: v for k, v in self.__dict__.items() if k not in ("payload", "carried_input")}


def end_attempt(
    ledger: RunLedger,
    lease: Lease,
    exc: BaseException,
    usage: ModelUsage | None = None,
    *,
    call: CallOutcome | None = None,
    origin: CallOrigin | None = None,
    carried: JsonPayload | None = None,
) -> FenceOutcome | None:
    """End the attempt under ``lease`` as failed because of ``exc``; the one way every step
    ends on failure. Records the model call too when ``call`` says one was made (``failed`` or
    ``rejected``) with its ``usage``. Returns what the ledger says happened, or ``None`` when
    nothing could be written (the lease was lost, or the database is out of reach): recording
    never hides the first error. ``carried``: the checkpoint the attempt collected and has not
    stored yet, stored first, so the next attempt reuses it."""
    if carried is not None:
        try:
            ledger.checkpoint(lease, carried)
        except LedgerError:  # lost, or out of reach: the next attempt collects again
            pass
    if isinstance(exc, UsageRejectedError):
        usage = exc.recorded
    outcome: FailedOutcome = (
        "budget"
        if isinstance(exc, BudgetExceededError)
        else "drill"
        if isinstance(exc, DrilledFailure)
        else "failed"
    )
    watch.attempt_failed(FailedAttempt(exc, outcome, call, usage))
    try:
        return ledger.fail(
            lease,
            describe_error(exc),
            usage,
            call=call,
            origin=origin,
            ends=outcome,
        )
    except Exception:  # LeaseLostError, an outage: the caller re-raises `exc` either way
        return None


def call_outcome(called: bool, answered: bool) -> CallOutcome | None:
    """How a model call ended when its step failed: not made (``None``), raised (``failed``),
    or answered and the answer refused (``rejected``)."""
    if not called:
        return None
    return "rejected" if answered else "failed"


def advance_hold(
    lease: Lease, max_tokens_per_call: int | None, model_name: str | None
) -> AdvanceHold | None:
    """What the statement handing ``lease`` to its model call reserves of the job's budgets:
    the step's declared most tokens per call (none declared: the call is only checked), when
    a budget covered the job as the lease was claimed; else nothing."""
    if lease.budgeted is not True:
        return None
    return AdvanceHold(max_tokens_per_call or 0, model_name or None)


def unpack_answer(answer: object) -> tuple[object, ModelUsage | None]:
    if isinstance(answer, ModelAnswer):
        return answer.output, answer.usage
    return answer, None


def check_output(output: JSONDict, validate: Callable[[JSONDict], object] | None) -> None:
    """Raise if ``validate`` raises or returns ``False`` (:class:`OutputRejectedError`)."""
    if validate is not None and validate(output) is False:
        raise OutputRejectedError()


def call_model(
    ledger: RunLedger,
    lease: Lease,
    model: Callable[[JSONDict], Any],
    *,
    config: JobConfig,
    origin: CallOrigin,
    heartbeat_seconds: float,
    validate: Callable[[JSONDict], object] | None = None,
    before_call: Callable[[], None] | None = None,
    policy: CallPolicy = NO_POLICY,
    announces_requests: bool = False,
    record_answer: bool = False,
    carried_input: JsonPayload | None = None,
) -> BoundAnswer:
    """Call ``model`` on the lease's checkpoint while renewing the lease, check the answer, and
    bind it to the basis it was computed on.

    The answer must be storable (a JSON object within the ledger's limits), its usage believable
    and ``validate`` must accept it; otherwise the attempt ends with the call ``rejected``. A
    ``model`` that raises ends it with the call ``failed``; ``before_call`` raising (a drill)
    ends it with no call recorded. So does a budget with no room for the call
    (:class:`BudgetExceededError`, decided in the ledger; the attempt ends ``budget``). A lease
    lost meanwhile raises :class:`LeaseLostError`.

    ``policy`` (:class:`~idempotent_jobs.core.policy.CallPolicy`, one per job) is what decides
    whether the call may be sent: its job's armed failure drill is taken
    (:mod:`idempotent_jobs.core.drills`); the budgets it declares are held against the ledger's
    (:class:`BudgetConflictError` when they differ, unless it follows the ledger's), and
    whatever the ledger holds for the job is enforced; its rate limits are declared. A model
    step that ``announces_requests`` (calls :meth:`CallBook.before_request` with each
    request's worst case, as the provider models do) has each request admitted there, in one
    statement; any other is reserved once before it runs, at the policy's
    ``max_tokens_per_call`` (none: only checked). What the lease holds already
    (reserved with the claim, the checkpoint or the handover) is not reserved
    again: that step's or first request's budget costs no round trip.

    ``record_answer``: record the paid call with its answer before returning it
    (:meth:`RunLedger.record_answer`), for a caller whose answer crosses a step boundary
    before its commit (Dagster's ``transform``): whatever happens to it there, the call is
    in the books and a later attempt can reuse the answer (:func:`recorded_answer`).

    ``carried_input``: the lease's checkpoint, collected by
    :func:`~idempotent_jobs.core.collecting.collect_to_carry` and not
    stored yet: sent beside the call (the lease renewer stores it) and otherwise carried by
    the answer to its commit, or stored as the attempt ends on failure.
    """
    raw_input = lease.stored_raw_input
    if raw_input is None:
        missing = LedgerError(f"run {lease.run_id} has no raw-input checkpoint; collect it first")
        end_attempt(ledger, lease, missing, origin=origin)
        raise missing
    called = answered = False
    usage: ModelUsage | None = None
    book = CallBook()
    with (
        watch.step("chat", lease, model=config.parts.get("model")),
        LeaseHeartbeat(ledger, lease, heartbeat_seconds, carried_input) as heartbeat,
    ):
        budgeted = False
        try:
            held = lease.held_tokens
            if policy.declare(ledger, lease):
                held = None  # a budget may be new since the hold: reserve under all
            budgeted = bool(policy.budgets) or lease.budgeted is not False
            if budgeted and not announces_requests and held is None:
                ledger.reserve_budget(
                    lease,
                    max_tokens=policy.max_tokens_per_call,
                    requested_model=config.parts.get("model") or None,
                )
            if policy.job_name is not None:
                take_drill(ledger, lease, policy.job_name)
            if before_call is not None:
                before_call()
            called = True
            book = CallBook(
                ledger,
                lease,
                origin,
                budgeted=budgeted,
                max_tokens_per_call=policy.max_tokens_per_call,
                held_tokens=held,
                lease_check=heartbeat.raise_if_lost,
            )
            with keeping(book):
                output, reported = unpack_answer(model(raw_input))
            answered = True
            usage = believed_usage(reported)
            payload = checked_payload(ledger, output, validate)
        except BaseException as exc:
            if isinstance(exc, PaidCallError):  # the last request's cost, as the step knew it
                usage, answered = recordable_usage(exc.usage), exc.answered
            # Refused before its request was sent (the book's lease, budget or rate check), or
            # a step that announces its requests failed before its first (its prompt could not
            # be built): the requests that were sent are recorded already, and no other is.
            # The library's own refusal of the input (a prompt builder's `require`, a request
            # schema it cannot make) is raised before any request, by any step.
            before_any = called and not answered and book.requests == 0
            unsent = book.refused or (
                before_any and (announces_requests or isinstance(exc, InvalidInputError))
            )
            outcome = None if unsent else call_outcome(called, answered)
            if outcome is None:
                mark_unsent(exc)
                if budgeted:  # a request held and never sent gives it back
                    _release_budget(ledger, lease)
            carried = heartbeat.take_checkpoint()
            end_attempt(ledger, lease, exc, usage, call=outcome, origin=origin, carried=carried)
            raise
    if heartbeat.lost:  # the call was paid for: record it though the run moved on
        ledger.record_lost_call(lease, usage, lease.revision, origin=origin)
        watch.call_lost(usage)
    heartbeat.raise_if_lost()
    answer = BoundAnswer(
        output=payload.value,
        usage=usage,
        basis=lease.basis,
        config=config,
        origin=origin,
        payload=payload,
        rate_wait_seconds=book.rate_wait_seconds,
        carried_input=heartbeat.take_checkpoint(),
    )
    if record_answer:
        try:
            cost = ledger.record_answer(
                lease,
                payload.value,
                usage,
                basis=answer.basis,
                config=config,
                origin=origin,
                payload=payload,
            )
            answer = replace(answer, cost=cost)
        except LeaseLostError:
            watch.call_lost(usage)  # the ledger recorded the call, as ``lease_lost``
            raise
        except BaseException as exc:  # not recorded: the answer must not travel on unpaid
            end_attempt(ledger, lease, exc, usage, call="rejected", origin=origin)
            raise
    return answer


def checked_payload(
    ledger: RunLedger, output: object, validate: Callable[[JSONDict], object] | None
) -> JsonPayload:
    """The output as the ledger will store it, once ``validate`` accepts it; raises otherwise
    (the call is then ``rejected``)."""
    payload = ledger.output_payload(output)
    check_output(payload.value, validate)
    return payload


def believed_usage(reported: ModelUsage | None) -> ModelUsage | None:
    """The usage an answer reported, once believable (:class:`UsageRejectedError` otherwise),
    told to the engine's observers (inside the call's ``chat`` step)."""
    usage = check_usage(reported)
    if usage is not None:
        watch.answered(usage)
    return usage


def release_hold(ledger: RunLedger, lease: Lease) -> None:
    """Give back what the claim held of the job's budgets for a call that will not be sent
    (nothing when it held none)."""
    if lease.held_tokens is not None:
        _release_budget(ledger, lease)


def _release_budget(ledger: RunLedger, lease: Lease) -> None:
    try:
        ledger.release_budget(lease)
    except Exception:  # an outage: the hold lapses with its period; the first error is raised
        pass
