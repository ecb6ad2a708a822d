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

**Money is decided once, in the database, when a call is admitted** (migration 0020): the
statement that admits a request (the one that takes its budget hold) fixes the price row in
force then, and the call is recorded with that row (``model_calls.price_id``) and its money
(``model_calls.money``); a call no budget admitted is priced as it is recorded. A price set
later never touches an in-flight or recorded call, and every report (``runs show``, ``runs
spend``, ``runs stats``, ``budgets list``, ``estimate``, the metrics) reads that one figure.
Python never prices a call. What a failed request costs follows what providers bill: an error
the provider answered costs nothing (``unbilled``), a call whose outcome is unknown is
``in_doubt`` until an operator settles it (``idempotent-jobs costs settle``).
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from idempotent_jobs.core.errors import InvalidInputError

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
    #: The row's id: what a call priced by it names (``model_calls.price_id``).
    price_id: int | None = None
    #: Set with a ``--from`` in the past, before any call of its model was priced since.
    correction: bool = False

    @property
    def model_name(self) -> str:
        """The model (or prefix) the price is for."""
        return self.model_pattern


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


#: The earliest and latest a price may apply from (an earlier release's prices, whose history
#: is unknown, apply from 1900-01-01: ``always``).
EARLIEST_PRICE = datetime(1900, 1, 2, tzinfo=UTC)
LATEST_PRICE = datetime(9999, 1, 1, tzinfo=UTC)


def check_effective_from(value: datetime | None) -> datetime | None:
    """When a price applies from: ``None`` (now), or a time with its zone from 1900-01-02 to
    9999-01-01 (UTC)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError("from", f"must be a date and time, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError("from", f"must say its time zone, got {value.isoformat()}")
    try:
        at = value.astimezone(UTC)
    except (OverflowError, ValueError):
        at = None
    if at is None or not EARLIEST_PRICE <= at < LATEST_PRICE:
        raise InvalidInputError(
            "from", f"must be from 1900-01-02 to 9999-01-01 UTC, got {value.isoformat()}"
        )
    return at


def check_currency(value: str) -> str:
    code = value.strip().upper()
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InvalidInputError("currency", f"must be a 3-letter code such as USD, got {value!r}")
    return code


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
