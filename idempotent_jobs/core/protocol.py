"""The idempotent-run protocol without Dagster: register, claim, collect once, transform, commit.

:func:`run_idempotent` composes the steps of :mod:`idempotent_jobs.core.steps` in one call; the
Dagster ops call the same steps one per op, so a failure leaves the same ledger state through
either. Other schedulers call :func:`run_idempotent` directly.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.budgets import BudgetSpec
from idempotent_jobs.core.collecting import collect_to_carry
from idempotent_jobs.core.commits import commit
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.leases import Busy, Reused, claim_or_reuse
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.policy import NO_POLICY, CallPolicy
from idempotent_jobs.core.rate_limits import RateLimit
from idempotent_jobs.core.records import AdvanceHold, CallOrigin, JobConfig, RunStatus
from idempotent_jobs.core.steps import ModelAnswer, call_model
from idempotent_jobs.core.this_process import default_worker_id

JSONDict = dict[str, Any]
DEFAULT_LEASE_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What one call of :func:`run_idempotent` saw and did.

    ``executed`` is true only when this call ran the model and its output is the accepted one.
    ``status`` is ``running`` (and ``output`` ``None``) when another worker holds the lease.
    ``config_changed`` names the parts of ``config`` (prompt, model, validator) that differ
    from those the reused result was computed under (empty when nothing was reused).
    ``output_pruned_at`` says when retention dropped a reused run's output (``output`` is then
    ``None``; the run is still done, and nothing is recomputed or sent again).
    """

    run_id: str
    status: RunStatus
    output: JSONDict | None
    executed: bool
    worker_id: str
    epoch: int | None = None
    config_changed: tuple[str, ...] = ()
    output_pruned_at: datetime | None = None


