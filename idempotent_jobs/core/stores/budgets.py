"""The budgets store: budgets a spec declares or an operator sets, and a request's hold under them
(``sql/budgets.sql``; the ledger's functions admit and release it)."""

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg.rows import dict_row

from idempotent_jobs.core.budgets import (
    Budget,
    BudgetStanding,
    budget_refusal,
    declared_budget_params,
)
from idempotent_jobs.core.checks import (
    fence_params,
)
from idempotent_jobs.core.errors import (
    BudgetConflictError,
    InvalidInputError,
    LeaseLostError,
)
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import (
    Lease,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store
from idempotent_jobs.core.stores.runs import RunsStore

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class BudgetsStore(Store):
    """Budgets, declared once per process and job, and holds."""

    def __init__(self, db: "Executor", settings: LedgerSettings, *, runs: RunsStore) -> None:
        super().__init__(db, settings)
        self._runs = runs
        self._declared: set[tuple[str, tuple[Budget, ...], bool]] = set()

    def declare_budgets(
        self,
        lease: Lease,
        budgets: Sequence[Budget],
        *,
        follow_ledger: bool = False,
        job_name: str | None = None,
    ) -> bool:
        """Declare the budgets a job's spec names (once per process and job): one the ledger
        does not hold is added, with its period's spend so far; a group budget gains the job;
        one the ledger holds at another amount raises :class:`BudgetConflictError` naming both,
        unless ``follow_ledger`` (the ledger's is enforced either way). ``job_name``: the run's
        identity job, when the caller knows it (else it is read). Returns whether the ledger
        was asked (the first declaration in this process: a budget may have been added since
        the lease's hold was made)."""
        if job_name is None:
            job_name = self._runs.job_of(lease.run_id)
        job_name = normalize_text(job_name)
        key = (job_name, tuple(budgets), follow_ledger)
        if key in self._declared:
            return False
        params = declared_budget_params(job_name, budgets)
        conflicts = self._db.fetch("declare_budgets", params, dict_row)
        if conflicts and not follow_ledger:
            first = conflicts[0]
            raise BudgetConflictError(
                first["budget_id"], first["declared"], first["held"], first["held_by"]
            )
        self._declared.add(key)
        return True

    def reserve_budget(
        self,
        lease: Lease,
        *,
        max_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_tokens: int | None = None,
        requested_model: str | None = None,
        model_name: str | None = None,
        tier: str | None = None,
    ) -> None:
        """Admit one request of the run under every budget that covers its job, holding its
        worst case until its call is recorded: ``max_input_tokens`` at the dearest input price,
        ``max_output_tokens`` at the dearest output price, ``max_tokens`` (a ceiling of either)
        at the dearest of all. Raise :class:`BudgetExceededError` when one has no room (nothing
        is held then), :class:`LeaseLostError` when the lease is not held. With no worst case
        the request is only checked: admitted while spent and held are under each cap (see
        :mod:`.budgets`)."""
        params = {
            **fence_params(lease),
            "max_input": max_input_tokens,
            "max_output": max_output_tokens,
            "max_total": max_tokens,
            "requested": requested_model,
            "answered": model_name,
            "tier": tier,
        }
        [row] = self._db.fetch("reserve_budget", params, dict_row)
        if row["outcome"] == "admitted":
            return
        if row["outcome"] == "lease_lost":
            raise LeaseLostError()
        raise budget_refusal(row, requested_model or model_name)

    def release_budget(self, lease: Lease) -> None:
        """Give back what the attempt's unsent request holds of its budgets."""
        self._db.rows("release_budget", fence_params(lease))

    def budgets(
        self, job_name: str | None = None, *, subject_id: str | None = None
    ) -> list[BudgetStanding]:
        """Every budget the ledger holds (those covering ``job_name``), with where its
        current period stands: what every worker enforces. A subject budget stands at its
        subject that spent most, or at ``subject_id``'s counter when given."""
        params = {
            "job_name": job_name,
            "subject_id": None if subject_id is None else normalize_text(subject_id),
        }
        return self._db.fetch("budget_standings", params, record_row(BudgetStanding))

    def set_budget(
        self, budget: Budget, *, job_name: str | None = None, jobs: Sequence[str] = ()
    ) -> BudgetStanding:
        """Set a budget as the operator (it stands over a spec's declaration): of ``job_name``
        for a job or subject budget, of the group's ``jobs`` for a group budget. A new budget
        starts with what its period has spent already."""
        if budget.scope == "group":
            members = sorted({normalize_text(j) for j in jobs})
            if not members:
                raise InvalidInputError("jobs", "a group budget needs the jobs it covers")
            name = budget.scope_name("")
        else:
            if not job_name or not job_name.strip():
                raise InvalidInputError("job", f"a {budget.scope} budget needs its job's name")
            name = normalize_text(job_name)
            members = [name]
        params = {
            "budget_id": budget.budget_id(name),
            "scope": budget.scope,
            "scope_name": budget.scope_name(name),
            "unit": budget.unit,
            "period": budget.period,
            "amount": budget.amount,
            "jobs": members,
            "set_by": os.environ.get("USER"),
        }
        [(budget_key, _inserted)] = self._db.rows("set_budget", params)
        [standing] = [b for b in self.budgets() if b.budget_id == budget_key]
        return standing

    def clear_budget(self, budget_id: str) -> bool:
        """Remove a budget (``job:tokens/day:<job>``): whether there was one."""
        return bool(self._db.rows("clear_budget", {"budget_id": budget_id}))
