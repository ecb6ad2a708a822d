"""What travels between the ops of one Dagster run: a frozen ``Ticket``.

It names the ledger run, what the step did, whether the run is already completed, and the lease
(owner + epoch) handed on to the next step of the *same* Dagster run. A step in another Dagster run
(re-execution, run retry) never uses a lease it was not handed: it claims the run itself. The
model's answer travels with what it was computed on (:class:`Answer`), so ``persist`` commits it
only on that basis. Dagster's IO manager pickles tickets; they carry no raw input.
"""

from dataclasses import dataclass, replace
from typing import Any

from idempotent_jobs.core.records import Basis, CallOrigin, JobConfig, Lease, ModelUsage, RunRecord


@dataclass(frozen=True)
class Answer:
    """A model answer on its way to ``persist``: the output, what the call cost, the revision
    and checkpoint it was computed on, the job configuration, and the step that made the call."""

    output: dict[str, Any]
    usage: ModelUsage
    basis: Basis
    config: JobConfig
    origin: CallOrigin


@dataclass(frozen=True)
class Ticket:
    """One step's hand-over to the next (see the module's docstring)."""

    run_id: str
    epoch: int
    attempts: int
    result: str
    completed: bool = False
    lease: Lease | None = None
    caller_run_id: str | None = None
    answer: Answer | None = None

    @classmethod
    def of_completed(cls, record: RunRecord, result: str) -> "Ticket":
        """A run already completed: later steps only report it (as ``result``)."""
        return cls(record.run_id, record.lease_epoch, record.attempts, result, completed=True)

    @classmethod
    def under(
        cls, lease: Lease, caller_run_id: str, result: str, answer: Answer | None = None
    ) -> "Ticket":
        """Work in progress under ``lease``, handed on to the next step of ``caller_run_id``
        (without the checkpoint: the next step reads it from the ledger)."""
        handed = replace(lease, stored_raw_input=None, expires_at=None)
        return cls(
            lease.run_id, lease.epoch, lease.attempts, result, False, handed, caller_run_id, answer
        )

    def handed_lease(self, caller_run_id: str) -> Lease | None:
        """The lease an earlier step of this very caller run handed on, if any."""
        return self.lease if self.caller_run_id == caller_run_id else None

    def done(self, result: str) -> "Ticket":
        """This run, now completed (as ``result``)."""
        return Ticket(self.run_id, self.epoch, self.attempts, result, completed=True)
