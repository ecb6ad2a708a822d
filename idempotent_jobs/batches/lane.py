"""The batch lane: many logical runs computed by one provider batch, each submitted once and
accepted once.

:func:`open_intent` claims the runs for a new batch (owner ``batch:<id>``), checkpoints their
inputs as online, holds their worst case under the job's budgets (at the batch tier) and commits
the intent before any provider is called. :func:`advance` then moves the batch on, one step per
call, under the batch's own lease (a sensor tick, a CLI command; any process may, after a crash):

- an intent is **submitted once**. ``submit_started_at`` is committed before the create call;
  an intent that has one and no provider id may have been created, so the provider is searched
  first (:meth:`~idempotent_jobs.models.batches.BatchProvider.find_batches`), the batch found is
  adopted, and any second one is cancelled and recorded as a duplicate. A create the provider
  refuses (a 4xx: too many requests, a bad request) made nothing: the intent fails and its
  runs are given back with the reason;
- a submitted batch is polled and its state recorded;
- an ended batch is **collected** item by item through the fenced commit (``complete``): an
  answer accepted only while the run is still the batch's, on the same basis; a run revised,
  completed or taken meanwhile keeps its result and the item is recorded as a paid call, not
  accepted; a per-item error or an answer outside the schema ends that run's attempt as
  failed (with its cost), never the batch. Items without a result (expired, cancelled) are
  released: their runs can go online or into a new batch.

Every step can be cut at any point and run again: each write is fenced by the batch's epoch and
each item's commit by the run's; a collected item is not taken twice.
"""

from typing import Any

from idempotent_jobs.batches.collection import collect, release_pending, request_texts
from idempotent_jobs.batches.job import BatchProgress, BatchSteps
from idempotent_jobs.batches.opening import open_intent
from idempotent_jobs.batches.search import refused, search_provider
from idempotent_jobs.core.batch_book import ENDED_STATES, BatchItem, BatchLease
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import LeaseLostError, LedgerError, mark_unsent
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.steps import end_attempt
from idempotent_jobs.models.answers import redact_echoes
from idempotent_jobs.models.batches import BatchProvider
from idempotent_jobs.models.errors import ProviderError

__all__ = ["BatchProgress", "BatchSteps", "advance", "open_intent", "progress"]


def advance(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    batch_id: str,
    *,
    worker_id: str,
    hand_back: bool = False,
) -> BatchProgress:
    """Move the batch one step on (submit an intent; poll a submitted batch; collect an ended
    one) under its lease, and say where it stands. :class:`LeaseLostError` while another
    worker advances it. ``hand_back``: give the batch's lease back after the step, so another
    process (the lane's sensor) takes the next one at once."""
    batch, row = ledger.claim_batch(batch_id, worker_id)
    try:
        duplicates = _step(ledger, steps, provider, batch, row)
        if row.get("failed_steps"):  # a step that ended well ends the run of failures
            ledger.end_batch_step(batch, None)
    except Exception as exc:
        if not isinstance(exc, LeaseLostError):
            _count_failed_step(ledger, batch, exc)
        raise
    finally:
        if hand_back:
            ledger.release_batch(batch)
    return progress(ledger, batch_id, duplicates)


def _count_failed_step(ledger: RunLedger, batch: BatchLease, exc: Exception) -> None:
    """Count the step's failure on the batch (with its error): a batch failing step after
    step is a problem ``doctor`` reports and its sensor's tick shows."""
    try:
        ledger.end_batch_step(batch, describe_error(exc))
    except Exception:  # noqa: BLE001 - the ledger out of reach: the step's error is raised
        pass


def _step(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    batch: BatchLease,
    row: dict[str, Any],
) -> int:
    state = str(row["state"])
    duplicates = 0
    cancelling = row["cancel_requested_at"] is not None
    if state == "intent" and cancelling:
        adopted: bool | None = False
        if row["submit_started_at"] is not None:
            # A create may have reached the provider: adopt what it made, to cancel it there
            # at the next step as a submitted batch's (a batch that may be it and still runs
            # is waited for: it is never cancelled before it is proven this intent's).
            items = ledger.batch_items(batch.batch_id, pending_only=True)
            started = row["submit_started_at"]
            adopted, duplicates = search_provider(ledger, provider, batch, started, items)
        if adopted is False:  # never sent: nothing to cancel at the provider
            _end_unsent(
                ledger,
                batch,
                "cancelled by an operator",
                "the batch was cancelled before it was submitted",
                "cancelled",
            )
    elif state == "intent":
        duplicates = _submit(ledger, steps, provider, batch)
    elif state == "submitted" and cancelling and row["cancel_sent_at"] is None:
        _cancel(ledger, steps, provider, batch, str(row["provider_batch_id"]))
    elif state == "submitted":
        found = provider.retrieve_batch(str(row["provider_batch_id"]))
        state = ledger.record_batch_status(batch, found.state, found.status, found.error)
        if state in ENDED_STATES:
            collect(ledger, steps, provider, batch, found, resumed=False)
    elif state in ENDED_STATES and row["provider_batch_id"] is None:
        # Never sent, and ended by a step cut short: what it still holds is given back.
        _end_unsent(ledger, batch, str(row["error"]), f"the intent {state}: {row['error']}")
    elif state in ENDED_STATES:  # a collection begun by an earlier step, perhaps cut short
        found = provider.retrieve_batch(str(row["provider_batch_id"]))
        collect(ledger, steps, provider, batch, found, resumed=True)
    return duplicates


