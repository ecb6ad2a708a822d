"""Make scheduled AI jobs safe to run more than once: one run record, one accepted result, and
each external side effect once, whatever the scheduler, the network or the workers do."""

from idempotent_jobs.errors import (
    IdentityConflictError,
    InvalidInputError,
    LeaseBusyError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    OutputRejectedError,
    RunNotFoundError,
    SchemaNotMigratedError,
)
from idempotent_jobs.identity import RunIdentity, stable_run_id
from idempotent_jobs.ledger import RunLedger
from idempotent_jobs.protocol import ModelAnswer, RunOutcome, run_idempotent
from idempotent_jobs.records import (
    AttemptRecord,
    Completion,
    DeliveryReport,
    Lease,
    ModelUsage,
    OutboxRecord,
    RunRecord,
)

__all__ = [
    "AttemptRecord",
    "Completion",
    "DeliveryReport",
    "IdentityConflictError",
    "InvalidInputError",
    "Lease",
    "LeaseBusyError",
    "LeaseLostError",
    "LedgerConnectionError",
    "LedgerError",
    "ModelAnswer",
    "ModelUsage",
    "OutboxRecord",
    "OutputRejectedError",
    "RunIdentity",
    "RunLedger",
    "RunNotFoundError",
    "RunOutcome",
    "RunRecord",
    "SchemaNotMigratedError",
    "run_idempotent",
    "stable_run_id",
]
