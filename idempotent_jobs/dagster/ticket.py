"""What travels between the ops of one Dagster run: a frozen ``Ticket``.

It names the ledger run, what the step did, whether the run is already completed, and the lease
(owner + epoch) handed on to the next step of the *same* Dagster run. A step in another Dagster run
(re-execution, run retry) never uses a lease it was not handed: it claims the run itself. The
model's answer travels with what it was computed on (a :class:`BoundAnswer`), so ``persist``
commits it only on that basis. Dagster's IO manager pickles tickets; they carry no raw input.
"""

from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from idempotent_jobs.core.records import (
    USAGE_PARTS,
    Basis,
    CallOrigin,
    JobConfig,
    Lease,
    ModelUsage,
    RunRecord,
)
from idempotent_jobs.core.steps import BoundAnswer

# Tickets pickled by an earlier release (in Dagster's IO storage, read by a re-execution after an
# upgrade) name their answer's class by this module's old name: it must keep resolving.
Answer = BoundAnswer


class StepResult(StrEnum):
    """What a step did, as its output metadata ``result`` says it."""

    COLLECTED = "collected"  # collect gathered the input and checkpointed it
    INPUT_REUSED = "reused input"  # collect found the checkpoint of an earlier attempt
    MODEL_CALLED = "model called"  # transform made the call; persist has yet to commit it
    ANSWER_REUSED = "reused answer"  # transform found an earlier attempt's paid, recorded answer
    NEW = "new"  # persist committed this run's answer: it is the accepted result
    REUSED = "reused"  # the run was already completed: its stored result is reported


@dataclass(frozen=True, kw_only=True)
class Ticket:
    """One step's hand-over to the next (see the module's docstring). ``notes`` qualify a
    reused result (``config changed: prompt``, ``output pruned``)."""

    run_id: str
    epoch: int
    attempts: int
    result: StepResult
    notes: tuple[str, ...] = ()
    completed: bool = False
    lease: Lease | None = None
    caller_run_id: str | None = None
    answer: BoundAnswer | None = None

    @property
    def label(self) -> str:
        """``result`` with its notes: ``reused (config changed: prompt; output pruned)``."""
        notes = "; ".join(self.notes)
        return f"{self.result} ({notes})" if notes else str(self.result)

    @classmethod
    def of_completed(cls, record: RunRecord, notes: tuple[str, ...] = ()) -> "Ticket":
        """A run already completed: later steps only report it."""
        return cls(
            run_id=record.run_id,
            epoch=record.lease_epoch,
            attempts=record.attempts,
            result=StepResult.REUSED,
            notes=notes,
            completed=True,
        )

    @classmethod
    def under(
        cls,
        lease: Lease,
        caller_run_id: str,
        result: StepResult,
        answer: BoundAnswer | None = None,
    ) -> "Ticket":
        """Work in progress under ``lease``, handed on to the next step of ``caller_run_id``
        (without the checkpoint: the next step reads it from the ledger)."""
        handed = replace(lease, stored_raw_input=None, expires_at=None)
        return cls(
            run_id=lease.run_id,
            epoch=lease.epoch,
            attempts=lease.attempts,
            result=result,
            lease=handed,
            caller_run_id=caller_run_id,
            answer=answer,
        )

    def handed_lease(self, caller_run_id: str) -> Lease | None:
        """The lease an earlier step of this very caller run handed on, if any."""
        return self.lease if self.caller_run_id == caller_run_id else None

    def done(self, result: StepResult, notes: tuple[str, ...] = ()) -> "Ticket":
        """This run, now completed (as ``result``): nothing is handed on any more."""
        return replace(
            self,
            result=result,
            notes=notes,
            completed=True,
            lease=None,
            caller_run_id=None,
            answer=None,
        )


#: The version of :meth:`Ticket.to_json`'s shape (a stored ticket names it).
TICKET_FORMAT = 1


def ticket_to_json(ticket: Ticket) -> dict[str, Any]:
    """``ticket`` as JSON (the ledger IO manager stores it so): plain fields, no pickle, so a
    stored value is never code that runs when it is loaded."""
    lease = ticket.lease
    answer = ticket.answer
    return {
        "format": TICKET_FORMAT,
        "run_id": ticket.run_id,
        "epoch": ticket.epoch,
        "attempts": ticket.attempts,
        "result": str(ticket.result),
        "notes": list(ticket.notes),
        "completed": ticket.completed,
        "caller_run_id": ticket.caller_run_id,
        "budgeted": None if lease is None else lease.budgeted,
        "lease": None
        if lease is None
        else {
            k: v
            for k, v in asdict(lease).items()
            # `budgeted` travels beside the lease (below): an earlier release's reader builds
            # Lease(**lease) and would refuse a field it does not know.
            if k not in ("expires_at", "stored_raw_input", "budgeted")
        },
        "answer": None
        if answer is None
        else {
            "output": answer.output,
            # The three counts as every release stores them; the requested model beside them,
            # where an earlier release's reader, which builds ModelUsage(**usage), ignores it.
            "usage": None if answer.usage is None else _counts(answer.usage),
            "requested_model": None if answer.usage is None else answer.usage.requested_model,
            "usage_parts": None if answer.usage is None else _parts(answer.usage),
            "basis": asdict(answer.basis),
            "config": dict(answer.config.parts),
            "origin": asdict(answer.origin),
        },
    }


def _counts(usage: ModelUsage) -> dict[str, Any]:
    return {
        "model_name": usage.model_name,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


def _parts(usage: ModelUsage) -> dict[str, Any]:
    """The usage's parts beside the counts (cache, reasoning, provider, tier)."""
    return {name: getattr(usage, name) for name in USAGE_PARTS}


def ticket_from_json(value: dict[str, Any]) -> Ticket:
    """The :class:`Ticket` :func:`ticket_to_json` stored."""
    if value.get("format") != TICKET_FORMAT:
        raise ValueError(f"a stored ticket of format {value.get('format')!r}, not {TICKET_FORMAT}")
    lease = value["lease"]
    answer = value["answer"]
    return Ticket(
        run_id=value["run_id"],
        epoch=value["epoch"],
        attempts=value["attempts"],
        result=StepResult(value["result"]),
        notes=tuple(value["notes"]),
        completed=value["completed"],
        caller_run_id=value["caller_run_id"],
        lease=None
        if lease is None
        else Lease(**lease, expires_at=None, budgeted=value.get("budgeted")),
        answer=None
        if answer is None
        else BoundAnswer(
            output=answer["output"],
            usage=None
            if answer["usage"] is None
            else ModelUsage(
                **answer["usage"],
                requested_model=answer.get("requested_model"),
                **(answer.get("usage_parts") or {}),
            ),
            basis=Basis(**answer["basis"]),
            config=JobConfig(answer["config"]),
            origin=CallOrigin(**answer["origin"]),
        ),
    )