def _cancel(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    batch: BatchLease,
    provider_batch_id: str,
) -> None:
    """An operator's cancel of a submitted batch, sent to the provider once. A cancel the
    provider refuses (a 4xx: the batch has ended already, or it will not cancel it) ends the
    batch in the ledger all the same: what the provider answered is collected, the rest given
    back."""
    try:
        found = provider.cancel_batch(provider_batch_id)
    except ProviderError as exc:
        if not refused(exc):
            raise  # may pass: the next step sends it again
        ledger.batch_cancel_sent(batch)
        found = provider.retrieve_batch(provider_batch_id)
        if found.state in ENDED_STATES:
            ledger.record_batch_status(batch, found.state, found.status, found.error)
            collect(ledger, steps, provider, batch, found, resumed=False)
            return
        # Still running there, and not to be cancelled: ended here, its runs given back (an
        # answer it makes later is never taken: the lane does not poll it again).
        why = f"the provider refused to cancel it: {exc}"[:2000]
        ledger.record_batch_status(batch, "cancelled", found.status, why)
        release_pending(ledger, batch, why)
        ledger.finish_batch(batch)
        return
    ledger.batch_cancel_sent(batch)
    ledger.record_batch_status(batch, found.state, found.status, found.error)


def progress(ledger: RunLedger, batch_id: str, duplicates: int = 0) -> BatchProgress:
    row = ledger.batch_row(batch_id)
    if row is None:
        raise LedgerError(f"no batch {batch_id}")
    return BatchProgress(
        batch_id=batch_id,
        state=str(row["state"]),
        provider_batch_id=row["provider_batch_id"],
        items=dict(row["item_states"] or {}),
        duplicates=duplicates,
        money=row["money"],
        currency=row["currency"],
        unpriced=int(row["unpriced"] or 0),
        failed_steps=int(row.get("failed_steps") or 0),
        last_step_error=row.get("last_step_error"),
    )


def _submit(
    ledger: RunLedger, steps: BatchSteps, provider: BatchProvider, batch: BatchLease
) -> int:
    """Submit the intent once; returns how many duplicates were found (and cancelled)."""
    items = ledger.batch_items(batch.batch_id, pending_only=True)
    if not items:  # its opener died before adding them: what it claimed and held goes back
        why = "its opener ended before its runs were added"
        _end_unsent(ledger, batch, why, why)
        return 0
    earlier = ledger.start_submit(batch)  # committed before the provider is called
    if earlier is not None:
        adopted, duplicates = search_provider(ledger, provider, batch, earlier, items)
        if adopted is None:  # a batch that may be this intent's still runs: wait for it
            return 0
        if adopted:
            return duplicates
    lines, sent = [], []
    for item in items:
        try:
            prompt = steps.prompt(item.raw_input or {}, item.identity)
            lines.append(provider.batch_line(item.custom_id, prompt, steps.schema))
            sent.append((prompt, item.raw_input or {}))
        except Exception as exc:  # noqa: BLE001 - that run's attempt ends; the batch goes on
            _end_item(ledger, batch, item, exc)
    if not lines:
        why = "no request of the batch could be built"
        _end_unsent(ledger, batch, why, why)
        return 0
    try:
        made = provider.create_batch(lines, batch.batch_id)
    except ProviderError as exc:
        # A refusal may quote a request: its prompt and checkpoint are looked for (only now).
        texts = [text for prompt, raw in sent for text in request_texts(raw, prompt)]
        redact_echoes(exc, getattr(provider, "api_key", None), texts)
        if not refused(exc):
            raise  # it may have been made: the next step searches for it first
        # Refused (too many requests, a bad request): the provider made nothing, and the same
        # intent would be refused again. It fails, and its runs are given back with the reason.
        why = f"the provider refused the batch: {exc}"
        _end_unsent(ledger, batch, why, why)
        return 0
    if not ledger.record_submitted(batch, made.provider_batch_id, "created"):
        # Another worker recorded one meanwhile (this lease was lost): this one is a duplicate.
        provider.cancel_batch(made.provider_batch_id)
        raise LeaseLostError()
    return 0


def _end_item(ledger: RunLedger, batch: BatchLease, item: BatchItem, exc: Exception) -> None:
    """End a pending item whose request was never sent: its run's attempt fails with ``exc``
    (no call), its hold is given back."""
    mark_unsent(exc)
    ledger.release_budget(item.lease)
    end_attempt(ledger, item.lease, exc)
    ledger.end_batch_item(batch, item.run_id, "failed", describe_error(exc)[:2000])


def _end_unsent(
    ledger: RunLedger, batch: BatchLease, error: str, why: str, state: str = "failed"
) -> None:
    """End an intent the provider never took (``error`` on the batch, ``state`` ``failed`` or
    ``cancelled``), give its runs back (``why`` on each) and mark it collected."""
    ledger.fail_batch_intent(batch, error, state)  # no-op once the intent has ended
    release_pending(ledger, batch, why)
    ledger.give_back_strays(batch)
    ledger.finish_batch(batch)
