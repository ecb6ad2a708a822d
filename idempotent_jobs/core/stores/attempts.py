"""The attempts store: how an attempt ends, the fenced commit of an answer, a failure, the end of an
attempt a Dagster run holds (``sql/attempts.sql``); and the operator's read of attempts."""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.checks import (
    JsonPayload,
    check_name,
    fence_params,
    notifications_json,
    origin_params,
    stale_error,
    usage_params,
)
from idempotent_jobs.core.error_text import redact_secrets, safe_text
from idempotent_jobs.core.errors import (
    InvalidInputError,
    LeaseLostError,
)
from idempotent_jobs.core.json_values import dump_json_object
from idempotent_jobs.core.records import (
    AttemptRecord,
    Basis,
    CallOrigin,
    CallOutcome,
    Completion,
    FailedOutcome,
    FenceOutcome,
    JobConfig,
    Lease,
    ModelUsage,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store
from idempotent_jobs.core.stores.calls import CallsStore

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class AttemptsStore(Store):
    """The end of an attempt (the worker face) and the attempts of a run (the operator face)."""

    def __init__(self, db: "Executor", settings: LedgerSettings, *, calls: CallsStore) -> None:
        super().__init__(db, settings)
        self._calls = calls

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
        carried_input: JsonPayload | None = None,
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

        ``carried_input``: the checkpoint ``output`` was computed on, not yet stored (it
        travelled with the model call, :func:`~idempotent_jobs.core.steps.collect_to_carry`):
        stored by this statement if the run has none yet, whether the answer is accepted or
        stale. ``basis`` then names its fingerprint.
        """
        basis = basis or lease.basis
        if carried_input is not None and carried_input.fingerprint != basis.input_fingerprint:
            raise InvalidInputError(
                "carried_input", "is not the checkpoint the answer's basis names"
            )
        config = config or JobConfig()
        parts = dict(config.parts)
        params = {
            **fence_params(lease),
            **usage_params(usage),
            **origin_params(origin),
            "output": self._calls.serialised(output, payload),
            "messages": notifications_json(notifications),
            "revision": basis.revision,
            "basis_fp": basis.input_fingerprint,
            # What a stale attempt's error says the answer was computed on.
            "computed_on": f"stale candidate: computed on revision {basis.revision}, "
            f"checkpoint {(basis.input_fingerprint or 'none')[:12]}; the run is at revision ",
            "config_fp": config.fingerprint if parts else None,
            "config_parts": dump_json_object(parts, "config") if parts else None,
            "carried": None if carried_input is None else carried_input.text,
            "carried_fp": None if carried_input is None else carried_input.fingerprint,
        }
        [(outcome, stored, revision, fingerprint, mine, stored_parts, money)] = self._db.rows(
            "complete", params
        ) or [("lease_lost", None, None, None, False, None, None)]
        self._calls.count_cost(money, usage)
        if outcome == FenceOutcome.APPLIED:
            return Completion(output=stored, accepted=True, config_parts=parts or None)
        if outcome == FenceOutcome.STALE:
            raise stale_error(
                lease.run_id, basis, Basis(revision=revision, input_fingerprint=fingerprint)
            )
        if outcome == FenceOutcome.ALREADY_DONE and stored is not None:
            if not mine:  # another attempt completed the run: this call is still paid for
                self._calls.record_lost_call(lease, usage, basis.revision, origin=origin)
            return Completion(output=stored, accepted=bool(mine), config_parts=stored_parts)
        self._calls.record_lost_call(lease, usage, basis.revision, origin=origin)
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
            self._calls.count_cost(rows[0][1], usage, added=rows[0][2])
            return outcome
        if call is not None:
            self._calls.record_lost_call(lease, usage, lease.revision, origin=origin, error=error)
        raise LeaseLostError()

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

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every successful claim of the run, oldest first."""
        return self._db.fetch("list_attempts", {"run_id": run_id}, record_row(AttemptRecord))
