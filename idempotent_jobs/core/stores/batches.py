"""The batches store: provider batches of the batch lane (migration 0019), their items, claims and
collection, each write fenced by the batch's own lease (``sql/batches.sql``); and the operator's
listings and cancels. The records a batch is read as are
:mod:`idempotent_jobs.core.batch_book`'s."""

import json
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from idempotent_jobs.core.batch_book import (
    BATCH_STATES,
    ITEM_STATES,
    BatchItem,
    BatchLease,
    CollectedRun,
    batch_worker,
    custom_id_of,
    new_batch_id,
)
from idempotent_jobs.core.checks import (
    check_lease_seconds,
    check_name,
    check_worker_id,
)
from idempotent_jobs.core.errors import (
    InvalidInputError,
    LeaseLostError,
    LedgerError,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.records import Lease
from idempotent_jobs.core.stores.base import Store


class BatchesStore(Store):
    """The batch lane's writes and reads (the worker face); listings and cancels (the operator
    face)."""

    def open_batch(
        self,
        job_name: str,
        provider: str,
        model: str,
        worker_id: str,
        lease_seconds: float,
        *,
        caller_run_id: str | None = None,
    ) -> BatchLease:
        """A new batch (an intent with no items yet), leased to ``worker_id``."""
        batch_id = new_batch_id()
        params = {
            "batch_id": batch_id,
            "job_name": check_name("job_name", job_name),
            "provider": check_name("provider", provider),
            "model": check_name("model", model),
            "worker_id": check_worker_id(worker_id),
            "lease_seconds": check_lease_seconds(lease_seconds),
            "caller_run_id": caller_run_id,
        }
        [(epoch, expires_at)] = self._db.rows("open_batch", params)
        return BatchLease(batch_id, worker_id, epoch, expires_at)

    def add_batch_items(self, batch: BatchLease, leases: list[Lease]) -> list[str]:
        """Add the runs ``leases`` hold for the batch as its items (each under its epoch, with
        its ``custom_id``); returns the run ids added (a run the batch no longer holds is not)."""
        owner = batch_worker(batch.batch_id)
        if any(lease.worker_id != owner for lease in leases):
            raise LedgerError(f"a batch's items are leases held by {owner}")
        params = {
            **batch.params(),
            "run_ids": [lease.run_id for lease in leases],
            "epochs": [lease.epoch for lease in leases],
            "custom_ids": [custom_id_of(lease.run_id, lease.epoch) for lease in leases],
        }
        return [row[0] for row in self._db.rows("add_batch_items", params)]

    def claim_batch(self, batch_id: str, worker_id: str) -> tuple[BatchLease, dict[str, Any]]:
        """Take the batch's lease to advance it (free, expired or this worker's), extending the
        leases it holds on its pending runs; :class:`LeaseLostError` if another worker holds it
        or it is collected. Returns the lease and the batch's row."""
        rows = self._db.fetch(
            "claim_batch",
            {"batch_id": batch_id, "worker_id": check_worker_id(worker_id)},
            dict_row,
        )
        if not rows:
            raise LeaseLostError()
        row = rows[0]
        return BatchLease(batch_id, worker_id, row["lease_epoch"], row["lease_expires_at"]), row

    def renew_batch(self, batch: BatchLease) -> int:
        """Extend the batch's lease and the leases of its pending runs; returns how many runs
        it still holds. :class:`LeaseLostError` once another worker took the batch."""
        rows = self._db.rows("renew_batch", batch.params())
        if not rows:
            raise LeaseLostError()
        return int(rows[0][2])

    def start_submit(self, batch: BatchLease) -> datetime | None:
        """Mark, and commit, that the create call is about to be made. Returns when an earlier
        start was marked (a create that may have reached the provider: look it up there before
        creating again), ``None`` on the first. :class:`LeaseLostError` when the batch is not
        an unsubmitted intent under this lease."""
        rows = self._db.rows("start_submit", batch.params())
        if not rows:
            raise LeaseLostError()
        earlier: datetime | None = rows[0][0]
        return earlier

    def record_submitted(self, batch: BatchLease, provider_batch_id: str, how: str) -> bool:
        """Record the provider's batch id for the intent; ``False`` when one is recorded already
        (or the lease was lost)."""
        params = {
            **batch.params(),
            "provider_batch_id": check_name("provider_batch_id", provider_batch_id),
            "how": how,
        }
        return bool(self._db.rows("record_submitted", params))

    def record_duplicate(
        self, batch: BatchLease, provider_batch_id: str, how: str, *, cancelled: bool
    ) -> None:
        """Record a second provider batch found for the intent (and whether it was cancelled)."""
        params = {
            **batch.params(),
            "provider_batch_id": check_name("provider_batch_id", provider_batch_id),
            "how": how,
            "cancelled": cancelled,
        }
        self._db.rows("record_duplicate", params)

    def record_batch_status(
        self, batch: BatchLease, state: str, status: dict[str, Any], error: str | None = None
    ) -> str:
        """Record what the provider says of the batch; returns the batch's state (an ended state
        stays once reached). :class:`LeaseLostError` once another worker took the batch."""
        if state not in BATCH_STATES:
            raise LedgerError(f"no batch state {state!r}")
        params = {**batch.params(), "state": state, "status": json.dumps(status), "error": error}
        rows = self._db.rows("record_batch_status", params)
        if not rows:
            raise LeaseLostError()
        return str(rows[0][0])

    def fail_batch_intent(self, batch: BatchLease, error: str, state: str = "failed") -> None:
        """End an intent that will not be submitted (its items released by the caller):
        ``failed``, or ``cancelled`` by an operator."""
        params = {**batch.params(), "error": error[:2000], "state": state}
        self._db.rows("fail_batch_intent", params)

    def batch_cancel_sent(self, batch: BatchLease) -> None:
        """Record that the provider was asked to cancel the batch."""
        self._db.rows("batch_cancel_sent", batch.params())

    def batch_items(self, batch_id: str, *, pending_only: bool = False) -> list[BatchItem]:
        """The batch's items with their runs' checkpoints."""
        rows = self._db.fetch(
            "batch_items", {"batch_id": batch_id, "pending_only": pending_only}, dict_row
        )
        return [
            BatchItem(
                batch_id=batch_id,
                run_id=row["run_id"],
                epoch=row["lease_epoch"],
                custom_id=row["custom_id"],
                state=row["state"],
                raw_input=row["raw_input"],
                revision=row["revision"],
                input_fingerprint=row["input_fingerprint"],
                identity=RunIdentity(
                    row["job_name"], row["subject_id"], row["scheduled_at"], row["version"]
                ),
            )
            for row in rows
        ]

    def end_batch_item(
        self, batch: BatchLease, run_id: str, state: str, error: str | None = None
    ) -> bool:
        """Mark a pending item taken as ``state``; ``False`` if it was taken before."""
        if state not in ITEM_STATES or state == "pending":
            raise LedgerError(f"no ended item state {state!r}")
        params = {**batch.params(), "run_id": run_id, "state": state, "error": error}
        return bool(self._db.rows("end_batch_item", params))

    def batch_item_paid(self, item: BatchItem) -> bool:
        """Whether the item's call is recorded already (a collection that crashed after it)."""
        params = {
            "run_id": item.run_id,
            "lease_epoch": item.epoch,
            "item_worker": batch_worker(item.batch_id),
        }
        return bool(self._db.rows("batch_item_paid", params)[0][0])

    def recorded_provider_batches(self, provider_batch_ids: list[str]) -> list[str]:
        """Which of these provider batches a batch of the ledger has recorded already."""
        rows = self._db.rows("recorded_provider_batches", {"ids": provider_batch_ids})
        return [row[0] for row in rows]

    def give_back_strays(self, batch: BatchLease) -> tuple[int, int]:
        """Give back what the batch claimed and never made an item (an opener that died or lost
        the batch between its claims and its items): their budget holds and their runs.
        Returns (holds released, runs released)."""
        [(holds, runs)] = self._db.rows("give_back_strays", batch.params())
        return int(holds), int(runs)

    def discard_batch_intent(self, batch: BatchLease) -> bool:
        """Forget an intent that claimed nothing: no batch is recorded. ``False`` when it has
        items or holds (or the lease was lost): it must end as a batch does."""
        return bool(self._db.rows("discard_batch_intent", batch.params()))

    def end_batch_step(self, batch: BatchLease, error: str | None) -> int:
        """Record how the batch's step ended (``error``: it failed); returns how many steps
        have failed in a row (0 after one that ended well)."""
        params = {**batch.params(), "error": None if error is None else error[:2000]}
        rows = self._db.rows("end_batch_step", params)
        return int(rows[0][0]) if rows else 0

    def release_batch(self, batch: BatchLease) -> bool:
        """Give the batch's lease back, so another process (the lane's sensor) advances it at
        once; the leases it holds on its runs stay, until their expiry."""
        return bool(self._db.rows("release_batch", batch.params()))

    def finish_batch(self, batch: BatchLease) -> bool:
        """Mark the batch collected once no item is pending; returns whether it was."""
        return bool(self._db.rows("finish_batch", batch.params()))

    def batch_row(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's row, with its items counted by state (``item_states``)."""
        rows = self._db.fetch("get_batch", {"batch_id": batch_id}, dict_row)
        return rows[0] if rows else None

    def last_collected(self, job_names: list[str]) -> datetime | None:
        """When the newest collected batch of ``job_names`` was collected (``None``: none)."""
        found: datetime | None = self._db.rows("last_collected", {"job_names": job_names})[0][0]
        return found

    def collected_runs(self, job_names: list[str], since: datetime) -> list[CollectedRun]:
        """The items of the batches collected after ``since``, oldest batch first, each with
        what became of it."""
        params = {"job_names": job_names, "since": since}
        return [CollectedRun(*row) for row in self._db.rows("collected_runs", params)]

    def open_batches(self, job_names: list[str] | None = None) -> list[str]:
        """The ids of the batches not yet collected (of ``job_names``, or all), oldest first."""
        return [row[0] for row in self._db.rows("open_batches", {"job_names": job_names})]

    def batches(
        self,
        *,
        batch_id: str | None = None,
        job_name: str | None = None,
        state: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Batches of the batch lane, newest first, with their items by state and their money
        (at the price in force for each call; ``unpriced`` calls make it a floor)."""
        params = {"batch_id": batch_id, "job_name": job_name, "state": state, "limit": limit}
        return self._db.fetch("list_batches", params, dict_row)

    def batch_id_of(self, prefix: str) -> str:
        """The batch whose id starts with ``prefix`` (as ``batches list`` shows ids, from 4 hex
        digits); :class:`InvalidInputError` naming ``batch_id`` when none does, or several."""
        text = prefix.strip().lower()
        if not 4 <= len(text) <= 32 or any(c not in "0123456789abcdef" for c in text):
            raise InvalidInputError(
                "batch_id", f"{prefix!r} is not a batch id (4 to 32 hex digits)"
            )
        found = [row[0] for row in self._db.rows("batch_ids_like", {"prefix": text})]
        if not found:
            raise InvalidInputError("batch_id", f"no batch {prefix!r}")
        if len(found) > 1:
            raise InvalidInputError(
                "batch_id", f"{prefix!r} starts {len(found)} batch ids: give more of it"
            )
        return str(found[0])

    def batch_runs(self, batch_id: str) -> list[dict[str, Any]]:
        """A batch's runs: each item's run, subject, state, error and recorded call."""
        return self._db.fetch("batch_runs", {"batch_id": batch_id}, dict_row)

    def cancel_batch(self, batch_id: str, requested_by: str | None = None) -> dict[str, Any]:
        """Ask for the batch to be cancelled: its lane cancels it at the provider at its next
        step, accepts what was answered and releases the rest (their runs go online or into
        another batch). :class:`InvalidInputError` naming ``batch_id`` when there is no such
        batch or it has ended."""
        rows = self._db.fetch(
            "request_batch_cancel",
            {"batch_id": batch_id, "requested_by": requested_by},
            dict_row,
        )
        if not rows:
            raise InvalidInputError("batch_id", f"no open batch {batch_id!r} to cancel")
        return rows[0]
