"""A provider batch as a ledger object (migration 0019): the records it is read as, its states and
its ids. The lane that drives a batch is :mod:`idempotent_jobs.batches`; its writes, each fenced
by the batch's own lease, are the batches store's (:mod:`idempotent_jobs.core.stores.batches`).

A batch holds its runs as ordinary leases whose owner is ``batch:<batch_id>`` (an online
worker meets them as busy, held by the batch, and steps aside). The batch's lease is held by the
process advancing it (a sensor tick, a CLI command) and fenced by its epoch: renewing it renews
the leases of its pending runs in the same statement. Each item's request carries a
``custom_id`` derived from the run id and the epoch the batch holds it under
(:func:`custom_id_of`), so a result names exactly one lease.
"""

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

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
