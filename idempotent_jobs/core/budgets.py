"""Token budgets, decided in the ledger: every worker of every deployment sees one spend.

A :class:`TokenBudget` limits what a job's model calls may spend in a UTC day (by the database
clock), in all and optionally per subject. Spend is what ``model_calls`` records (input plus
output tokens of every call, accepted or not). A call that would start once a limit is spent is
refused with :class:`~idempotent_jobs.core.errors.BudgetExceededError` before it is made; a call
already started is never stopped, so concurrent workers overshoot a limit by at most the one
call each has in flight (calls that report no usage count as 0).
"""

from dataclasses import dataclass
from datetime import datetime

from idempotent_jobs.core.errors import BudgetExceededError, InvalidInputError


def _limit(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(field, f"must be a whole number of tokens, got {value!r}")
    if not 1 <= value <= 2**62:
        raise InvalidInputError(field, f"must be at least 1 token, got {value}")
    return value


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """A job's token budget per UTC day: ``tokens_per_day`` for the whole job and
    ``tokens_per_subject_per_day`` for each subject (either may be ``None``: no such limit)."""

    tokens_per_day: int | None = None
    tokens_per_subject_per_day: int | None = None

    def __post_init__(self) -> None:
        _limit("tokens_per_day", self.tokens_per_day)
        _limit("tokens_per_subject_per_day", self.tokens_per_subject_per_day)
        if self.tokens_per_day is None and self.tokens_per_subject_per_day is None:
            raise InvalidInputError(
                "budget", "set tokens_per_day, tokens_per_subject_per_day or both"
            )


@dataclass(frozen=True, kw_only=True)
class BudgetSpend:
    """What a run's job and subject have spent today, and the budget it was checked against."""

    job_name: str
    subject_id: str
    day_start: datetime
    job_tokens: int
    subject_tokens: int
    budget: TokenBudget
    refused: str | None  # 'day', 'subject' or None

    def error(self) -> BudgetExceededError:
        """The refusal, when a limit is spent."""
        subject = self.refused == "subject"
        limit = self.budget.tokens_per_subject_per_day if subject else self.budget.tokens_per_day
        assert self.refused is not None and limit is not None
        return BudgetExceededError(
            job_name=self.job_name,
            subject_id=self.subject_id,
            scope=self.refused,
            spent=self.subject_tokens if subject else self.job_tokens,
            budget=limit,
            day_start=self.day_start,
        )
