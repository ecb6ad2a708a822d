"""What operators read from a ledger: listings, run id prefixes, health checks, drift, armed
drills and storage. They run over the ledger's own pool (:attr:`RunLedger.executor`), and stay
off :class:`RunLedger`, which is the workers' path: register, claim, checkpoint, commit, fail,
deliver.
"""

from datetime import datetime

from idempotent_jobs.core.errors import InvalidInputError, RunNotFoundError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.ledger import RunLedger, check_limit, record_row
from idempotent_jobs.core.records import (
    DrillRecord,
    JobConfig,
    OutboxRecord,
    RunRecord,
    RunStatus,
    StoredPart,
    StoredTable,
)


class LedgerReads:
    """The operator's reads of ``ledger``'s tables (``LedgerReads(ledger).list_runs()``)."""

    def __init__(self, ledger: RunLedger) -> None:
        self._db = ledger.executor
        self.schema = ledger.schema

    def drills(self) -> list[DrillRecord]:
        """The drills still armed."""
        return self._db.fetch("list_drills", {}, record_row(DrillRecord))

    def job_names(self) -> list[str]:
        """The identity job names of the runs in the ledger, in order."""
        return [name for (name,) in self._db.rows("job_names", {})]

    def list_runs(
        self,
        *,
        job_name: str | None = None,
        subject_id: str | None = None,
        status: RunStatus | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = 100,
        after: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest window first (``limit=None``: all); ``since``/``until`` bound the
        window start, ``until`` exclusive. ``job_name`` and ``subject_id`` are compared as the
        identity stores them (stripped, Unicode NFC).

        ``after`` (a run id or a unique prefix of one, usually the last run of the previous
        page) continues the listing after that run: pages by keyset, as cheap on the
        thousandth page as on the first."""
        params = {
            "after": None if after is None else self.resolve_run_id(after),
            "job_name": None if job_name is None else normalize_text(job_name),
            "subject_id": None if subject_id is None else normalize_text(subject_id),
            "status": status,
            "since": since,
            "until": until,
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("list_runs", params, record_row(RunRecord))

    def resolve_run_id(self, prefix: str) -> str:
        """The one run id starting with ``prefix`` (hex); raise if none or several match."""
        prefix = prefix.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix) or len(prefix) > 64:
            raise InvalidInputError("run_id", f"{prefix!r} is not a run id or a hex prefix of one")
        matches = [r[0] for r in self._db.rows("run_ids_by_prefix", {"prefix": prefix})]
        if len(matches) != 1:
            many = "several runs" if matches else "no run"
            raise RunNotFoundError(f"run id prefix {prefix!r} matches {many}")
        return str(matches[0])

    def drifted(
        self, job_name: str, version: str, config: JobConfig, *, limit: int = 1000
    ) -> list[RunRecord]:
        """Completed runs of ``job_name``/``version`` whose result was computed under another
        configuration than ``config`` (newest window first)."""
        params = {
            "job_name": normalize_text(job_name),
            "version": normalize_text(version),
            "config_fingerprint": config.fingerprint,
            "limit": check_limit(limit),
        }
        return self._db.fetch("drifted_runs", params, record_row(RunRecord))

    def expired_leases(self, limit: int | None = None) -> list[RunRecord]:
        """Running runs whose lease expired (by the database clock) without completion, the
        longest expired first (``limit``: at most that many)."""
        params = {"limit": None if limit is None else check_limit(limit)}
        return self._db.fetch("expired_leases", params, record_row(RunRecord))

    def stale_outbox(
        self, older_than_seconds: float, limit: int | None = None
    ) -> list[OutboxRecord]:
        """Undelivered notifications queued more than ``older_than_seconds`` ago, oldest
        first."""
        params = {
            "older_than_seconds": float(older_than_seconds),
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("stale_outbox", params, record_row(OutboxRecord))

    def failed_past_retries(self, max_attempts: int, limit: int | None = None) -> list[RunRecord]:
        """Failed runs that have used ``max_attempts`` claims or more, the longest failed
        first."""
        params = {
            "max_attempts": max_attempts,
            "limit": None if limit is None else check_limit(limit),
        }
        return self._db.fetch("failed_past_retries", params, record_row(RunRecord))

    def storage(
        self, exact_below_rows: int = 200_000
    ) -> tuple[list[StoredTable], list[StoredPart]]:
        """What the ledger holds: each table's estimated rows and bytes on disk, and per job
        the rows and stored bytes of runs, raw inputs, outputs, attempts and outbox payloads.
        Exact for tables under ``exact_below_rows`` rows (by the catalogue's estimate); over
        that, estimated from a sample of about that many rows' pages."""
        tables = self._db.fetch("storage_tables", {"schema": self.schema}, record_row(StoredTable))
        estimated = {t.table_name: t.estimated_rows or 0 for t in tables}
        parts: list[StoredPart] = []

        def percent(table: str) -> float:
            rows = estimated.get(table, 0)
            return 100.0 if rows < exact_below_rows else 100.0 * exact_below_rows / rows

        def add(part: str, job: str, rows: int, size: int, sampled_percent: float) -> None:
            scale = 100.0 / sampled_percent
            parts.append(
                StoredPart(
                    job_name=job,
                    part=part,
                    rows=round(rows * scale),
                    bytes=round(size * scale),
                    estimated=scale > 1,
                )
            )

        runs_percent = percent("runs")
        for job, rows, row_bytes, raw_bytes, output_bytes in self._db.rows(
            "storage_runs", {"percent": runs_percent}
        ):
            add("runs", job, rows, row_bytes, runs_percent)
            add("runs.raw_input", job, rows, raw_bytes, runs_percent)
            add("runs.output", job, rows, output_bytes, runs_percent)
        attempts_percent = percent("run_attempts")
        for job, rows, size in self._db.rows("storage_attempts", {"percent": attempts_percent}):
            add("run_attempts", job, rows, size, attempts_percent)
        outbox_percent = percent("notification_outbox")
        for job, rows, size in self._db.rows("storage_outbox", {"percent": outbox_percent}):
            add("notification_outbox.payload", job, rows, size, outbox_percent)
        order = ["runs", "runs.raw_input", "runs.output", "run_attempts"]
        parts.sort(key=lambda p: (p.job_name, order.index(p.part) if p.part in order else 9))
        return tables, parts
