"""A new run's raw-input checkpoint sent beside its model call (:func:`run_idempotent`): two
round trips on a new run's critical path, the claim and the commit, instead of three.

``collect()`` runs and its value is checked and serialised (a value the ledger refuses ends the
attempt before anything is sent); the checkpoint statement then goes to the database on a
thread of the ledger's own while the model call starts on the value as it will be stored.
Nothing on the way to an answer waits for it:

- the commit confirms it (``complete``'s ``raw_input``, ``sql/attempts.sql``): an answer is
  accepted only on the stored checkpoint, or on this one, which the commit stores itself when
  it has not landed yet (only this lease could have written it);
- a failure waits for it before its attempt ends
  (:func:`~idempotent_jobs.core.steps.end_attempt`), so a retry finds the checkpoint as it
  would after an awaited one;
- a crash before the commit leaves it stored or not, as a crash just before or just after an
  awaited checkpoint would: the next claim reuses it or collects again, and the commit refuses
  an answer computed on any other input.

A budget's hold for the call does not ride on it: the claim reserved it (``begin``'s ``hold``).
A ledger whose pool has a single connection awaits its checkpoint (the commit could not go
out beside it), as every Dagster step does (the next op reads it).
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.json_values import read_json
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease
from idempotent_jobs.core.steps import collect_once, end_attempt, lease_attributes, release_hold

JSONDict = dict[str, Any]


@dataclass(eq=False)
class PendingCheckpoint:
    """A checkpoint sent and not awaited: its canonical text and fingerprint (what the commit
    confirms) and the statement's future."""

    text: str
    fingerprint: str
    future: "Future[Lease]"

    def wait(self) -> bool:
        """Wait for the statement to end; whether it stored the checkpoint (or found it
        stored). Never raises: a lost lease or an outage is for the caller's next statement to
        meet and report."""
        try:
            self.future.result()
        except BaseException:
            return False
        return True


def _sender(ledger: RunLedger) -> ThreadPoolExecutor:
    """The ledger's threads that send checkpoints (as many as its pool has connections)."""
    size = ledger.settings.pool_max_size
    return ledger.process_local(
        "checkpoint_sender",
        lambda: ThreadPoolExecutor(max_workers=size, thread_name_prefix="ij-checkpoint"),
    )


def collect_beside_call(ledger: RunLedger, lease: Lease, collect: Callable[[], JSONDict]) -> Lease:
    """The lease with the run's checkpoint, as :func:`collect_once` gives it, but a new one is
    sent and not awaited: the returned lease carries the value as it will be stored and its
    fingerprint (the answer's basis), and the :class:`PendingCheckpoint` the commit confirms.
    A failure of ``collect()`` or of its value ends the attempt and propagates."""
    if lease.stored_raw_input is not None or ledger.settings.pool_max_size < 2:
        return collect_once(ledger, lease, collect)
    with telemetry.span("idempotent_jobs.collect", lease_attributes(lease)):
        try:
            payload = ledger.raw_input_payload(collect())
        except BaseException as exc:
            end_attempt(ledger, lease, exc)
            release_hold(ledger, lease)
            raise
        future = _sender(ledger).submit(ledger.checkpoint, lease, payload.value, payload=payload)
    return replace(
        lease,
        stored_raw_input=read_json(payload.text),
        input_fingerprint=payload.fingerprint,
        pending_checkpoint=PendingCheckpoint(payload.text, payload.fingerprint, future),
    )


__all__ = ["PendingCheckpoint", "collect_beside_call"]
