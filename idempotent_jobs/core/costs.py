"""What model calls cost in money, and what a job spent and may spend: prices per model set by
an operator (``idempotent-jobs prices set``), spend per job and UTC day against the budget its
workers declared (``runs stats``, the reconciliation job), and a job's history per accepted run
(``idempotent-jobs estimate``).

Prices are kept in the ledger (``model_prices``), so every command and worker sees the same ones;
a call's money is its input tokens times the input price plus its output tokens times the output
price, per million, at the price set now. A call whose model has no price has no money figure,
and a sum over it says so (``priced`` is false).
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.records import ModelCallRecord

_MAX_PRICE = Decimal("100000000")  # numeric(14, 6): below 10^8 per million tokens


def money(
    input_tokens: int | None,
    output_tokens: int | None,
    input_per_million: Decimal,
    output_per_million: Decimal,
) -> Decimal:
    """What ``input_tokens`` and ``output_tokens`` cost at these prices per million tokens: the
    one place money is computed in Python (``runs show``, the metrics; the spend statements
    compute the same sum in SQL)."""
    spent = (input_tokens or 0) * input_per_million + (output_tokens or 0) * output_per_million
    return spent / 1_000_000


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """The price of one model's tokens, per million input and per million output tokens."""

    model_name: str
    input_per_million: Decimal
    output_per_million: Decimal
    currency: str
    set_at: datetime
    set_by: str | None

    def cost(self, input_tokens: int | None, output_tokens: int | None) -> Decimal:
        """The money ``input_tokens`` and ``output_tokens`` of this model cost."""
        return money(input_tokens, output_tokens, self.input_per_million, self.output_per_million)


def check_price(field: str, value: object) -> Decimal:
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise InvalidInputError(field, f"must be a number, got {value!r}") from None
    if price.is_finite() and price.adjusted() < 20:
        # As the column stores it (numeric(14, 6)): 99999999.9999999 rounds up to 10^8.
        price = price.quantize(Decimal("0.000001"))
    if not price.is_finite() or not 0 <= price < _MAX_PRICE:
        raise InvalidInputError(
            field, f"must be from 0 to below {_MAX_PRICE:,} (6 decimals), got {value!r}"
        )
    return price


def check_currency(value: str) -> str:
    code = value.strip().upper()
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InvalidInputError("currency", f"must be a 3-letter code such as USD, got {value!r}")
    return code


def call_cost(call: ModelCallRecord, known: dict[str, ModelPrice]) -> Decimal | None:
    """What ``call`` cost in money, or ``None`` when its model has no price."""
    price = known.get(call.priced_model or "") or known.get(call.model_name or "")
    if price is None:
        return None if call.priced_model else Decimal(0)
    return price.cost(call.input_tokens, call.output_tokens)


@dataclass(frozen=True, kw_only=True)
class JobSpend:
    """What one job's model calls spent in one UTC day, against its declared budget.

    ``cost`` is ``None`` when no call was priced; ``priced`` is false when some were not.
    ``top_subject_tokens`` is the most any one subject spent (the per-subject limit's measure).
    """

    job_name: str
    day_start: datetime
    calls: int
    tokens: int
    wasted_tokens: int
    cost: Decimal | None
    priced: bool
    top_subject_tokens: int
    tokens_per_day: int | None
    tokens_per_subject_per_day: int | None

    @property
    def tokens_left(self) -> int | None:
        """Tokens left in the day's budget (0 once spent), or ``None`` without one."""
        if self.tokens_per_day is None:
            return None
        return max(self.tokens_per_day - self.tokens, 0)


@dataclass(frozen=True, kw_only=True)
class JobHistory:
    """What a job's runs cost so far: per accepted run (the latest ``sampled_runs`` of
    ``accepted_runs``) the median and p90 tokens and money, and the calls not accepted."""

    accepted_runs: int
    sampled_runs: int
    median_tokens: float | None
    p90_tokens: float | None
    median_cost: float | None
    p90_cost: float | None
    priced: bool
    failed_calls: int
    failed_tokens: int
    failed_cost: Decimal | None
