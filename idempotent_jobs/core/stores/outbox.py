"""The outbox store: notifications the commit queues, delivered once each by whichever worker or
``outbox deliver`` locks their row first (``sql/outbox.sql``); and the operator's listings."""

from collections.abc import Callable, Collection
from typing import Any

from idempotent_jobs.core.checks import check_job_names, check_limit
from idempotent_jobs.core.error_text import describe_error, safe_text
from idempotent_jobs.core.observers import watch
from idempotent_jobs.core.records import DeliveryReport, OutboxRecord
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.stores.base import Store


class OutboxStore(Store):
    """The outbox: delivery and listings."""

    def deliver_outbox(
        self,
        send: Callable[[OutboxRecord], None],
        *,
        run_id: str | None = None,
        limit: int = 100,
        job_names: Collection[str] | None = None,
    ) -> DeliveryReport:
        """Send undelivered notifications once each, keyed ``<run_id>:<channel>``.

        Each row is locked (``FOR UPDATE SKIP LOCKED``) while ``send`` runs, so concurrent
        deliverers never send the same row at once. A crash between a successful send and the
        mark re-sends later with the same key: receivers deduplicate on it.

        ``job_names``: only rows of these identity jobs are sent (a deliverer passes the jobs
        its code location owns, so on a shared ledger another team's rows are never sent
        through its channels); the report counts, by job, the pending rows it left.
        ``None`` sends every job's rows (the caller routes each row by its ``job_name``).
        """
        with watch.step("deliver", None):
            report = self._deliver(send, run_id, limit, job_names)
            watch.delivered(
                [row.channel for row in report.delivered],
                [row.channel for row, _ in report.failed],
            )
        return report

    def _deliver(
        self,
        send: Callable[[OutboxRecord], None],
        run_id: str | None,
        limit: int,
        job_names: Collection[str] | None,
    ) -> DeliveryReport:
        delivered: list[OutboxRecord] = []
        failed: list[tuple[OutboxRecord, str]] = []
        params = {
            "run_id": run_id,
            "pending_only": True,
            "limit": check_limit(limit),
            "job_names": check_job_names(job_names),
        }
        pending = self._db.fetch("list_outbox", params, record_row(OutboxRecord))
        for candidate in pending:
            key = {
                "run_id": candidate.run_id,
                "channel": candidate.channel,
                "revision": candidate.revision,
            }
            try:
                done = self._deliver_one(send, key)
            except Exception as exc:  # one bad row never stops the pass
                reason = safe_text(f"delivery not recorded: {describe_error(exc)}")
                self._record_delivery_failure(key, reason)
                failed.append((candidate, reason))
                continue
            if done is None:  # delivered meanwhile, or another deliverer holds it
                continue
            row, refused = done
            if refused is None:
                delivered.append(row)
            else:
                failed.append((row, refused))
        left: dict[str, int] = {}
        if job_names is not None:
            params = {"job_names": check_job_names(job_names), "run_id": run_id}
            left = dict(self._db.rows("pending_outbox_by_job", params))
        return DeliveryReport(delivered=delivered, failed=failed, left_pending=left)

    def _deliver_one(
        self, send: Callable[[OutboxRecord], None], key: dict[str, Any]
    ) -> tuple[OutboxRecord, str | None] | None:
        """Lock one undelivered row, send it, mark it: the row and ``None`` (delivered), or the
        row and the receiver's failure (recorded); ``None`` when the row is not to be had."""
        with self._db.transaction() as conn:
            with conn.cursor(row_factory=record_row(OutboxRecord)) as cur:
                row = cur.execute(self._db.query("lock_undelivered"), key).fetchone()
            if row is None:
                return None
            try:
                send(row)
            except Exception as exc:  # the receiver's failure is recorded, not raised
                reason = describe_error(exc)
                conn.execute(self._db.query("mark_delivery_failed"), {**key, "error": reason})
                return row, reason
            conn.execute(self._db.query("mark_delivered"), key)
            return row, None

    def _record_delivery_failure(self, key: dict[str, Any], reason: str) -> None:
        """Best effort, in a transaction of its own: the row whose delivery could not be
        recorded says why (when even this fails, the row simply stays undelivered)."""
        try:
            with self._db.transaction() as conn:
                conn.execute(self._db.query("mark_delivery_failed"), {**key, "error": reason})
        except Exception:  # noqa: S110 - the pass goes on; the row stays pending
            pass

    def outbox(
        self,
        run_id: str | None = None,
        *,
        pending_only: bool = False,
        limit: int = 1000,
        job_names: Collection[str] | None = None,
    ) -> list[OutboxRecord]:
        """Outbox rows, optionally of one run, of the identity jobs ``job_names``, and/or only
        those not delivered yet."""
        params = {
            "run_id": run_id,
            "pending_only": pending_only,
            "limit": check_limit(limit),
            "job_names": check_job_names(job_names),
        }
        return self._db.fetch("list_outbox", params, record_row(OutboxRecord))

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
