"""Make scheduled AI jobs safe to run more than once: one run record, one accepted result, and
each external side effect once, whatever the scheduler, the network or the workers do."""

from idempotent_jobs.core.errors import (
    IdentityConflictError,
    InvalidInputError,
    LeaseBusyError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    LedgerPermissionError,
    OutputRejectedError,
    RunNotFoundError,
    SchemaNotMigratedError,
    StaleCandidateError,
)
from idempotent_jobs.core.identity import RunIdentity, stable_run_id
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.protocol import ModelAnswer, RunOutcome, run_idempotent
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

__all__ = [
    "AttemptRecord",
    "Basis",
    "CallCosts",
    "CallOrigin",
    "Completion",
    "DeliveryReport",
    "IdentityConflictError",
    "InvalidInputError",
    "JobConfig",
    "Lease",
    "LeaseBusyError",
    "LeaseLostError",
    "LedgerConnectionError",
    "LedgerError",
    "LedgerPermissionError",
    "ModelAnswer",
    "ModelCallRecord",
    "ModelUsage",
    "OutboxRecord",
    "OutputRejectedError",
    "RunIdentity",
    "RunLedger",
    "RunNotFoundError",
    "RunOutcome",
    "RunRecord",
    "SchemaNotMigratedError",
    "StaleCandidateError",
    "run_idempotent",
    "stable_run_id",
]
