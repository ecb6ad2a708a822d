"""A provider batch as a ledger object (migration 0019): part of
:class:`~idempotent_jobs.core.ledger.RunLedger` (a mixin of its worker face). The lane that
drives a batch is :mod:`idempotent_jobs.batches`; this module holds its writes, each fenced by
the batch's own lease.

A batch holds its runs as ordinary leases whose owner is ``batch:<batch_id>`` (an online
worker meets them as busy, held by the batch, and steps aside). The batch's lease is held by the
process advancing it (a sensor tick, a CLI command) and fenced by its epoch: renewing it renews
the leases of its pending runs in the same statement. Each item's request carries a
``custom_id`` derived from the run id and the epoch the batch holds it under
(:func:`custom_id_of`), so a result names exactly one lease.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import dict_row

from idempotent_jobs.core.checks import check_lease_seconds, check_name, check_worker_id
from idempotent_jobs.core.errors import LeaseLostError, LedgerError
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.records import Basis, Lease

#: A batch's states, from intent to collected (see migration 0019).
BATCH_STATES = ("intent", "submitted", "completed", "expired", "failed", "cancelled", "collected")
#: States in which the provider has ended the batch: its results (if any) can be collected.
ENDED_STATES = frozenset({"completed", "expired", "failed", "cancelled"})
#: What a batch item ends as.
ITEM_STATES = ("pending", "accepted", "not_accepted", "failed", "released")


def batch_worker(batch_id: str) -> str:
    """The lease owner of a batch's runs (and the worker id their calls are recorded under)."""
    return f"batch:{batch_id}"


def batch_holding(lease_owner: str | None) -> str | None:
    """The batch id of a lease owner that is a batch (``batch:<id>``), else ``None``."""
    if lease_owner is not None and lease_owner.startswith("batch:"):
        return lease_owner.removeprefix("batch:")
    return None


def custom_id_of(run_id: str, epoch: int) -> str:
    """The ``custom_id`` of a run's request in a batch: derived from its run id and the lease
    epoch the batch holds it under, within both providers' rule (``[A-Za-z0-9_-]{1,64}``)."""
    digest = hashlib.sha256(f"{run_id}:{epoch}".encode()).hexdigest()[:40]
    return f"ij-{digest}-{epoch}"


def new_batch_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BatchLease:
    """This worker's lease on a batch: every write to the batch names the owner and the epoch."""

    batch_id: str
    worker_id: str
    epoch: int
    expires_at: datetime | None = None

    def params(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "worker_id": self.worker_id, "epoch": self.epoch}


@dataclass(frozen=True)
class BatchItem:
    """One run of a batch: the lease the batch holds on it, its request's ``custom_id``, what
    became of it, and the checkpoint its request is built from."""

    batch_id: str
    run_id: str
    epoch: int
    custom_id: str
    state: str
    raw_input: dict[str, Any] | None
    revision: int
    input_fingerprint: str | None
    identity: RunIdentity

    @property
    def lease(self) -> Lease:
        """The run's lease as the batch holds it: what the item's commit is fenced by."""
        return Lease(
            run_id=self.run_id,
            worker_id=batch_worker(self.batch_id),
            epoch=self.epoch,
            expires_at=None,
            lease_seconds=60.0,
            stored_raw_input=self.raw_input,
            revision=self.revision,
            input_fingerprint=self.input_fingerprint,
        )

    @property
    def basis(self) -> Basis:
        return Basis(revision=self.revision, input_fingerprint=self.input_fingerprint)


class CollectedRun(NamedTuple):
    """An item of a collected batch: its batch, when that was collected, its run's subject and
    window start, and what became of it (``accepted``, ``failed``...)."""

    batch_id: str
    collected_at: datetime
    subject_id: str
    scheduled_at: datetime
    state: str


class BatchBook(LedgerFace):
    """The batch lane's writes and reads, for the worker face."""

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
