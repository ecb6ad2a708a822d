"""The ledger's error hierarchy: one base class, one subclass per thing a caller can act on.

Each subclass's docstring is also its default message.
"""

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.values import Basis, ModelUsage

if TYPE_CHECKING:
    from datetime import datetime


class LedgerError(Exception):
    """The run ledger could not do what was asked."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or ((self.__doc__ or "").strip(),)))


class DrilledFailure(Exception):  # noqa: N818 - a failure made on purpose, not an error
    """A failure made on purpose by a drill (``idempotent-jobs drill``): its attempt ends with
    the outcome ``drill``, and no model call is recorded (none was made)."""


class InvalidInputError(LedgerError, ValueError):
    """A value given to the ledger is not valid."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class IdentityConflictError(LedgerError):
    """A stored run has the same id or the same identity fields but does not match this one."""


class LeaseLostError(LedgerError):
    """This worker no longer holds the run's lease: it was reclaimed, or the run moved on.

    Nothing was written. The caller may retry the whole step: a new claim decides who goes on.
    """


class RunNotFoundError(LedgerError):
    """No run with this id is registered in the ledger."""


class LeaseBusyError(LedgerError):
    """Another worker holds the run's lease and did not finish in time; retry later."""


class SchemaNotMigratedError(LedgerError):
    """The ledger schema is missing or not at this code's version: run `idempotent-jobs migrate`."""


class LedgerConnectionError(LedgerError):
    """The database connection failed while the outcome of a write was unknown; retrying is safe."""


class OutputRejectedError(LedgerError):
    """The validator rejected the model's output; the attempt is recorded as failed."""


class UsageRejectedError(OutputRejectedError):
    """The provider reported token counts that are not believable; the answer is refused.

    The call is still recorded as ``rejected``, with the counts that could be believed
    (``recorded``).
    """

    def __init__(self, message: str, *, recorded: ModelUsage | None) -> None:
        self.recorded = recorded
        super().__init__(message)


class StaleCandidateError(LedgerError):
    """The answer was computed against an earlier revision or raw-input checkpoint of the run.

    It was not accepted and nothing was sent; the attempt is recorded as ``superseded``. The run
    stays open for an answer computed on its current revision and checkpoint. ``candidate`` is
    the basis the answer was computed on, ``current`` the run's.
    """

    def __init__(
        self,
        *args: Any,
        run_id: str | None = None,
        candidate: Basis | None = None,
        current: Basis | None = None,
    ) -> None:
        self.run_id = run_id
        self.candidate = candidate
        self.current = current
        super().__init__(*args)


class LedgerPermissionError(LedgerError):
    """The database role lacks a privilege the ledger needs."""


class BudgetExceededError(LedgerError):
    """A budget has no room for the model call: it was refused before it was made.

    ``budget_id`` names the budget (``job:tokens/day:<job>``; see
    :mod:`idempotent_jobs.core.budgets`) and ``scope`` its scope (``job``, ``subject`` or
    ``group``); ``spent`` is what its period has spent in recorded calls since ``day_start``
    (the period's start), ``reserved`` what calls in flight hold, ``wanted`` this call's worst
    case and ``budget`` the cap, in ``unit`` (``tokens`` or ``money``). ``unpriced``: a money
    budget refused a model that has no price. The attempt ends with the outcome ``budget``; no
    model call is recorded (none was made).
    """

    def __init__(
        self,
        *,
        job_name: str,
        subject_id: str,
        scope: str,
        spent: Any,
        budget: Any,
        day_start: "datetime",
        budget_id: str | None = None,
        unit: str = "tokens",
        reserved: Any = 0,
        wanted: Any = 0,
        unpriced: str | None = None,
        currency: str | None = None,
    ) -> None:
        self.job_name = job_name
        self.currency = currency
        self.subject_id = subject_id
        self.scope = scope
        self.budget_id = budget_id or scope
        self.unit = unit
        self.spent = spent
        self.reserved = reserved
        self.wanted = wanted
        self.budget = budget
        self.day_start = day_start
        self.unpriced = unpriced
        if unpriced is not None:
            super().__init__(
                f"budget {self.budget_id} is in money and model {unpriced} has no price "
                "(idempotent-jobs prices set): a call that cannot be priced cannot be capped; "
                "the model call was not made"
            )
            return
        where = f"job {job_name}" + (f", subject {subject_id}" if scope == "subject" else "")
        what = "tokens" if unit == "tokens" else (currency or "in money")
        held = f", {_figure(reserved)} held by calls in flight" if reserved else ""
        wants = f"; this call may take up to {_figure(wanted)}" if wanted else ""
        super().__init__(
            f"budget {self.budget_id} has no room for this call ({where}): {_figure(spent)} of "
            f"{_figure(budget)} {what} spent since {day_start:%Y-%m-%d} 00:00 UTC{held}{wants}; "
            "the model call was not made"
        )


class BudgetConflictError(LedgerError):
    """A job's spec declares a budget other than the one the ledger holds: the ledger's is the
    one every deployment enforces, so the spec's workers do not start on another. Change the
    spec, change the ledger's (``idempotent-jobs budgets set`` or ``clear``), or let the spec
    follow the ledger (``follow_ledger_budget=True``)."""

    def __init__(self, budget_id: str, declared: Any, held: Any, held_by: str) -> None:
        self.budget_id = budget_id
        self.declared = declared
        self.held = held
        super().__init__(
            f"budget {budget_id}: the spec declares {_figure(declared)}, the ledger holds "
            f"{_figure(held)} (set by {held_by}); change one of them, or set "
            "follow_ledger_budget=True to enforce the ledger's"
        )


def _figure(value: Any) -> str:
    """``1,234`` for a whole number, ``0.0123`` for money (no trailing zeros)."""
    if isinstance(value, int):
        return f"{value:,}"
    try:
        number = Decimal(str(value))
    except Exception:
        return str(value)
    if number == number.to_integral_value():
        return f"{int(number):,}"
    return f"{number.normalize():f}"


class PaidCallError(Exception):
    """A model call failed after reaching the provider, with what it cost when the provider
    said (``usage``): ``answered`` when an answer came and was refused (recorded ``rejected``),
    else ``failed``. Raised by model steps (a provider error, an answer that stayed outside its
    schema after its repair turns); the attempt records the call with this usage, once."""

    def __init__(
        self, message: str, *, usage: ModelUsage | None = None, answered: bool = False
    ) -> None:
        super().__init__(message)
        self.usage = usage
        self.answered = answered


#: The attribute :func:`mark_unsent` sets on an exception.
_UNSENT = "_idempotent_jobs_unsent"


def mark_unsent(exc: BaseException) -> None:
    """Say that ``exc`` ended a model call before any request reached the provider (a prompt
    that could not be built, a budget, a drill, a lost lease): nothing was paid for, no call is
    recorded, and retrying the step on the same stored input would end the same way."""
    try:
        setattr(exc, _UNSENT, True)
    except Exception:  # an exception type that takes no attributes: it stays unmarked
        pass


def sent_nothing(exc: BaseException) -> bool:
    """Whether :func:`mark_unsent` marked ``exc`` (a step's retry policy skips such errors)."""
    return getattr(exc, _UNSENT, False) is True
