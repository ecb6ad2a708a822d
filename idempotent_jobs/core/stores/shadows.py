"""The shadows store: a new version's answers computed on stored runs' inputs, their paid calls,
their verdicts and their promotion (``sql/shadows.sql``). See :mod:`idempotent_jobs.shadows`
for what a shadow does; this store only says what the ledger keeps of it."""

import secrets
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from psycopg.rows import dict_row

from idempotent_jobs.core.budgets import budget_refusal
from idempotent_jobs.core.checks import check_worker_id, optional_name, usage_params
from idempotent_jobs.core.errors import InvalidInputError, LeaseLostError
from idempotent_jobs.core.json_values import dump_json_object
from idempotent_jobs.core.records import ModelUsage, ShadowLease
from idempotent_jobs.core.stores.base import Store

#: The states a shadow is in, in order.
SHADOW_STATES = (
    "started",
    "submitted",
    "collected",
    "compared",
    "promoting",
    "promoted",
    "dropped",
)
#: The verdicts of a shadow's item.
VERDICTS = ("agree", "differ", "new", "invalid", "failed", "missing")


def new_shadow_id() -> str:
    return f"sh-{secrets.token_hex(6)}"


class ShadowsStore(Store):
    """Shadows and their items."""

    # -- the operator's ------------------------------------------------------------------------

    def baseline_version(self, job_name: str, version: str) -> str | None:
        """The version of the job's most recently completed run other than ``version``."""
        rows = self._db.rows("baseline_version", {"job_name": job_name, "version": version})
        return str(rows[0][0]) if rows else None

    def create_shadow(
        self,
        *,
        job_name: str,
        baseline_version: str,
        version: str,
        lane: str,
        selection: dict[str, Any],
        budget: Decimal | None = None,
        provider: str | None = None,
        model: str | None = None,
        config_parts: dict[str, str] | None = None,
        requested_by: str | None = None,
        window_from: datetime | None = None,
        window_to: datetime | None = None,
        subjects: Sequence[str] | None = None,
        sample: int | None = None,
        quarantined: bool = False,
    ) -> tuple[str, int]:
        """A new shadow of ``job_name`` at ``version`` on its completed runs at
        ``baseline_version`` (windows from ``window_from`` to ``window_to``, excluded, among
        ``subjects``; with ``quarantined``, only runs with an answer that failed validation;
        ``sample`` of them); returns its id and how many runs it holds."""
        if lane not in ("batch", "online"):
            raise InvalidInputError("lane", f"must be batch or online, got {lane!r}")
        if sample is not None and (isinstance(sample, bool) or not 0 < sample <= 10**7):
            raise InvalidInputError("sample", f"must be a whole number from 1, got {sample!r}")
        if budget is not None and not Decimal(0) < budget <= Decimal(10**18):
            raise InvalidInputError("budget", f"must be a positive amount, got {budget}")
        if window_from and window_to and window_to <= window_from:
            raise InvalidInputError("to", "must come after --from")
        shadow_id = new_shadow_id()
        params = {
            "shadow_id": shadow_id,
            "job_name": job_name,
            "baseline_version": baseline_version,
            "version": version,
            "lane": lane,
            "budget": budget,
            "selection": dump_json_object(selection, "selection"),
            "provider": provider,
            "model": model,
            "config_parts": dump_json_object(config_parts or {}, "config"),
            "requested_by": optional_name("requested_by", requested_by),
            "from": window_from,
            "to": window_to,
            "subjects": list(subjects) if subjects else None,
            "sample": sample,
            "quarantined": quarantined,
        }
        [(count,)] = self._db.rows("create_shadow", params)
        return shadow_id, int(count)

    def quarantine(
        self, *, job_name: str | None = None, shadow_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The answers that failed validation, online or in a shadow, newest first: the run,
        its input, the failure and what the call cost."""
        params = {"job_name": job_name, "shadow_id": shadow_id, "limit": limit}
        return self._db.fetch("quarantine", params, dict_row)

    def shadows(self, job_name: str | None = None) -> list[dict[str, Any]]:
        """The shadows of ``job_name`` (every job's when ``None``), newest first."""
        return self._db.fetch("list_shadows", {"job_name": job_name}, dict_row)

    # -- reads both faces make -----------------------------------------------------------------

    def shadow(self, shadow_id: str) -> dict[str, Any] | None:
        """The shadow's row, with its items counted by state, and its calls' money."""
        rows = self._db.fetch("get_shadow", {"shadow_id": shadow_id}, dict_row)
        return rows[0] if rows else None

    def shadow_items(self, shadow_id: str, *, pending_only: bool = False) -> list[dict[str, Any]]:
        """The shadow's items with their runs (identity, status, accepted output, its cost)."""
        params = {"shadow_id": shadow_id, "pending_only": pending_only}
        return self._db.fetch("shadow_items", params, dict_row)

    def shadow_gate(self, job_name: str, version: str) -> list[dict[str, Any]]:
        """The shadows of ``job_name`` at ``version`` not dropped (a promoted one first)."""
        params = {"job_name": job_name, "version": version}
        return self._db.fetch("shadow_gate", params, dict_row)

    # -- the shadow's own process --------------------------------------------------------------

    def claim_shadow(
        self, shadow_id: str, worker_id: str, lease_seconds: float = 600.0
    ) -> tuple[ShadowLease, dict[str, Any]]:
        """Take the shadow's lease (free, expired or this worker's); :class:`LeaseLostError`
        while another process holds it, or once it is promoted or dropped."""
        params = {
            "shadow_id": shadow_id,
            "worker_id": check_worker_id(worker_id),
            "lease_seconds": float(lease_seconds),
        }
        rows = self._db.fetch("claim_shadow", params, dict_row)
        if not rows:
            raise LeaseLostError(f"shadow {shadow_id} is held by another process, or has ended")
        row = rows[0]
        return ShadowLease(shadow_id, worker_id, int(row["lease_epoch"]), lease_seconds), row

    def renew_shadow(self, lease: ShadowLease) -> str:
        rows = self._db.rows(
            "renew_shadow", {**lease.params(), "lease_seconds": lease.lease_seconds}
        )
        if not rows:
            raise LeaseLostError(f"shadow {lease.shadow_id}: its lease was taken over")
        return str(rows[0][0])

    def release_shadow(self, lease: ShadowLease) -> None:
        self._db.rows("release_shadow", lease.params())

    def shadow_to(
        self,
        lease: ShadowLease,
        state: str,
        from_states: Sequence[str],
        *,
        summary: dict[str, Any] | None = None,
        error: str | None = None,
        provider_batch_id: str | None = None,
        duplicates: int = 0,
        revise: bool = False,
        channels: Sequence[str] | None = None,
    ) -> str:
        """Move the shadow to ``state`` when it is in one of ``from_states``; returns the state
        it is in now. :class:`LeaseLostError` when its lease was taken over."""
        params = {
            **lease.params(),
            "state": state,
            "from_states": list(from_states),
            "summary": dump_json_object(summary, "summary") if summary is not None else None,
            "error": error[:2000] if error else None,
            "provider_batch_id": provider_batch_id,
            "duplicates": duplicates,
            "revise": revise,
            "channels": list(channels) if channels is not None else None,
        }
        rows = self._db.rows("shadow_to", params)
        if not rows:
            raise LeaseLostError(f"shadow {lease.shadow_id}: its lease was taken over")
        return str(rows[0][0])

    def shadow_start_submit(self, lease: ShadowLease) -> datetime | None:
        """Mark, and commit, that the batch create is about to be sent; returns an earlier
        mark (a create that may have reached the provider), ``None`` on the first.
        :class:`LeaseLostError` when the lease was lost or the shadow was submitted."""
        rows = self._db.rows("shadow_start_submit", lease.params())
        if not rows:
            raise LeaseLostError(f"shadow {lease.shadow_id}: not an unsent shadow under its lease")
        earlier: datetime | None = rows[0][0]
        return earlier

    def admit_shadow_item(
        self,
        lease: ShadowLease,
        run_id: str,
        *,
        max_input_tokens: int | None,
        max_output_tokens: int | None,
        requested_model: str | None,
        tier: str,
    ) -> None:
        """Admit the item's request under the shadow's budget and every budget of the job,
        holding its worst case until its call is recorded; :class:`BudgetExceededError` when
        one has no room (nothing held then), :class:`LeaseLostError` when the lease is lost."""
        params = {
            **lease.params(),
            "run_id": run_id,
            "max_input": max_input_tokens,
            "max_output": max_output_tokens,
            "requested": requested_model,
            "tier": tier,
        }
        [row] = self._db.fetch("admit_shadow_item", params, dict_row)
        if row["outcome"] == "admitted":
            return
        if row["outcome"] == "lease_lost":
            raise LeaseLostError(f"shadow {lease.shadow_id}: its lease was taken over")
        raise budget_refusal({**row, "subject_id": row["subject"]}, requested_model)

    def record_shadow_call(
        self,
        lease: ShadowLease,
        run_id: str,
        usage: ModelUsage | None,
        *,
        state: str = "answered",
        answer: dict[str, Any] | None = None,
        valid: bool | None = None,
        error: str | None = None,
        final: bool = True,
    ) -> tuple[str, Decimal | None]:
        """Record the item's paid call (``usage``) and, when ``final``, its answer or error,
        once; returns (``applied``, ``already_done`` or ``lease_lost``; the call's money)."""
        params = {
            **lease.params(),
            **usage_params(usage),
            "run_id": run_id,
            "state": state,
            "answer": dump_json_object(answer, "answer") if answer is not None else None,
            "valid": valid,
            "error": error[:2000] if error else None,
            "final": final,
        }
        [(outcome, money, _)] = self._db.rows("record_shadow_call", params)
        if outcome == "lease_lost":
            raise LeaseLostError(f"shadow {lease.shadow_id}: its lease was taken over")
        return str(outcome), money

    def end_shadow_item(self, lease: ShadowLease, run_id: str, state: str, error: str) -> None:
        """End a pending item with no paid call (``missing``, or ``failed`` before any
        request), giving back what it held."""
        params = {**lease.params(), "run_id": run_id, "state": state, "error": error[:2000]}
        self._db.rows("end_shadow_item", params)

    def judge_shadow_item(
        self,
        lease: ShadowLease,
        run_id: str,
        verdict: str,
        score: float | None,
        detail: dict[str, Any] | None,
    ) -> bool:
        """Record the item's verdict once; whether it was recorded now."""
        if verdict not in VERDICTS:
            raise InvalidInputError("verdict", f"must be one of {', '.join(VERDICTS)}")
        params = {
            **lease.params(),
            "run_id": run_id,
            "verdict": verdict,
            "score": score,
            "detail": dump_json_object(detail, "detail") if detail is not None else None,
        }
        return bool(self._db.rows("judge_shadow_item", params))

    def mark_item_promoted(self, lease: ShadowLease, run_id: str, revision: int) -> None:
        params = {**lease.params(), "run_id": run_id, "revision": revision}
        if not self._db.rows("mark_item_promoted", params):
            raise LeaseLostError(f"shadow {lease.shadow_id}: its lease was taken over")