@dataclass(frozen=True)
class RunSteps:
    """The user's steps of one logical run (see :func:`run_idempotent`)."""

    collect: Callable[[RunIdentity], JSONDict]
    transform: Callable[[JSONDict], JSONDict | ModelAnswer]
    validate: Callable[[JSONDict], object] | None = None
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How one call of :func:`run_idempotent` works: who it is, how long its lease lasts and
    is renewed, how long it waits for another holder, who called it, and what it runs under."""

    worker_id: str
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float | None = None  # a third of the lease
    wait_seconds: float = 0.0
    origin: CallOrigin = CallOrigin()
    config: JobConfig = JobConfig()
    policy: CallPolicy = NO_POLICY


def run_idempotent(
    ledger: RunLedger,
    identity: RunIdentity,
    *,
    collect: Callable[[RunIdentity], JSONDict],
    transform: Callable[[JSONDict], JSONDict | ModelAnswer],
    validate: Callable[[JSONDict], object] | None = None,
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None,
    worker_id: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    heartbeat_seconds: float | None = None,
    wait_seconds: float = 0.0,
    origin: CallOrigin | None = None,
    config: JobConfig | None = None,
    budget: BudgetSpec | None = None,
    follow_ledger_budget: bool = False,
    max_tokens_per_call: int | None = None,
    rate_limits: Sequence[RateLimit] = (),
    policy: CallPolicy | None = None,
) -> RunOutcome:
    """Run one logical run at most once to completion, however often it is called.

    - A completed run returns its stored output; nothing is collected or transformed.
    - Without the lease (another worker holds it) nothing runs; the outcome says ``running``.
      With ``wait_seconds``, the call first waits that long for the holder to finish or expire.
    - The input is collected once: a stored checkpoint is reused by every later attempt. One
      collected now travels with the model call (stored a moment into it, or with the
      commit; a failed attempt stores it as it ends), so a new run waits on two round
      trips, the claim and the commit.
    - The lease is renewed while ``transform`` runs (every ``heartbeat_seconds``, by default a
      third of the lease); a lost lease raises :class:`LeaseLostError` and never commits.
    - ``validate`` raising, or returning ``False``, fails the attempt; so does any error in
      ``collect`` or ``transform``: the reason is recorded, the run stays retryable, and the
      exception propagates.
    - The answer is bound to the revision and checkpoint it was computed on; ``config`` (the
      prompt, model and validator) is recorded with it, and a reused result computed under
      another configuration says so in ``config_changed``.
    - Every budget the ledger holds for the job caps its model calls: a call that does not fit
      is refused before it is made (:class:`BudgetExceededError`, decided in the ledger; see
      :mod:`.budgets`). ``budget`` declares the job's (a :class:`Budget`, a list of them, or a
      :class:`TokenBudget`), held against the ledger's (:class:`BudgetConflictError` when they
      differ, unless ``follow_ledger_budget``). ``max_tokens_per_call``: the most tokens one
      call of ``transform`` takes, reserved before it runs, so racing workers never overshoot
      a budget (without it a call is only checked against what is spent and held).
    - ``rate_limits`` (:class:`RateLimit`) are the provider limits the transform's model calls
      keep, declared in the ledger and kept by every worker sharing it (the provider models
      take each request's place under them).
    - ``policy``: the four keywords above as one :class:`~idempotent_jobs.core.policy.CallPolicy`,
      built once per job (give either, not both).
    - ``origin`` names the caller's run and step (a scheduler's run id, its step): recorded
      with the claim, its attempt and its model calls.

    The keywords are gathered once into :class:`RunSteps` and :class:`RunOptions`.
    """
    steps = RunSteps(collect, transform, validate, notifications)
    options = RunOptions(
        worker_id=worker_id or default_worker_id(),
        lease_seconds=lease_seconds,
        heartbeat_seconds=heartbeat_seconds,
        wait_seconds=wait_seconds,
        origin=origin or CallOrigin(),
        config=config or JobConfig(),
        policy=_policy_of(
            policy, budget, follow_ledger_budget, max_tokens_per_call, rate_limits
        ).for_job(identity.job_name),
    )
    if not telemetry.active():  # no SDK: not even a span's context manager
        return _run(ledger, identity, steps, options)
    scope = telemetry.run_scope(
        identity.run_id,
        identity.job_name,
        identity.subject_id,
        identity.scheduled_at.isoformat(),
        identity.version,
    )
    with scope, telemetry.span("idempotent_jobs.attempt") as span:
        try:
            outcome = _run(ledger, identity, steps, options)
        except BaseException as exc:
            telemetry.annotate(span, outcome="failed", **{"error.type": type(exc).__name__})
            raise
        if outcome.executed:
            telemetry.annotate(span, outcome="executed", lease_epoch=outcome.epoch)
        return outcome


def _policy_of(
    policy: CallPolicy | None,
    budget: BudgetSpec | None,
    follow_ledger_budget: bool,
    max_tokens_per_call: int | None,
    rate_limits: Sequence[RateLimit],
) -> CallPolicy:
    """``policy``, or one made of the keywords; both is a mistake, named."""
    keywords = (budget, follow_ledger_budget, max_tokens_per_call, tuple(rate_limits))
    if policy is None:
        return CallPolicy(
            budget=budget,
            follow_ledger_budget=follow_ledger_budget,
            max_tokens_per_call=max_tokens_per_call,
            rate_limits=rate_limits,
        )
    if not isinstance(policy, CallPolicy):
        raise InvalidInputError("policy", f"must be a CallPolicy, got {type(policy).__name__}")
    if keywords != (None, False, None, ()):
        raise InvalidInputError(
            "policy",
            "give either a policy or budget/follow_ledger_budget/max_tokens_per_call/"
            "rate_limits, not both",
        )
    return policy


def _run(
    ledger: RunLedger, identity: RunIdentity, steps: RunSteps, options: RunOptions
) -> RunOutcome:
    worker_id = options.worker_id
    # The call's worst case rides on the claim (when a budget covers the job): a budget costs
    # a run no round trip, whether its checkpoint is collected now or was stored before.
    hold = AdvanceHold(
        options.policy.max_tokens_per_call or 0, options.config.parts.get("model") or None
    )
    lease = claim_or_reuse(
        ledger,
        identity,
        worker_id,
        options.lease_seconds,
        wait_seconds=options.wait_seconds,
        origin=options.origin,
        hold=hold,
    )
    if isinstance(lease, Busy):
        record = lease.record
        return RunOutcome(
            run_id=record.run_id,
            status=record.status,
            output=None,
            executed=False,
            worker_id=worker_id,
        )
    if isinstance(lease, Reused):
        done = lease.record
        return RunOutcome(
            run_id=done.run_id,
            status="completed",
            output=done.output,
            executed=False,
            worker_id=worker_id,
            config_changed=tuple(options.config.changed_since(done.config_parts)),
            output_pruned_at=done.output_pruned_at,
        )
    lease, carried = collect_to_carry(ledger, lease, lambda: steps.collect(identity))
    answer = call_model(
        ledger,
        lease,
        steps.transform,
        validate=steps.validate,
        config=options.config,
        origin=options.origin,
        heartbeat_seconds=options.heartbeat_seconds or options.lease_seconds / 3,
        policy=options.policy,
        carried_input=carried,
    )
    completion = commit(ledger, lease, answer, steps.notifications)
    return RunOutcome(
        run_id=lease.run_id,
        status="completed",
        output=completion.output,
        executed=completion.accepted,
        worker_id=worker_id,
        epoch=lease.epoch,
    )


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "ModelAnswer",
    "RunOptions",
    "RunOutcome",
    "RunSteps",
    "default_worker_id",
    "run_idempotent",
]
