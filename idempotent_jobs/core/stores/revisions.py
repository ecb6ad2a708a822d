"""The revisions store: an operator's revision of a completed run, the only way a result is ever
replaced, and the revisions of a run (``sql/revisions.sql``)."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from idempotent_jobs.core.checks import (
    MAX_REASON_CHARS,
    check_channel,
    optional_name,
)
from idempotent_jobs.core.errors import InvalidInputError, RunNotFoundError
from idempotent_jobs.core.records import (
    RevisionRecord,
    RunRecord,
)
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store
from idempotent_jobs.core.stores.runs import RunsStore

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class RevisionsStore(Store):
    """Revisions."""

    def __init__(self, db: "Executor", settings: LedgerSettings, *, runs: RunsStore) -> None:
        super().__init__(db, settings)
        self._runs = runs

    def revise(
        self,
        run_id: str,
        reason: str,
        *,
        channels: Sequence[str] = (),
        recollect: bool = False,
        requested_by: str | None = None,
        expected_revision: int | None = None,
    ) -> RunRecord:
        """Reopen a completed run for recomputation: the only way a result is ever replaced.

        The accepted output moves to ``run_revisions`` with ``reason``; the run becomes pending
        under the next revision, keeping its raw input unless ``recollect`` (required when
        retention pruned the raw input). The next completion
        queues notifications only for ``channels`` (none: the new result is stored silently).
        ``expected_revision``: only while the run is at that revision (else refused, as a run
        that is not completed is).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("reason", "must say why the result is recomputed")
        if len(reason.strip()) > MAX_REASON_CHARS:
            raise InvalidInputError("reason", f"must be at most {MAX_REASON_CHARS} characters")
        if isinstance(channels, str):
            raise InvalidInputError("channels", "must be a list of channel names, not one string")
        for channel in channels:
            check_channel("channels", channel)
        params = {
            "run_id": run_id,
            "reason": reason.strip(),
            "channels": list(dict.fromkeys(channels)),
            "recollect": bool(recollect),
            "requested_by": optional_name("requested_by", requested_by),
            "expected": expected_revision,
        }
        rows = self._db.fetch("revise", params, record_row(RunRecord))
        if rows:
            return rows[0]
        record = self._runs.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        if record.status == "completed" and record.raw_input_pruned_at is not None:
            raise InvalidInputError(
                "recollect",
                f"the raw input of run {run_id} was pruned "
                f"{record.raw_input_pruned_at.isoformat(timespec='seconds')}: revise it with "
                "recollect (--recollect) to collect the input again",
            )
        if expected_revision is not None and record.revision != expected_revision:
            raise InvalidInputError(
                "run_id",
                f"run {run_id} is at revision {record.revision}, not {expected_revision}",
            )
        raise InvalidInputError(
            "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
        )

    def revisions(self, run_id: str) -> list[RevisionRecord]:
        """The accepted results a run had before each explicit revision, oldest first."""
        return self._db.fetch("list_revisions", {"run_id": run_id}, record_row(RevisionRecord))
