"""Make scheduled AI jobs safe to run more than once: one run record, one accepted result, and
each external side effect once, whatever the scheduler, the network or the workers do."""

from importlib import import_module
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING, Any

try:  # the installed distribution's version: pyproject.toml's, the one source of it
    __version__ = _distribution_version("idempotent-jobs")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from idempotent_jobs.core.admin import LedgerAdmin
    from idempotent_jobs.core.budgets import Budget, TokenBudget
    from idempotent_jobs.core.calls import CallBook, current_calls
    from idempotent_jobs.core.errors import (
        BudgetConflictError,
        BudgetExceededError,
        IdentityConflictError,
        InvalidInputError,
        LeaseBusyError,
        LeaseLostError,
        LedgerConnectionError,
        LedgerError,
        LedgerPermissionError,
        OutputRejectedError,
        PaidCallError,
        RunNotFoundError,
        SchemaNotMigratedError,
        StaleCandidateError,
    )
    from idempotent_jobs.core.identity import RunIdentity, stable_run_id
    from idempotent_jobs.core.json_values import UnreadableValue
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.core.observers import EngineObserver, FailedAttempt, add_observer
    from idempotent_jobs.core.policy import CallPolicy
    from idempotent_jobs.core.protocol import ModelAnswer, RunOutcome, run_idempotent
    from idempotent_jobs.core.rate_limits import RateLimit
    from idempotent_jobs.core.records import (
        AttemptRecord,
        Basis,
        CallCosts,
        CallOrigin,
        Completion,
        DeliveryReport,
        JobConfig,
        Lease,
        ModelCallRecord,
        ModelUsage,
        OutboxRecord,
        RunRecord,
    )
    from idempotent_jobs.core.settings import LedgerSettings
    from idempotent_jobs.core.upgrade import MigrationReport

# Imported on first use (PEP 562), so `idempotent_jobs.operator.cli --help` starts fast.
_HOMES = {
    **dict.fromkeys(
        (
            "BudgetConflictError BudgetExceededError IdentityConflictError InvalidInputError "
            "LeaseBusyError LeaseLostError LedgerConnectionError LedgerError LedgerPermissionError "
            "OutputRejectedError PaidCallError RunNotFoundError SchemaNotMigratedError "
            "StaleCandidateError"
        ).split(),
        "errors",
    ),
    "TokenBudget": "budgets",
    "Budget": "budgets",
    "RateLimit": "rate_limits",
    "CallPolicy": "policy",
    "EngineObserver": "observers",
    "FailedAttempt": "observers",
    "add_observer": "observers",
    "CallBook": "calls",
    "current_calls": "calls",
    "RunIdentity": "identity",
    "stable_run_id": "identity",
    "UnreadableValue": "json_values",
    "MigrationReport": "upgrade",
    "RunLedger": "ledger",
    "LedgerAdmin": "admin",
    "LedgerSettings": "settings",
    "ModelAnswer": "protocol",
    "RunOutcome": "protocol",
    "run_idempotent": "protocol",
    **dict.fromkeys(
        (
            "AttemptRecord Basis CallCosts CallOrigin Completion DeliveryReport JobConfig Lease "
            "ModelCallRecord ModelUsage OutboxRecord RunRecord"
        ).split(),
        "records",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'idempotent_jobs' has no attribute {name!r}")
    return getattr(import_module(f"idempotent_jobs.core.{home}"), name)


__all__ = [
    "AttemptRecord",
    "Basis",
    "Budget",
    "BudgetConflictError",
    "BudgetExceededError",
    "CallBook",
    "CallCosts",
    "CallPolicy",
    "CallOrigin",
    "Completion",
    "DeliveryReport",
    "EngineObserver",
    "FailedAttempt",
    "IdentityConflictError",
    "InvalidInputError",
    "JobConfig",
    "Lease",
    "LeaseBusyError",
    "LeaseLostError",
    "LedgerConnectionError",
    "LedgerAdmin",
    "LedgerError",
    "LedgerPermissionError",
    "LedgerSettings",
    "MigrationReport",
    "ModelAnswer",
    "ModelCallRecord",
    "ModelUsage",
    "OutboxRecord",
    "OutputRejectedError",
    "PaidCallError",
    "RateLimit",
    "RunIdentity",
    "RunLedger",
    "RunNotFoundError",
    "RunOutcome",
    "RunRecord",
    "SchemaNotMigratedError",
    "StaleCandidateError",
    "TokenBudget",
    "UnreadableValue",
    "add_observer",
    "current_calls",
    "run_idempotent",
    "stable_run_id",
]
