"""The prices store: the price history an operator appends to, and the ledger's one currency
(``sql/prices.sql``)."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from idempotent_jobs.core.costs import (
    STANDARD_TIER,
    ModelPrice,
    check_currency,
    check_effective_from,
    check_price,
)
from idempotent_jobs.core.errors import (
    InvalidInputError,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class PricesStore(Store):
    """Prices (the operator face sets them) and the currency (both faces read it)."""

    def __init__(self, db: "Executor", settings: LedgerSettings) -> None:
        super().__init__(db, settings)
        self._currency: str | None = None  # never changes once a price names it

    def currency(self) -> str | None:
        """The ledger's one currency (``None`` before the first price), read once: a ledger's
        currency never changes once a price names it."""
        if self._currency is None:
            rows = self._db.rows("ledger_currency", {})
            self._currency = str(rows[0][0]) if rows else None
        return self._currency

    def current_currency(self) -> str | None:
        """The ledger's currency (``None`` before the first price is set)."""
        rows = self._db.rows("ledger_currency", {})
        return str(rows[0][0]) if rows else None

    def set_price(
        self,
        model_name: str,
        input_per_million: object,
        output_per_million: object,
        *,
        currency: str = "USD",
        cache_read_per_million: object = None,
        cache_write_per_million: object = None,
        cache_write_1h_per_million: object = None,
        reasoning_per_million: object = None,
        tier: str = STANDARD_TIER,
        prefix: bool = False,
        effective_from: datetime | None = None,
        set_by: str | None = None,
    ) -> ModelPrice:
        """Set ``model_name``'s price per million tokens of each kind (the parts left ``None``
        fall back to the input or output price), in force from ``effective_from`` (now) on:
        earlier calls keep the price they were made under. ``prefix``: for every model whose
        name starts with ``model_name`` (an exact name's price wins over it). ``tier``: a
        service tier's own price (``batch``). Every price is in the ledger's one currency: the
        first sets it, and another is refused (by the database, whatever races it)."""
        name = model_name.strip()
        if not name or len(name) > 200 or not name.isprintable():
            raise InvalidInputError("model", f"must be a printable model name, got {model_name!r}")
        tier_name = tier.strip()
        if not tier_name or len(tier_name) > 40 or not tier_name.isprintable():
            raise InvalidInputError("tier", f"must be a tier name such as batch, got {tier!r}")
        code = check_currency(currency)
        parts = {
            "cache_read_per_million": cache_read_per_million,
            "cache_write_per_million": cache_write_per_million,
            "cache_write_1h_per_million": cache_write_1h_per_million,
            "reasoning_per_million": reasoning_per_million,
        }
        params = {
            "model_pattern": name,
            "match_kind": "prefix" if prefix else "exact",
            "tier": tier_name,
            "effective_from": check_effective_from(effective_from),
            "input_per_million": check_price("input_per_million", input_per_million),
            "output_per_million": check_price("output_per_million", output_per_million),
            **{k: None if v is None else check_price(k, v) for k, v in parts.items()},
            "currency": code,
            "set_by": set_by,
        }
        try:
            [row] = self._db.fetch("set_price", params, dict_row)
        except psycopg.errors.ForeignKeyViolation:
            held = self.current_currency()
            raise InvalidInputError(
                "currency", f"the ledger's prices are in {held}; got {code}"
            ) from None
        except psycopg.errors.UniqueViolation:
            raise InvalidInputError(
                "from",
                f"{name} ({tier_name}) has a price from that time already; price history is "
                "never rewritten: set the new price from another time (now, by default)",
            ) from None
        blocked = row.pop("blocked_at")
        if blocked is not None:
            raise InvalidInputError(
                "from",
                f"calls of {name} were priced since then (the first at {blocked:%Y-%m-%d %H:%M} "
                "UTC): a price from the past would rewrite what they cost; set it from now on",
            )
        row.pop("priced_calls")
        return ModelPrice(**row)

    def delete_prices(
        self, model_name: str, *, prefix: bool = False, tier: str | None = None
    ) -> list[ModelPrice]:
        """Remove a model's (or prefix's) prices, of ``tier`` or every tier, when none of them
        priced a call (a mistyped price, say); a price that priced calls is history, and the
        whole removal is refused (:class:`InvalidInputError`). Returns what was removed."""
        params = {
            "model_pattern": model_name.strip(),
            "match_kind": "prefix" if prefix else "exact",
            "tier": tier,
        }
        rows = self._db.fetch("delete_prices", params, dict_row)
        kept = [r for r in rows if r["kept"]]
        if kept:
            first = kept[0]
            raise InvalidInputError(
                "model",
                f"{len(kept)} price(s) of {model_name.strip()!r} priced calls (the first from "
                f"{first['effective_from']:%Y-%m-%d %H:%M} UTC, {first['tier']}): price history "
                "is kept; set a new price from now on instead",
            )
        return [
            ModelPrice(**{k: v for k, v in r.items() if k not in ("kept", "removed")}) for r in rows
        ]

    def prices(self) -> list[ModelPrice]:
        """Every price with its history, by model, tier and the time it applies from."""
        return self._db.fetch("list_prices", {}, record_row(ModelPrice))

    def price_matches(self, days: int = 30) -> list[dict[str, Any]]:
        """Which calls of the last ``days`` days each price priced (a row whose
        ``model_pattern`` is ``None``: calls no price covers, and their models)."""
        return self._db.fetch("price_matches", {"days": days}, dict_row)
