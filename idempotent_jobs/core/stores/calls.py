"""The calls store: paid model calls, recorded once, with their answer, a lost lease's, a turn's
(``sql/calls.sql``); and what they cost, for the operator: spend by job and kind, calls in doubt
and their settlement, a job's history."""

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from psycopg.rows import dict_row

from idempotent_jobs.core.checks import (
    JsonPayload,
    fence_params,
    origin_params,
    usage_params,
)
from idempotent_jobs.core.costs import (
    JobHistory,
    JobSpend,
)
from idempotent_jobs.core.error_text import redact_secrets, safe_text
from idempotent_jobs.core.errors import (
    InvalidInputError,
    LeaseLostError,
)
from idempotent_jobs.core.json_values import dump_json_object
from idempotent_jobs.core.observers import watch
from idempotent_jobs.core.records import (
    Basis,
    CallOrigin,
    CallOutcome,
    JobConfig,
    Lease,
    ModelCallRecord,
    ModelUsage,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store
from idempotent_jobs.core.stores.prices import PricesStore
from idempotent_jobs.core.stores.runs import RunsStore

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor

from idempotent_jobs.core.budgets import budget_refusal
from idempotent_jobs.core.rate_limits import BURST_SHARE, PACE_SHARE, RateGrant, RateRequest


class CallsStore(Store):
    """Paid calls and their money."""

    def __init__(
        self, db: "Executor", settings: LedgerSettings, *, runs: RunsStore, prices: PricesStore
    ) -> None:
        super().__init__(db, settings)
        self._runs = runs
        self._prices = prices

    def output_payload(self, output: object) -> JsonPayload:
        """``output`` checked and serialised once, as :meth:`record_answer` and
        :meth:`complete` store it; :class:`InvalidInputError` naming ``output`` if they could
        not (not a JSON object, NaN, NUL, too deep, over ``max_output_bytes``). Nothing is
        written: a caller checks an answer before it decides the call's outcome."""
        return JsonPayload.of(output, "output", self.settings.max_output_bytes)

    def serialised(self, output: dict[str, Any], payload: JsonPayload | None) -> str:
        """``output``'s JSON text: ``payload``'s (:meth:`output_payload` made it when the answer
        was checked), so an answer is serialised once, or made now."""
        if payload is not None and payload.value is output:
            return payload.text
        return self.output_payload(output).text

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
            "answer": self.serialised(output, payload),
            "config_parts": dump_json_object(parts, "config") if parts else None,
        }
        rows = self._db.rows("record_answer", params)
        if rows:
            money = rows[0][1]  # NULL: no price, or no usage known
            self.count_cost(money, usage, added=True)
            if money is None:
                return None
            try:
                currency = self._prices.currency()
            except Exception:  # an outage after the call was recorded: the figure alone
                currency = None
            return f"{Decimal(money).normalize():f} {currency or ''}".rstrip()
        try:  # no row: recorded already (a retried statement), or the lease was lost
            self._runs.renew(lease)
        except LeaseLostError:
            self.record_lost_call(lease, usage, basis.revision, origin=origin)
            raise
        return None

    def admit_request(
        self,
        lease: Lease,
        *,
        renew: bool = False,
        hold: bool = False,
        max_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_tokens: int | None = None,
        requested_model: str | None = None,
        place: RateRequest | None = None,
        place_tokens: int = 0,
    ) -> RateGrant | None:
        """Admit one request of a model call in one statement: ``renew`` the lease (else only
        check it is held), ``hold`` the request's worst case under every budget covering its
        job (as :meth:`reserve_budget`), and take its ``place`` under that provider's rate limit
        (``place_tokens`` as the limit counts them). Each part runs only once the one before
        admitted the request. Raises :class:`LeaseLostError`, or the budget's
        :class:`BudgetExceededError` (no place is taken then); returns the place's grant
        (``None``: no place asked, or no such limit)."""
        params = self._runs.lease_write(
            {
                **fence_params(lease),
                "renew": renew,
                "lease_seconds": lease.lease_seconds,
                "hold": hold,
                "max_input": max_input_tokens,
                "max_output": max_output_tokens,
                "max_total": max_tokens,
                "requested": requested_model,
                "provider": None if place is None else place.provider,
                "model": None if place is None else place.model,
                "key_name": None if place is None else place.key_name,
                "tokens": place_tokens,
                "burst": BURST_SHARE,
                "pace": PACE_SHARE,
            }
        )
        rows = self._db.fetch("admit_request", params, dict_row)
        if not rows:
            raise LeaseLostError()
        [row] = rows
        if row["outcome"] not in (None, "admitted"):  # None: no hold asked
            if row["outcome"] == "lease_lost":
                raise LeaseLostError()
            raise budget_refusal(row, requested_model)
        if row["granted"] is None:
            return None
        return RateGrant(bool(row["granted"]), float(row["wait_seconds"]))

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
            self.count_cost(rows[0][1], usage, added=True)
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
        self.count_cost(rows[0][1], usage, added=True)
        return cast(CallOutcome, rows[0][0])

    def count_cost(self, money: Any, usage: ModelUsage | None, *, added: bool = False) -> None:
        """The money a recording statement returned, told to the engine's observers (never priced
        here).
        ``added``: the statement added the call's row, so a call with no usage known is counted
        in doubt (the ledger's own rule, migration 0020)."""
        if usage is None or usage.unknown:
            if added:
                watch.in_doubt(usage)
            return
        if money is None:
            return
        try:
            currency = self._prices.currency()
        except Exception:  # an outage: the observers are not told, the call is recorded
            return
        if currency is not None:
            watch.priced(Decimal(money), currency, usage)

    def model_calls(self, run_id: str) -> list[ModelCallRecord]:
        """Every recorded model call of the run, oldest first (see :class:`CallCosts`)."""
        return self._db.fetch("list_model_calls", {"run_id": run_id}, record_row(ModelCallRecord))

    def call_costs(self, run_id: str) -> dict[int, Decimal | None]:
        """What each of a run's calls cost, by call id, at the price in force when it was made
        (``None``: unknown)."""
        rows = self._db.rows("call_costs", {"run_id": run_id})
        return {int(call_id): cost for call_id, cost in rows}

    def spend_by_job(self, day: datetime | None = None) -> list[JobSpend]:
        """Each job's spend in the UTC day holding ``day`` (today, by the database clock)."""
        return self._db.fetch("spend_by_job", {"day": day}, record_row(JobSpend))

    def spend_by_kind(
        self, start: datetime, end: datetime, job_name: str | None = None
    ) -> list[dict[str, Any]]:
        """What each job's calls from ``start`` to ``end`` spent, by model, price in force and
        kind of token (input, cache read, cache write, cache write 1h, output, reasoning)."""
        params = {"start": start, "end": end, "job_name": job_name}
        return self._db.fetch("spend_by_kind", params, dict_row)

    def spend_totals(
        self, start: datetime, end: datetime, job_name: str | None = None
    ) -> dict[str, Any]:
        """What the calls from ``start`` to ``end`` cost in all (the money each was recorded
        with), whether every call not in doubt was priced, and the calls in doubt and not
        billed, counted apart."""
        params = {"start": start, "end": end, "job_name": job_name}
        [row] = self._db.fetch("spend_totals", params, dict_row)
        return row

    def calls_in_doubt(self, job_name: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The calls whose outcome is in doubt (a timeout after the request was sent, a cut
        connection: no usage known), oldest first, with what each holds of each budget."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInputError("limit", f"must be 1 to 10,000, got {limit!r}")
        return self._db.fetch("calls_in_doubt", {"job_name": job_name, "limit": limit}, dict_row)

    def settle_call(
        self,
        call_id: int,
        *,
        input_tokens: int,
        output_tokens: int,
        settled_by: str | None = None,
    ) -> dict[str, Any]:
        """Settle a call in doubt with the provider's figure: the tokens it billed (0 and 0:
        not billed), priced at the price row its request was admitted at. What it held of each
        budget in doubt becomes spend. Refused (:class:`InvalidInputError`) for a call that
        is not in doubt or does not exist: a settled figure is never changed again."""
        for name, value in (("call_id", call_id), ("input_tokens", input_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(name, f"must be a whole number from 0, got {value!r}")
        if isinstance(output_tokens, bool) or not isinstance(output_tokens, int):
            raise InvalidInputError(
                "output_tokens", f"must be a whole number, got {output_tokens!r}"
            )
        if output_tokens < 0 or max(input_tokens, output_tokens) > 10**12:
            raise InvalidInputError(
                "output_tokens" if output_tokens < 0 else "input_tokens",
                "must be from 0 to 10^12 tokens",
            )
        params = {
            "call_id": call_id,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "settled_by": settled_by,
        }
        [row] = self._db.fetch("settle_doubt", params, dict_row)
        if row["outcome"] == "missing":
            raise InvalidInputError("call_id", f"no model call {call_id}")
        if row["outcome"] == "not_in_doubt":
            raise InvalidInputError(
                "call_id",
                f"call {call_id} is not in doubt (it is {row['billing']}): nothing to settle",
            )
        return {"call_id": call_id, **row}

    def job_history(self, job_name: str, *, sample: int = 1000) -> JobHistory:
        """:class:`JobHistory` of identity job ``job_name``."""
        params = {"job_name": job_name, "sample": sample}
        [row] = self._db.fetch("job_history", params, dict_row)
        return JobHistory(**row)
