"""Budgets, decided in the ledger: every worker of every deployment sees one spend and one cap.

A :class:`Budget` caps what model calls may spend in a UTC day or calendar month (by the
database clock), in tokens or in money (the ledger's currency, at the prices in force), for a
job, for each subject of a job, or for a named group of jobs (a team). Budgets live in the
ledger (``idempotent-jobs budgets set``, or declared by a job's spec when its workers start);
every deployment enforces the ledger's.

Before each request to a provider, its worst case is **reserved** (``reserve_budget`` in the
ledger, one statement): its most input tokens at the dearest input price plus its most output
tokens (``max_tokens``, or the step's declared ``max_tokens_per_call``) at the dearest output
price. A request is admitted only while spent + reserved + its worst case fits under every
budget that covers its job, under the counter rows' locks; so N racing workers end at or under
the budget. When the call is recorded its reservation is settled to what it really cost (a call
that reported no usage is charged its reservation in full and counted as ``usage unknown``); a
request never sent gives its reservation back. A model step that announces no worst case is only
checked (admitted while spent + reserved is under the cap), so its calls in flight can overshoot:
declare ``max_tokens_per_call`` for a hard cap.

A call's first reservation rides on a statement the run makes anyway: the checkpoint
(:func:`~idempotent_jobs.run_idempotent`) or a later Dagster step's takeover of the lease
reserves the step's ``max_tokens_per_call`` (an :class:`~idempotent_jobs.core.records.
AdvanceHold`), and a first request within it reserves nothing more. A request beyond it (a
provider model's request larger than the declared ceiling, a repair turn, a retry) reserves in
a statement of its own.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from idempotent_jobs.core.errors import BudgetExceededError, InvalidInputError

Unit = Literal["tokens", "money"]
Period = Literal["day", "month"]
Scope = Literal["job", "subject", "group"]

#: The largest amount a budget may hold, in tokens or money (the column's check).
MAX_AMOUNT = Decimal(10) ** 18
_UNITS = ("tokens", "money")
_PERIODS = ("day", "month")
_SCOPES = ("job", "subject", "group")


def _amount(field_name: str, value: object, unit: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str | float):
        raise InvalidInputError(field_name, f"must be a number, got {value!r}")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise InvalidInputError(field_name, f"must be a number, got {value!r}") from None
    what = "tokens" if unit == "tokens" else "money"
    if not amount.is_finite() or not 0 < amount <= MAX_AMOUNT:
        raise InvalidInputError(
            field_name, f"must be more than 0 and at most 10^18 {what}, got {value!r}"
        )
    if unit == "tokens" and amount != amount.to_integral_value():
        raise InvalidInputError(field_name, f"must be a whole number of tokens, got {value!r}")
    return amount


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A cap on model calls: ``amount`` ``unit`` (``tokens``, or ``money`` in the ledger's
    currency) per ``period`` (``day``: the UTC day; ``month``: the calendar month, UTC), for
    ``scope``: ``job`` (the job's calls), ``subject`` (each subject of the job on its own) or
    ``group`` (every job declaring the same ``group`` name, together)."""

    amount: Decimal | int | str
    unit: Unit = "tokens"
    period: Period = "day"
    scope: Scope = "job"
    group: str | None = None

    def __post_init__(self) -> None:
        if self.unit not in _UNITS:
            raise InvalidInputError("unit", f"must be tokens or money, got {self.unit!r}")
        if self.period not in _PERIODS:
            raise InvalidInputError("period", f"must be day or month, got {self.period!r}")
        if self.scope not in _SCOPES:
            raise InvalidInputError("scope", f"must be job, subject or group, got {self.scope!r}")
        if self.scope == "group":
            if not isinstance(self.group, str) or not self.group.strip() or len(self.group) > 200:
                raise InvalidInputError("group", "a group budget needs a group name (1-200 chars)")
        elif self.group is not None:
            raise InvalidInputError("group", f"only a group budget has a group, not {self.scope}")
        object.__setattr__(self, "amount", _amount("amount", self.amount, self.unit))

    def scope_name(self, job_name: str) -> str:
        """What the budget is named after: the group, else the job."""
        return self.group if self.group is not None else job_name

    def budget_id(self, job_name: str) -> str:
        """The ledger's key: ``<scope>:<unit>/<period>:<name>``."""
        return budget_id(self.scope, self.unit, self.period, self.scope_name(job_name))

    def describe(self) -> str:
        what = f"{self.amount:,f} tokens" if self.unit == "tokens" else f"{self.amount:f} money"
        per = "per subject per " if self.scope == "subject" else "per "
        whose = f" for group {self.group}" if self.group else ""
        return f"{what} {per}{self.period}{whose}"


