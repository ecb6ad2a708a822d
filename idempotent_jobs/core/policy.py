"""What decides whether a job's model call may be sent: one :class:`CallPolicy` per job.

A policy gathers what both drivers (``run_idempotent`` and the Dagster ops) used to pass one by
one to the attempt engine: the job whose failure drills apply, the budgets its spec declares
(and whether it follows the ledger's when they differ), the most one call takes, and the
provider rate limits its model steps keep. It is checked once, when built, and declared in the
ledger once per process and ledger (the budgets at the first call of a job, the limits
likewise); each request is then admitted by one statement (the lease still held, its budget
hold, its place under the rate limit: :meth:`~idempotent_jobs.core.ledger.RunLedger.admit_request`).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from idempotent_jobs.core.budgets import Budget, BudgetSpec, budgets_of, check_call_ceiling
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.rate_limits import RateLimit
from idempotent_jobs.core.records import Lease


@dataclass(frozen=True)
class CallPolicy:
    """``CallPolicy(budget=..., max_tokens_per_call=..., rate_limits=[...])``, built once per job.

    ``job_name``: the identity job whose drills and budgets apply (``run_idempotent`` sets it to
    the run's when left out). ``budget``: the job's declared budgets (a :class:`Budget`, a list,
    or a :class:`TokenBudget`), held against the ledger's (:class:`BudgetConflictError` when
    they differ, unless ``follow_ledger_budget``). ``max_tokens_per_call``: the most tokens one
    call takes, reserved before it is sent. ``rate_limits``: the provider limits the job's model
    steps keep, declared in the ledger for every worker of every deployment. Bad values raise
    :class:`InvalidInputError` naming the field.
    """

    job_name: str | None = None
    budget: BudgetSpec | None = None
    follow_ledger_budget: bool = False
    max_tokens_per_call: int | None = None
    rate_limits: Sequence[RateLimit] = ()
    #: The declared budgets, one by one (from ``budget``).
    budgets: tuple[Budget, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", budgets_of(self.budget))
        object.__setattr__(
            self, "max_tokens_per_call", check_call_ceiling(self.max_tokens_per_call)
        )
        if isinstance(self.rate_limits, RateLimit):
            raise InvalidInputError("rate_limits", "must be a list of RateLimit values, not one")
        limits = tuple(self.rate_limits)
        for limit in limits:
            if not isinstance(limit, RateLimit):
                raise InvalidInputError(
                    "rate_limits", f"must be RateLimit values, got {type(limit).__name__}"
                )
        object.__setattr__(self, "rate_limits", limits)
        if not isinstance(self.follow_ledger_budget, bool):
            raise InvalidInputError(
                "follow_ledger_budget", f"must be true or false, got {self.follow_ledger_budget!r}"
            )
        if self.job_name is not None:
            object.__setattr__(self, "job_name", normalize_text(self.job_name))

    def for_job(self, job_name: str) -> "CallPolicy":
        """This policy for the identity job ``job_name`` (itself when it names a job already)."""
        return self if self.job_name is not None else replace(self, job_name=job_name)

    @property
    def declares_budgets(self) -> bool:
        return bool(self.budgets) or self.follow_ledger_budget

    def declare(self, ledger: RunLedger, lease: Lease) -> bool:
        """Declare the job's budgets and rate limits in the ledger (each once per process and
        ledger: a statement the first time only). Returns whether a budget was declared now,
        so a hold made before it must be made again under every budget."""
        declared_now = False
        if self.declares_budgets:
            declared_now = ledger.declare_budgets(
                lease,
                self.budgets,
                follow_ledger=self.follow_ledger_budget,
                job_name=self.job_name,
            )
        if self.rate_limits:
            if self.job_name is None:  # never skipped silently: a limit nobody keeps is none
                raise InvalidInputError(
                    "job_name",
                    "a CallPolicy with rate_limits must name its job (CallPolicy(job_name=...), "
                    "or policy.for_job(name)) to declare them",
                )
            ledger.declare_rate_limits(self.rate_limits, self.job_name)
        return declared_now


#: No budget declared, no ceiling, no limit: the ledger's own budgets and limits still apply.
NO_POLICY = CallPolicy()

__all__ = ["NO_POLICY", "CallPolicy"]
