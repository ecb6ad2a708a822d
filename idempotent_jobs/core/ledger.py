"""The run ledger's worker face: durable run records in their own PostgreSQL schema, usable
without Dagster. PostgreSQL is the only authority: uniqueness is a constraint, the lease one atomic
UPDATE on the database clock, and every write after a claim fenced by owner and epoch (the
statements: the ``-- faces: worker`` ones of the stores' files, ``sql/<store>.sql``). Each method
is one statement on an autocommit connection, so one round trip and one transaction, safe to retry
when the connection drops.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any, cast

from psycopg.rows import dict_row

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.batch_book import BatchBook
from idempotent_jobs.core.budgets import Budget, budget_refusal, declared_budget_params
from idempotent_jobs.core.checks import (
    JsonPayload,
    caller_params,
    check_identity,
    check_lease_seconds,
    check_name,
    check_worker_id,
    fence_params,
    identity_params,
    notifications_json,
    origin_params,
    stale_error,
    usage_params,
)
from idempotent_jobs.core.delivery import OutboxDelivery
from idempotent_jobs.core.error_text import redact_secrets, safe_text
from idempotent_jobs.core.errors import (
    BudgetConflictError,
    IdentityConflictError,
    InvalidInputError,
    LeaseLostError,
    LedgerError,
    RunNotFoundError,
)
from idempotent_jobs.core.face import MovedMethod, operator_method
from idempotent_jobs.core.identity import RunIdentity, normalize_text
from idempotent_jobs.core.json_values import dump_json_object
from idempotent_jobs.core.rate_limits import (
    BURST_SHARE,
    PACE_SHARE,
    RateGrant,
    RateLimit,
    RateRequest,
    forget_limits,
)
from idempotent_jobs.core.records import (
    AdvanceHold,
    Basis,
    CallOrigin,
    CallOutcome,
    Completion,
    FailedOutcome,
    FenceOutcome,
    JobConfig,
    Lease,
    ModelCallRecord,
    ModelUsage,
    RunRecord,
)
from idempotent_jobs.core.rows import record_from, record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.step_outputs import StepOutputs


def _held(hold: AdvanceHold | None, outcome: str | None, before: int | None) -> int | None:
    """What a lease holds after a write that may have reserved ``hold``: its tokens when the
    budgets admitted it; nothing when they did not; unchanged when none was asked."""
    if hold is None:
        return before
    return hold.max_tokens if outcome == "admitted" else None


class RunLedger(OutboxDelivery, StepOutputs, BatchBook):
    """The ledger's worker face: durable run records, fenced leases, checkpoint, commit, outbox.

    ``RunLedger(conninfo, **settings)`` or ``RunLedger(LedgerSettings(...))`` (see
    :class:`~idempotent_jobs.core.settings.LedgerSettings` and
    :class:`~idempotent_jobs.core.face.LedgerFace`). In Dagster, the
    :class:`~idempotent_jobs.dagster.resource.RunLedgerResource` creates one per run. What an
    operator does (listings, revise, drills, prices, migrate, retention) is the other face,
    :class:`~idempotent_jobs.core.admin.LedgerAdmin`.
    """

    face = "worker"

    # Asked of a worker face, these say where they went (no __getattr__: see MovedMethod).
    migrate = operator_method("migrate")
    upgrade = operator_method("upgrade")
    missing_privileges = operator_method("missing_privileges")
    arm_drill = operator_method("arm_drill")
    disarm_drills = operator_method("disarm_drills")
    attempts = operator_method("attempts")
    outbox = operator_method("outbox")
    revisions = operator_method("revisions")
    revise = operator_method("revise")
    register = MovedMethod("was removed in 0.2: begin registers and claims in one statement")
    save_raw_input = MovedMethod(
        "was removed in 0.2: checkpoint(lease, raw_input).stored_raw_input is the stored value"
    )

    def __init__(self, settings: LedgerSettings | str, **options: Any) -> None:
        super().__init__(settings, **options)  # pool=, and any setting
        self._declared_budgets: set[tuple[str, tuple[Budget, ...], bool]] = set()
        self._currency: str | None = None

    def _lease_write(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` of a lease-only write plus its commit mode (see ``sql/runs.sql``)."""
        params["lease_commit"] = None if self.settings.durable_lease_commits else "off"
        return params

    # -- registration and leases -------------------------------------------------------------

    def _stored_id_of(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` under the run id stored for their identity fields, after the identity key
        refused them (ON CONFLICT (run_id) arbitrates on the primary key only): a registration
        that raced this one (the same id), or a run an earlier release registered in another
        Unicode form, which migrate put in NFC under its old id (core/upgrade.py)."""
        rows = self._db.rows("run_id_by_identity", params)
        return {**params, "run_id": rows[0][0]} if rows else params

    def begin(
        self,
        identity: RunIdentity,
        worker_id: str,
        lease_seconds: float,
        *,
        origin: CallOrigin | None = None,
    ) -> tuple[RunRecord, Lease | None]:
        """Register the run (a new row, or the stored one) and :meth:`claim` it, in one
        statement. Returns the record and the new lease, or the record and ``None`` when the run
        is completed (nothing is written) or another worker holds it (only updated_at moves).
        :class:`IdentityConflictError` when the run id is stored with other identity fields.
        ``origin``: the caller's run and step, recorded with the claim and its attempt."""
        lease_seconds = check_lease_seconds(lease_seconds)
        params = self._lease_write(
            {
                **identity_params(identity),
                "worker_id": check_worker_id(worker_id),
                "lease_seconds": lease_seconds,
                **caller_params(origin),
            }
        )
        rows: list[dict[str, Any]] = []
        for attempt in range(3):
            # No row: a first registration raced this one, or the run completed while this
            # statement waited for its lock. Either has committed and is seen by the next try.
            try:
                rows = self._db.fetch("begin", params, dict_row)
            except IdentityConflictError:  # see _stored_id_of
                if attempt:
                    raise  # a real conflict raises again
                params = self._stored_id_of(params)
                continue
            if rows:
                break
        if not rows:
            raise LedgerError(f"run {identity.run_id} was deleted while being registered")
        claimed = rows[0]["claimed"]
        record = record_from(RunRecord, rows[0])
        check_identity(record, identity)
        if not claimed:
            return record, None
        lease = Lease(
            run_id=record.run_id,
            worker_id=worker_id,
            epoch=record.lease_epoch,
            expires_at=record.lease_expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=record.raw_input,
            attempts=record.attempts,
            revision=record.revision,
            input_fingerprint=record.input_fingerprint,
            drill_armed=rows[0]["drill_armed"],
            budgeted=rows[0]["budgeted"],
        )
        return record, lease

    def claim(
        self,
        run_id: str,
        worker_id: str,
        lease_seconds: float,
        *,
        origin: CallOrigin | None = None,
    ) -> Lease | None:
        """Take the run's lease; ``None`` if another worker holds it or the run is completed."""
        lease_seconds = check_lease_seconds(lease_seconds)
        rows = self._db.rows(
            "claim",
            self._lease_write(
                {
                    "run_id": run_id,
                    "worker_id": check_worker_id(worker_id),
                    "lease_seconds": lease_seconds,
                    **caller_params(origin),
                }
            ),
        )
        if not rows:
            return None
        epoch, expires_at, raw_input, attempts, revision, fingerprint = rows[0]
        return Lease(
            run_id=run_id,
            worker_id=worker_id,
            epoch=epoch,
            expires_at=expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
        )

    def _hold_params(self, params: dict[str, Any], hold: AdvanceHold | None) -> dict[str, Any]:
        """``params`` of a lease write that may carry an :class:`AdvanceHold`. The hold commits
        as the lease does (``durable_lease_commits``): one lost in a server crash takes the
        lease write with it, and the call it admitted, if made, is charged when recorded."""
        return {
            **self._lease_write(params),
            "hold_tokens": None if hold is None else hold.max_tokens,
            "requested": None if hold is None else hold.requested_model,
        }

    def renew(self, lease: Lease, *, hold: AdvanceHold | None = None) -> Lease:
        """Extend the lease by its duration from now (database clock); raise if it was lost.

        Also how a later step (another process, even) takes over a lease handed on to it: the
        owner and epoch are the capability, and the returned lease carries the checkpoint.
        ``hold``: reserve the coming model call's worst case in the same statement
        (``held_tokens`` of the returned lease says whether it was admitted; one that was not
        is left for the call to reserve, and refuse, itself).
        """
        params = self._hold_params(
            {**fence_params(lease), "lease_seconds": lease.lease_seconds}, hold
        )
        rows = self._db.rows("renew", params)
        if not rows:
            raise LeaseLostError()
        expires_at, raw_input, attempts, revision, fingerprint, _, held = rows[0]
        return replace(
            lease,
            expires_at=expires_at,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
            held_tokens=_held(hold, held, lease.held_tokens),
        )

    def checkpoint(
        self, lease: Lease, raw_input: dict[str, Any], *, hold: AdvanceHold | None = None
    ) -> Lease:
        """Checkpoint the collected input; the first stored value wins. Returns the lease with
        the stored checkpoint and its fingerprint: the :class:`Basis` of an answer computed on
        it. ``hold``: as for :meth:`renew`."""
        raw = JsonPayload.of(raw_input, "raw_input", self.settings.max_raw_input_bytes)
        params = self._hold_params(
            {**fence_params(lease), "raw_input": raw.text, "input_fingerprint": raw.fingerprint},
            hold,
        )
        rows = self._db.rows("save_raw_input", params)
        if not rows:
            raise LeaseLostError()
        stored, fingerprint, _, held = rows[0]
        return replace(
            lease,
            stored_raw_input=stored,
            input_fingerprint=fingerprint,
            held_tokens=_held(hold, held, lease.held_tokens),
        )

    def output_payload(self, output: object) -> JsonPayload:
        """``output`` checked and serialised once, as :meth:`record_answer` and
        :meth:`complete` store it; :class:`InvalidInputError` naming ``output`` if they could
        not (not a JSON object, NaN, NUL, too deep, over ``max_output_bytes``). Nothing is
        written: a caller checks an answer before it decides the call's outcome."""
        return JsonPayload.of(output, "output", self.settings.max_output_bytes)

    def _serialised(self, output: dict[str, Any], payload: JsonPayload | None) -> str:
        """``output``'s JSON text: ``payload``'s (:meth:`output_payload` made it when the answer
        was checked), so an answer is serialised once, or made now."""
        if payload is not None and payload.value is output:
            return payload.text
        return self.output_payload(output).text

    def complete(
        self,
        lease: Lease,
        output: dict[str, Any],
        notifications: Mapping[str, dict[str, Any]] | None = None,
        usage: ModelUsage | None = None,
        *,
        basis: Basis | None = None,
        config: JobConfig | None = None,
        origin: CallOrigin | None = None,
        payload: JsonPayload | None = None,
    ) -> Completion:
        """Accept ``output`` and queue ``notifications`` in one transaction.

        ``basis`` is what the output was computed against (default: the lease's revision and
        checkpoint, right when the lease is the one the output was computed under). The output
        is accepted only while the run is still on that basis; otherwise nothing of it is
        stored or sent, the lease is given back, the attempt is recorded ``superseded``, and
        :class:`StaleCandidateError` is raised. ``config`` is recorded with the result, and
        the model call that produced ``output`` (``usage``, made at ``origin``) in
        ``model_calls``, as accepted or stale.

        If the run was already completed, return the stored output: ``accepted`` tells whether
        it was this lease's (a retry after a lost answer) or another attempt's. If the lease was
        lost before completion, raise :class:`LeaseLostError` having written nothing of the run:
        only the model call, as ``lease_lost`` (:meth:`record_lost_call`), which a later commit
        of the same answer from the same caller run, step and retry updates.

        ``payload``: ``output`` as :meth:`output_payload` checked and serialised it (its text is
        stored as it is, not made again).
        """
        basis = basis or lease.basis
        config = config or JobConfig()
        parts = dict(config.parts)
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "output": self._serialised(output, payload),
            "notifications": notifications_json(notifications),
            "revision": basis.revision,
            "input_fingerprint": basis.input_fingerprint,
            # What a stale attempt's error says the answer was computed on.
            "computed_on": f"stale candidate: computed on revision {basis.revision}, "
            f"checkpoint {(basis.input_fingerprint or 'none')[:12]}; the run is at revision ",
            "config_fingerprint": config.fingerprint if parts else None,
            "config_parts": dump_json_object(parts, "config") if parts else None,
        }
        [(outcome, stored, revision, fingerprint, mine, stored_parts, money)] = self._db.rows(
            "complete", params
        ) or [("lease_lost", None, None, None, False, None, None)]
        self._count_cost(money, usage)
        if outcome == FenceOutcome.APPLIED:
            return Completion(output=stored, accepted=True, config_parts=parts or None)
        if outcome == FenceOutcome.STALE:
            raise stale_error(
                lease.run_id, basis, Basis(revision=revision, input_fingerprint=fingerprint)
            )
        if outcome == FenceOutcome.ALREADY_DONE and stored is not None:
            if not mine:  # another attempt completed the run: this call is still paid for
                self.record_lost_call(lease, usage, basis.revision, origin=origin)
            return Completion(output=stored, accepted=bool(mine), config_parts=stored_parts)
        self.record_lost_call(lease, usage, basis.revision, origin=origin)
        raise LeaseLostError()

    def fail(
        self,
        lease: Lease,
        error: str,
        usage: ModelUsage | None = None,
        *,
        call: CallOutcome | None = None,
        origin: CallOrigin | None = None,
        ends: FailedOutcome = "failed",
    ) -> FenceOutcome:
        """Record a failed attempt and free the run for a retry; raise if the lease was lost.

        ``ends``: how the attempt ends, ``failed``, or ``drill`` (made on purpose by a failure
        drill), or ``budget`` (the job's token budget refused the model call).

        Returns ``applied``, or ``already_done`` when this very failure had landed (a retry
        after a lost answer). ``error`` is stored made safe (:func:`safe_text`).

        ``call`` says a model call ended this way (``failed``: it raised; ``rejected``: the
        validator refused its answer); it is recorded with ``usage`` in ``model_calls``, even
        when the lease was lost (then as ``lease_lost``, :meth:`record_lost_call`).
        """
        error = safe_text(redact_secrets(str(error))) or "unknown error"
        if ends not in ("failed", "drill", "budget"):
            raise InvalidInputError("ends", f"must be failed, drill or budget, got {ends!r}")
        if call not in (None, "failed", "rejected"):
            raise InvalidInputError("call", f"must be 'failed' or 'rejected', got {call!r}")
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "error": error,
            "call_outcome": call,
            "attempt_outcome": ends,
        }
        rows = self._db.rows("fail", params)
        outcome = FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST
        if outcome != FenceOutcome.LEASE_LOST:
            self._count_cost(rows[0][1], usage, added=rows[0][2])
            return outcome
        if call is not None:
            self.record_lost_call(lease, usage, lease.revision, origin=origin, error=error)
        raise LeaseLostError()

    def record_answer(
        self,
        lease: Lease,
        output: dict[str, Any],
        usage: ModelUsage | None,
        *,
        basis: Basis,
        config: JobConfig,
        origin: CallOrigin,
        payload: JsonPayload | None = None,
    ) -> str | None:
        """Record the paid call that answered ``output`` (outcome ``answered``: usage, model,
        epoch, counted in the spend), with the answer and its basis and configuration, before
        the answer crosses a step boundary. :meth:`complete` (or :meth:`fail`) later updates
        this row, matched by ``origin``; :meth:`recorded_answer` finds it for a later attempt.
        Raises :class:`LeaseLostError` (the call recorded ``lease_lost``) if the lease was lost.
        Returns what the call cost (``0.0012 USD``) at the price in force, ``None`` if unknown
        (no price, no usage, or recorded by an earlier statement).
        """
        parts = dict(config.parts)
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "revision": basis.revision,
            "input_fingerprint": basis.input_fingerprint,
            "answer": self._serialised(output, payload),
            "config_parts": dump_json_object(parts, "config") if parts else None,
        }
        rows = self._db.rows("record_answer", params)
        if rows:
            money = rows[0][1]  # NULL: no price, or no usage known
            self._count_cost(money, usage, added=True)
            if money is None:
                return None
            try:
                currency = self.currency()
            except Exception:  # an outage after the call was recorded: the figure alone
                currency = None
            return f"{Decimal(money).normalize():f} {currency or ''}".rstrip()
        try:  # no row: recorded already (a retried statement), or the lease was lost
            self.renew(lease)
        except LeaseLostError:
            self.record_lost_call(lease, usage, basis.revision, origin=origin)
            raise
        return None

    def recorded_answer(self, lease: Lease) -> dict[str, Any] | None:
        """The latest answer recorded by :meth:`record_answer` and not committed yet, on the
        lease's revision and checkpoint (its columns as a dict), or ``None``."""
        params = {
            "run_id": lease.run_id,
            "revision": lease.revision,
            "input_fingerprint": lease.input_fingerprint,
        }
        rows = self._db.fetch("recorded_answer", params, dict_row)
        return rows[0] if rows else None

    def release(self, lease: Lease) -> FenceOutcome:
        """Give the lease back untouched (the attempt ends ``superseded``), for a step that stops
        early; ``applied``, ``already_done`` (this release landed before), or LeaseLostError."""
        return self._fenced("release", self._lease_write(fence_params(lease)))

    def end_caller_attempt(self, run_id: str, caller_run_id: str, error: str) -> FenceOutcome:
        """End, as failed, the attempt that the Dagster run ``caller_run_id`` holds on the run,
        for a step that failed before its body could (its input could not be loaded, its
        output not stored). Fenced by the Dagster run that claimed the lease: a lease another
        run or worker has taken since is never touched. ``applied`` or ``lease_lost``."""
        params = {
            "run_id": run_id,
            "caller_run_id": check_name("caller_run_id", caller_run_id),
            "error": safe_text(redact_secrets(str(error))) or "unknown error",
        }
        rows = self._db.rows("fail_by_caller", params)
        return FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST

    def record_lost_call(
        self,
        lease: Lease,
        usage: ModelUsage | None,
        revision: int,
        *,
        origin: CallOrigin | None = None,
        error: str | None = None,
    ) -> bool:
        """Record the model call ``lease`` paid for after the lease was lost (taken over by
        another claim), as ``lease_lost`` with its usage: nothing else of the attempt can be
        written, but what the call cost is never left out. Once per epoch and worker; returns
        whether a row was added. Never raises: the caller is already failing."""
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "revision": revision,
            "error": safe_text(redact_secrets(error))
            if error
            else "the lease was lost before the call ended",
        }
        try:
            rows = self._db.rows("record_lost_call", params)
        except Exception:  # an outage: the LeaseLostError that follows says enough
            return False
        if rows:
            self._count_cost(rows[0][1], usage, added=True)
        return bool(rows)

    def record_turn(
        self,
        lease: Lease,
        usage: ModelUsage | None,
        *,
        turn: int,
        call: CallOutcome,
        error: str,
        origin: CallOrigin | None = None,
    ) -> CallOutcome | None:
        """Record a paid call made while the attempt under ``lease`` goes on (``turn``, from 1
        within the attempt): a structured answer refused before a repair turn (``rejected``),
        or a provider call that failed before a retry (``failed``). Counted in the day's spend
        at once. Returns the outcome recorded: ``call``, or ``lease_lost`` when another claim
        took the run over (the call is recorded all the same); ``None`` when nothing was
        written (a retried statement, or an epoch that was never this worker's)."""
        if call not in ("failed", "rejected"):
            raise InvalidInputError("call", f"must be 'failed' or 'rejected', got {call!r}")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 1:
            raise InvalidInputError("turn", f"must be a whole number from 1, got {turn!r}")
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "revision": lease.revision,
            "call_outcome": call,
            "error": safe_text(redact_secrets(str(error))) or "unknown error",
            "turn": turn,
        }
        rows = self._db.rows("record_turn", params)
        if not rows:
            return None
        self._count_cost(rows[0][1], usage, added=True)
        return cast(CallOutcome, rows[0][0])

    def currency(self) -> str | None:
        """The ledger's one currency (``None`` before the first price), read once: a ledger's
        currency never changes once a price names it."""
        if self._currency is None:
            rows = self._db.rows("ledger_currency", {})
            self._currency = str(rows[0][0]) if rows else None
        return self._currency

    def _count_cost(self, money: Any, usage: ModelUsage | None, *, added: bool = False) -> None:
        """The money a recording statement returned, in the metrics (never priced here).
        ``added``: the statement added the call's row, so a call with no usage known is counted
        in doubt (the ledger's own rule, migration 0020)."""
        if usage is None or usage.unknown:
            if added:
                telemetry.count_call_in_doubt(usage.priced_model if usage else None)
            return
        if money is None:
            return
        try:
            currency = self.currency()
        except Exception:  # an outage: the metric is left out, the call is recorded
            return
        telemetry.record_cost(money, currency, usage.priced_model)

    def _fenced(self, name: str, params: dict[str, Any]) -> FenceOutcome:
        """Run fenced statement ``name``; its outcome, or :class:`LeaseLostError`."""
        rows = self._db.rows(name, params)
        outcome = FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST
        if outcome == FenceOutcome.LEASE_LOST:
            raise LeaseLostError()
        return outcome

    # -- budgets -------------------------------------------------------------------------------

    def declare_budgets(
        self,
        lease: Lease,
        budgets: Sequence[Budget],
        *,
        follow_ledger: bool = False,
        job_name: str | None = None,
    ) -> bool:
        """Declare the budgets a job's spec names (once per process and job): one the ledger
        does not hold is added, with its period's spend so far; a group budget gains the job;
        one the ledger holds at another amount raises :class:`BudgetConflictError` naming both,
        unless ``follow_ledger`` (the ledger's is enforced either way). ``job_name``: the run's
        identity job, when the caller knows it (else it is read). Returns whether the ledger
        was asked (the first declaration in this process: a budget may have been added since
        the lease's hold was made)."""
        if job_name is None:
            rows = self._db.fetch("run_job", {"run_id": lease.run_id}, dict_row)
            if not rows:
                raise RunNotFoundError(f"run {lease.run_id} is not registered")
            job_name = str(rows[0]["job_name"])
        job_name = normalize_text(job_name)
        key = (job_name, tuple(budgets), follow_ledger)
        if key in self._declared_budgets:
            return False
        params = declared_budget_params(job_name, budgets)
        conflicts = self._db.fetch("declare_budgets", params, dict_row)
        if conflicts and not follow_ledger:
            first = conflicts[0]
            raise BudgetConflictError(
                first["budget_id"], first["declared"], first["held"], first["held_by"]
            )
        self._declared_budgets.add(key)
        return True

    def reserve_budget(
        self,
        lease: Lease,
        *,
        max_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_tokens: int | None = None,
        requested_model: str | None = None,
        model_name: str | None = None,
        tier: str | None = None,
    ) -> None:
        """Admit one request of the run under every budget that covers its job, holding its
        worst case until its call is recorded: ``max_input_tokens`` at the dearest input price,
        ``max_output_tokens`` at the dearest output price, ``max_tokens`` (a ceiling of either)
        at the dearest of all. Raise :class:`BudgetExceededError` when one has no room (nothing
        is held then), :class:`LeaseLostError` when the lease is not held. With no worst case
        the request is only checked: admitted while spent and held are under each cap (see
        :mod:`.budgets`)."""
        params = {
            **fence_params(lease),
            "max_input": max_input_tokens,
            "max_output": max_output_tokens,
            "max_total": max_tokens,
            "requested": requested_model,
            "answered": model_name,
            "tier": tier,
        }
        [row] = self._db.fetch("reserve_budget", params, dict_row)
        if row["outcome"] == "admitted":
            return
        if row["outcome"] == "lease_lost":
            raise LeaseLostError()
        raise budget_refusal(row, requested_model or model_name)

    def release_budget(self, lease: Lease) -> None:
        """Give back what the attempt's unsent request holds of its budgets."""
        self._db.rows("release_budget", fence_params(lease))

    # -- provider rate limits ------------------------------------------------------------------

    def rate_limit_rows(self) -> list[dict[str, Any]]:
        """Every provider rate limit in the ledger, as rows (read through
        :func:`~idempotent_jobs.core.rate_limits.limits_of`, which caches them)."""
        return self._db.fetch("list_rate_limits", {}, dict_row)

    def declare_rate_limit(self, limit: RateLimit, declared_by: str) -> bool:
        """Record ``limit`` as the job ``declared_by`` declares it (once per process is enough;
        an operator's limit stands over it). Returns whether the row changed."""
        params = {**limit.params(), "declared_by": check_name("declared_by", declared_by)}
        changed = bool(self._db.rows("declare_rate_limit", params))
        if changed:
            forget_limits(self)
        return changed

    def acquire_rate(self, lease: Lease, request: RateRequest, tokens: int) -> RateGrant | None:
        """Reserve a place for ``request`` (``tokens`` as it reserves them) under its limit,
        for the run under ``lease`` (its subject's share); ``None`` when there is no such
        limit. See :mod:`idempotent_jobs.core.rate_limits`."""
        params = {
            "run_id": lease.run_id,
            "provider": request.provider,
            "model": request.model,
            "key_name": request.key_name,
            "tokens": tokens,
            "burst": BURST_SHARE,
            "pace": PACE_SHARE,
        }
        rows = self._db.rows("acquire_rate", params)
        return RateGrant(bool(rows[0][0]), float(rows[0][1])) if rows else None

    # -- failure drills ------------------------------------------------------------------------

    def take_drill(self, job_name: str) -> int | None:
        """Use up one drilled failure for a model call of ``job_name``: the calls the drill
        still fails after this one, or ``None`` when no drill takes it."""
        rows = self._db.rows("take_drill", {"job_name": normalize_text(job_name)})
        return int(rows[0][1]) if rows else None

    # -- reading -----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of a run, or ``None``."""
        rows = self._db.fetch("get_run", {"run_id": run_id}, record_row(RunRecord))
        return rows[0] if rows else None

    def model_calls(self, run_id: str) -> list[ModelCallRecord]:
        """Every recorded model call of the run, oldest first (see :class:`CallCosts`)."""
        return self._db.fetch("list_model_calls", {"run_id": run_id}, record_row(ModelCallRecord))


__all__ = ["RunLedger"]
