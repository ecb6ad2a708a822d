"""What model calls cost in money, and what a job spent and may spend: prices per model set by
an operator (``idempotent-jobs prices set``), spend per job and UTC day and each budget's
standing (``runs stats``, ``budgets list``, the reconciliation job), and a job's history per
accepted run (``idempotent-jobs estimate``).

Prices are kept in the ledger with their history (``price_history``): a price applies from its
``effective_from`` on, and a call is priced at the price in force when it was made, so a change
never re-prices earlier calls. Each kind of token has its own price (cache reads, cache writes
and 1-hour cache writes, reasoning; each falls back to the input or output price), and a tier
(``batch``) may have its own. A model is matched by exact name, then by the longest declared
prefix; the requested model's price first, then the answering model's. Every price is in the
ledger's one currency (``ledger_currency``, held by a foreign key). A call whose model has no
price, or that reported no usage, has no money figure: unknown, never 0.

The ledger computes the same in SQL (``price_in_force`` and ``usage_money``, migration 0018);
:func:`price_in_force` and :meth:`ModelPrice.cost` are the Python side (``runs show``, the
metrics), checked against it by a test.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.records import ModelCallRecord, ModelUsage

#: Below this per million tokens (the column's check): 10^9 per million is 1000 per token.
_MAX_PRICE = Decimal(10) ** 9
#: Decimal places a price may have per million tokens (10^-9 per token is 10^-3 per million).
_MAX_PLACES = 18
#: The tier a call without one is in.
STANDARD_TIER = "standard"
#: The part prices a price may set, and what each falls back to when it is not set.
PART_PRICES = (
    "cache_read_per_million",
    "cache_write_per_million",
    "cache_write_1h_per_million",
    "reasoning_per_million",
)


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """The price of one model's tokens (or every model's under a prefix), per million tokens of
    each kind, in force from ``effective_from`` in ``tier``."""

    model_pattern: str
    match_kind: str  # 'exact' or 'prefix'
    tier: str
    effective_from: datetime
    currency: str
    input_per_million: Decimal
    output_per_million: Decimal
    cache_read_per_million: Decimal | None = None
    cache_write_per_million: Decimal | None = None
    cache_write_1h_per_million: Decimal | None = None
    reasoning_per_million: Decimal | None = None
    set_at: datetime
    set_by: str | None = None

    @property
    def model_name(self) -> str:
        """The model (or prefix) the price is for."""
        return self.model_pattern

    def matches(self, name: str | None) -> bool:
        if name is None:
            return False
        if self.match_kind == "prefix":
            return name.startswith(self.model_pattern)
        return name == self.model_pattern

    def cost(self, usage: ModelUsage | None) -> Decimal | None:
        """What ``usage`` costs at this price, each kind of token at its own price; ``None``
        when the call reported no usage (unknown)."""
        if usage is None or usage.unknown:
            return None
        read = usage.cache_read_tokens or 0
        written = usage.cache_write_tokens or 0
        hour = usage.cache_write_1h_tokens or 0
        reasoning = usage.reasoning_tokens or 0
        cache_write = _or(self.cache_write_per_million, self.input_per_million)
        spent = (
            max((usage.input_tokens or 0) - read - written, 0) * self.input_per_million
            + read * _or(self.cache_read_per_million, self.input_per_million)
            + max(written - hour, 0) * cache_write
            + hour * _or(self.cache_write_1h_per_million, cache_write)
            + max((usage.output_tokens or 0) - reasoning, 0) * self.output_per_million
            + reasoning * _or(self.reasoning_per_million, self.output_per_million)
        )
        return spent / 1_000_000


def _or(price: Decimal | None, fallback: Decimal) -> Decimal:
    return fallback if price is None else price


def price_in_force(
    prices: Iterable[ModelPrice],
    requested: str | None,
    answered: str | None,
    tier: str | None,
    at: datetime,
) -> ModelPrice | None:
    """The price of a call of ``requested`` (else ``answered``) made at ``at`` in ``tier``: the
    tier's own over the standard one, the requested name over the answered one, an exact name
    over a prefix, a longer prefix over a shorter, the latest ``effective_from`` not after
    ``at`` (the ledger's ``price_in_force``, in Python)."""
    wanted = tier or STANDARD_TIER
    best: tuple[tuple[object, ...], ModelPrice] | None = None
    for price in prices:
        if price.effective_from > at or price.tier not in (wanted, STANDARD_TIER):
            continue
        for rank, name in enumerate((requested, answered)):
            if not price.matches(name):
                continue
            key = (
                price.tier != wanted,
                rank,
                price.match_kind != "exact",
                -len(price.model_pattern),
                -price.effective_from.timestamp(),
            )
            if best is None or key < best[0]:
                best = (key, price)
    return None if best is None else best[1]


def check_price(field: str, value: object) -> Decimal:
    """A price per million tokens: from 0 to below 10^9, with at most 18 decimal places (a
    per-token price of 10^-9 is 0.001 per million, kept exactly)."""
    if isinstance(value, bool) or value is None:
        raise InvalidInputError(field, f"must be a number, got {value!r}")
    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidInputError(field, f"must be a number, got {value!r}") from None
    if not price.is_finite() or not 0 <= price < _MAX_PRICE:
        raise InvalidInputError(field, f"must be from 0 to below 1,000,000,000, got {value!r}")
    exponent = price.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > _MAX_PLACES:
        raise InvalidInputError(
            field, f"has more than {_MAX_PLACES} decimal places per million tokens: {value!r}"
        )
    return price.normalize() if price else Decimal(0)


def check_currency(value: str) -> str:
    code = value.strip().upper()
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InvalidInputError("currency", f"must be a 3-letter code such as USD, got {value!r}")
    return code


def call_cost(call: ModelCallRecord, prices: Iterable[ModelPrice]) -> Decimal | None:
    """What ``call`` cost at the price in force when it was made; ``None`` when that is
    unknown (no price for its model, or no usage reported)."""
    price = price_in_force(prices, call.requested_model, call.model_name, call.tier, call.called_at)
    return None if price is None else price.cost(call.usage)


@dataclass(frozen=True, kw_only=True)
class JobSpend:
    """What one job's model calls spent in one UTC day.

    ``cost`` is ``None`` when no call was priced; ``priced`` is false when some were not.
    ``top_subject_tokens`` is the most any one subject spent; ``unknown_calls`` the calls that
    reported no usage. The budgets in force are :class:`~.budgets.BudgetStanding` s.
    """

    job_name: str
    day_start: datetime
    calls: int
    tokens: int
    wasted_tokens: int
    cost: Decimal | None
    priced: bool
    top_subject_tokens: int
    unknown_calls: int = 0


@dataclass(frozen=True, kw_only=True)
class JobHistory:
    """What a job's runs cost so far: per accepted run (the latest ``sampled_runs`` of
    ``accepted_runs``) the p10, median and p90 tokens and money, the tokens and money per byte
    of checkpointed input, and the calls not accepted."""

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
    p10_tokens: float | None = None
    p10_cost: float | None = None
    tokens_per_input_byte: float | None = None
    cost_per_input_byte: float | None = None
    #: The accepted runs' money at the batch tier's prices in force now (the batch lane's).
    batch_p10_cost: float | None = None
    batch_median_cost: float | None = None
    batch_p90_cost: float | None = None
    batch_priced: bool = False
