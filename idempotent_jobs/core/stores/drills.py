"""The drills store: failure drills an operator arms and model calls take (``sql/drills.sql``)."""

from idempotent_jobs.core.checks import optional_name
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import DrillRecord
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.stores.base import Store


class DrillsStore(Store):
    """Failure drills."""

    def take_drill(self, job_name: str) -> int | None:
        """Use up one drilled failure for a model call of ``job_name``: the calls the drill
        still fails after this one, or ``None`` when no drill takes it."""
        rows = self._db.rows("take_drill", {"job_name": normalize_text(job_name)})
        return int(rows[0][1]) if rows else None

    def drills(self) -> list[DrillRecord]:
        """The drills still armed."""
        return self._db.fetch("list_drills", {}, record_row(DrillRecord))

    def arm_drill(
        self, job_name: str, calls: int, seconds: float, *, armed_by: str | None = None
    ) -> DrillRecord:
        """Make the next ``calls`` model calls of ``job_name`` (identity job name; ``*``: every
        job) fail on purpose, for at most ``seconds``; every worker sees it."""
        if not isinstance(calls, int) or isinstance(calls, bool) or not 0 < calls <= 10**7:
            raise InvalidInputError(
                "calls", f"must be a whole number from 1 to 10^7, got {calls!r}"
            )
        if not (isinstance(seconds, int | float) and 0 < seconds <= 10 * 366 * 86400):
            raise InvalidInputError("seconds", f"must be from 0 to ten years, got {seconds!r}")
        params = {
            "job_name": normalize_text(job_name) if job_name != "*" else "*",
            "calls": calls,
            "seconds": float(seconds),
            "armed_by": optional_name("armed_by", armed_by),
        }
        [drill] = self._db.fetch("arm_drill", params, record_row(DrillRecord))
        return drill

    def disarm_drills(self, job_name: str | None = None) -> list[DrillRecord]:
        """End the drill of ``job_name`` (every drill when ``None``); return those ended."""
        params = {"job_name": job_name}
        return self._db.fetch("disarm_drills", params, record_row(DrillRecord))