def budget_id(scope: str, unit: str, period: str, name: str) -> str:
    return f"{scope}:{unit}/{period}:{name}"


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """A job's token budget per UTC day: ``tokens_per_day`` for the whole job and
    ``tokens_per_subject_per_day`` for each subject (either may be ``None``: no such limit).
    The shape of earlier releases; :meth:`budgets` says it as :class:`Budget` s."""

    tokens_per_day: int | None = None
    tokens_per_subject_per_day: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokens_per_day", "tokens_per_subject_per_day"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInputError(name, f"must be a whole number of tokens, got {value!r}")
            _amount(name, value, "tokens")
        if self.tokens_per_day is None and self.tokens_per_subject_per_day is None:
            raise InvalidInputError(
                "budget", "set tokens_per_day, tokens_per_subject_per_day or both"
            )

    def budgets(self) -> tuple[Budget, ...]:
        found = []
        if self.tokens_per_day is not None:
            found.append(Budget(amount=self.tokens_per_day))
        if self.tokens_per_subject_per_day is not None:
            found.append(Budget(amount=self.tokens_per_subject_per_day, scope="subject"))
        return tuple(found)


#: What a job's spec or a call may name as its budget.
BudgetSpec = TokenBudget | Budget | Sequence[Budget]


def budgets_of(declared: BudgetSpec | None) -> tuple[Budget, ...]:
    """The :class:`Budget` s a spec declares (none for ``None``)."""
    if declared is None:
        return ()
    if isinstance(declared, TokenBudget):
        return declared.budgets()
    if isinstance(declared, Budget):
        return (declared,)
    if isinstance(declared, str) or not all(isinstance(b, Budget) for b in declared):
        raise InvalidInputError("budget", "must be a Budget, a TokenBudget or a list of Budgets")
    found = tuple(declared)
    keys = [(b.scope, b.unit, b.period, b.group) for b in found]
    if len(set(keys)) != len(keys):
        raise InvalidInputError("budget", "two budgets of one scope, unit and period")
    return found


def check_call_ceiling(value: object) -> int | None:
    """A model step's declared most tokens per call (input and output), or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
        raise InvalidInputError(
            "max_tokens_per_call", f"must be a whole number from 1 to 10^9, got {value!r}"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class BudgetStanding:
    """A budget in the ledger and where it stands in its current period (of one subject, for
    a subject budget: the one that spent most)."""

    budget_id: str
    scope: str
    scope_name: str
    unit: str
    period: str
    amount: Decimal
    jobs: list[str]
    declared_by: str
    set_at: datetime
    set_by: str | None
    period_start: datetime
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    #: What calls whose outcome is in doubt (no usage known) hold, apart from ``spent`` until
    #: an operator settles them (``idempotent-jobs costs settle``) or the period ends.
    in_doubt: Decimal = Decimal(0)
    calls: int = 0
    unknown_calls: int = 0
    subject_id: str = ""
    refusing: bool = False
    currency: str | None = field(default=None)

    @property
    def left(self) -> Decimal:
        return max(self.amount - self.spent - self.reserved - self.in_doubt, Decimal(0))


def figure(amount: Decimal, unit: str, currency: str | None) -> str:
    """``1,234 tokens`` or ``1.25 USD`` (money as the ledger holds it, no trailing zeros)."""
    if unit == "tokens":
        return f"{int(amount):,} tokens"
    return f"{amount.normalize():f} {currency or ''}".rstrip()


def budget_refusal(row: Mapping[str, Any], model: str | None) -> BudgetExceededError:
    """The error of a request ``reserve_budget`` refused (its row: the budget, what it holds
    and what the request wanted; ``unpriced`` for a money budget and a model with no price)."""
    scope, rest = str(row["budget_id"]).split(":", 1)
    unit = rest.split("/", 1)[0]
    start = row["period_start"]
    return BudgetExceededError(
        job_name=str(row["job_name"]),
        subject_id=str(row["subject_id"] or ""),
        scope=scope,
        budget_id=str(row["budget_id"]),
        unit=unit,
        spent=_number(row["spent"]),
        reserved=_number(row["reserved"]),
        wanted=_number(row["wanted"]),
        budget=_number(row["amount"]),
        day_start=datetime(start.year, start.month, start.day, tzinfo=UTC)
        if start is not None
        else datetime.now(UTC),
        unpriced=(model or "(no model)") if row["outcome"] == "unpriced" else None,
        currency=str(row.get("currency") or "") or None,
    )


def _number(value: object) -> Decimal | int:
    """A whole number as an int (tokens), else the Decimal (money)."""
    if value is None:
        return 0
    number = Decimal(str(value))
    return int(number) if number == number.to_integral_value() else number


def declared_budget_params(job_name: str, budgets: Sequence[Budget]) -> dict[str, Any]:
    """``declare_budgets``'s arrays: one element per budget."""
    return {
        "job_name": job_name,
        "ids": [b.budget_id(job_name) for b in budgets],
        "scopes": [b.scope for b in budgets],
        "names": [b.scope_name(job_name) for b in budgets],
        "units": [b.unit for b in budgets],
        "periods": [b.period for b in budgets],
        "amounts": [b.amount for b in budgets],
    }
