"""The retention store: what the ledger holds (storage by table and job) and the pruning of what
it may drop, in batches no lease holds (``sql/retention.sql``)."""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.stores.base import Store


@dataclass(frozen=True, kw_only=True)
class PruneBatch:
    """One retention batch of one job: where the walk got to (the last run's identity
    ``(subject_id, scheduled_at, version)``; ``None``: the job is done) and what the batch found
    to prune of each part, in rows and stored bytes."""

    last_key: tuple[str, datetime, str] | None
    raw_rows: int = 0
    raw_bytes: int = 0
    output_rows: int = 0
    output_bytes: int = 0
    attempt_rows: int = 0
    attempt_bytes: int = 0
    payload_rows: int = 0
    payload_bytes: int = 0

    @classmethod
    def of_row(cls, row: tuple[Any, ...]) -> "PruneBatch":
        """The batch a ``prune_batch`` row describes: the last run's identity, the counts, and
        a trailing column the record does not keep."""
        subject, scheduled_at, version, *counts, _ = row
        last = None if subject is None else (subject, scheduled_at, version)
        names = [f.name for f in fields(cls) if f.name != "last_key"]
        return cls(last_key=last, **dict(zip(names, counts, strict=True)))


@dataclass(frozen=True, kw_only=True)
class StoredPart:
    """Rows and stored bytes of one part of the ledger for one job (``estimated``: scaled up
    from a sample of the table's pages)."""

    job_name: str
    part: str
    rows: int
    bytes: int
    estimated: bool


@dataclass(frozen=True, kw_only=True)
class StoredTable:
    """One ledger table as the catalogue knows it: estimated rows (``None`` until the table is
    first analysed), bytes on disk."""

    table_name: str
    estimated_rows: int | None
    total_bytes: int


class RetentionStore(Store):
    """Storage and pruning."""

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

    def prune_batch(
        self,
        job_name: str,
        after: tuple[str, datetime, str],
        batch_size: int,
        *,
        raw_input_before: datetime | None,
        output_before: datetime | None,
        attempts_before: datetime | None,
        payloads_before: datetime | None,
        apply: bool,
    ) -> PruneBatch:
        """One retention batch of a job's runs after the identity ``after`` (see
        :func:`idempotent_jobs.core.retention.prune`)."""
        params = {
            "job_name": normalize_text(job_name),
            "after_subject": after[0],
            "after_scheduled_at": after[1],
            "after_version": after[2],
            "batch_size": batch_size,
            "raw_input_before": raw_input_before,
            "output_before": output_before,
            "attempts_before": attempts_before,
            "payloads_before": payloads_before,
            "apply": apply,
        }
        [row] = self._db.rows("prune_batch", params)
        return PruneBatch.of_row(row)

    def prune_spend(self, job_name: str, apply: bool) -> int:
        """A job's spend rows older than the longest budget period (kept: this calendar month
        and the one before): how many, deleted with ``apply``."""
        params = {"job_name": normalize_text(job_name), "apply": apply}
        [(rows,)] = self._db.rows("prune_spend", params)
        return int(rows)
