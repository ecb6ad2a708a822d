"""A shadow's online lane: each item's answer asked of the new version's model step in turn,
at the standard price. Each request the step sends is admitted under the shadow's budget and
the job's (:class:`ShadowBook`, the step's current :class:`~idempotent_jobs.core.calls.CallBook`)
and each paid request recorded once as the job's call (outcome ``shadow``): a repair turn as it
is made, the final one with the answer. A process killed between a request and its record
loses that record, as an online run's would: the batch lane is the default for that reason."""

from dataclasses import dataclass
from typing import Any

from idempotent_jobs.core.calls import CallBook, keeping
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import LeaseLostError, LedgerConnectionError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.rate_limits import RateRequest
from idempotent_jobs.core.records import CallOutcome, ModelUsage, ShadowLease
from idempotent_jobs.shadows.job import ShadowSteps


@dataclass
class ShadowBook(CallBook):
    """The book of one shadow item's model call: each request admitted under the shadow's
    lease and budgets, each repair turn recorded as the shadow's call."""

    shadow: ShadowLease | None = None
    run_id: str = ""
    shadows: RunLedger | None = None

    def before_request(self, rate: RateRequest | None = None) -> None:
        self.requests += 1
        if self.shadows is None or self.shadow is None:
            return
        try:
            self.shadows.admit_shadow_item(
                self.shadow,
                self.run_id,
                max_input_tokens=rate.max_input_tokens if rate is not None else None,
                max_output_tokens=rate.max_output_tokens if rate is not None else None,
                requested_model=rate.model if rate is not None else None,
                tier="standard",
            )
        except BaseException:
            self.refused = True
            raise

    def paid(
        self, usage: ModelUsage | None, call: CallOutcome, error: BaseException | str
    ) -> CallOutcome | None:
        text = error if isinstance(error, str) else describe_error(error)
        self.turns.append(call)
        if self.shadows is not None and self.shadow is not None:
            self.shadows.record_shadow_call(
                self.shadow, self.run_id, usage, error=text, final=False
            )
        return call


def compute_online(
    ledger: RunLedger, steps: ShadowSteps, lease: ShadowLease, row: dict[str, Any]
) -> None:
    """Ask each pending item's answer of the model step and record it (see the module)."""
    from idempotent_jobs.shadows.lane import RENEW_EVERY_ITEMS, identity_of, record_answer

    if steps.online is None:
        raise LookupError("the online lane needs the new version's model step")
    online = steps.online
    for n, item in enumerate(ledger.shadow_items(lease.shadow_id, pending_only=True), 1):
        if n % RENEW_EVERY_ITEMS == 0:
            ledger.renew_shadow(lease)
        identity = identity_of(item, steps.job_name, str(row["baseline_version"]))
        book = ShadowBook(shadow=lease, run_id=item["run_id"], shadows=ledger)
        raw = dict(item["raw_input"] or {})

        def produce(
            raw: dict[str, Any] = raw, book: ShadowBook = book, identity: Any = identity
        ) -> Any:
            with keeping(book):
                return online(raw, identity)

        try:
            answer: Any = produce()
        except (LeaseLostError, LedgerConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - this item's failure; the shadow goes on
            if book.refused or book.requests == 0:  # refused before any request: no call
                ledger.end_shadow_item(
                    lease, item["run_id"], "failed", f"not sent: {describe_error(exc)}"
                )
                continue
            answer = exc
        record_answer(ledger, steps, lease, item["run_id"], _given(answer))


def _given(answer: Any) -> Any:
    """A ``produce`` that gives ``answer``, or raises it when it is the call's error."""

    def produce() -> Any:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return produce
