"""The ledger's error hierarchy: one base class, one subclass per thing a caller can act on.

Each subclass's docstring is also its default message.
"""

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
    """The job's token budget is spent: the model call was refused before it was made.

    ``scope`` is ``day`` (the job's budget for the UTC day) or ``subject`` (its budget per
    subject per day); ``spent`` is what the job (or the subject) has spent in recorded model
    calls since ``day_start``, ``budget`` the limit. The attempt ends with the outcome
    ``budget``; no model call is recorded (none was made).
    """

    def __init__(
        self,
        *,
        job_name: str,
        subject_id: str,
        scope: str,
        spent: int,
        budget: int,
        day_start: "datetime",
    ) -> None:
        self.job_name = job_name
        self.subject_id = subject_id
        self.scope = scope
        self.spent = spent
        self.budget = budget
        self.day_start = day_start
        where = f"job {job_name}" if scope == "day" else f"job {job_name}, subject {subject_id}"
        super().__init__(
            f"token budget spent: {where} has spent {spent:,} of {budget:,} tokens "
            f"since {day_start:%Y-%m-%d} 00:00 UTC; the model call was not made"
        )


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
