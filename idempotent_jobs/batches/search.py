"""Finding, after a create whose answer was lost, the provider batch an intent made, and only
that one: by the intent in its metadata (OpenAI), or by its results' ``custom_id``s once it has
ended (Anthropic, whose batches carry none). Another team's batch is never touched."""

from datetime import datetime

from idempotent_jobs.core.batch_book import ENDED_STATES, BatchItem, BatchLease
from idempotent_jobs.core.errors import LeaseLostError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.models.batches import BatchProvider, ProviderBatch
from idempotent_jobs.models.errors import ProviderError


def refused(exc: ProviderError) -> bool:
    """Whether a create's error says the provider made no batch and never will for the same
    request: a 4xx answer, except a timeout, a conflict and a rate limit (408, 409, 429)."""
    return exc.status is not None and 400 <= exc.status < 500 and exc.status not in (408, 409, 429)


def search_provider(
    ledger: RunLedger,
    provider: BatchProvider,
    batch: BatchLease,
    since: datetime,
    items: list[BatchItem],
) -> tuple[bool | None, int]:
    """After a create that may have reached the provider: adopt the batch it made (the oldest
    found), and record any second one as a duplicate. Returns (adopted, duplicates); adopted
    ``None`` while a batch that may be this intent's still runs (nothing is created meanwhile).

    Only a batch proven this intent's is adopted or cancelled: by the intent in its metadata
    (OpenAI), or, where the provider keeps none (Anthropic), by its results once it has ended:
    every ``custom_id`` in them is one of this intent's items (each names a run and the lease
    epoch this batch holds it under, which no other batch does). Another team's batch of the
    same size is never touched; until it ends, the intent waits."""
    found = provider.find_batches(batch.batch_id, since, len(items))
    known = set(ledger.recorded_provider_batches([b.provider_batch_id for b in found]))
    found = [b for b in found if b.provider_batch_id not in known]  # other intents' batches
    if not provider.marks_batches:
        found = [_polled(provider, b) for b in found]
        if any(b.state not in ENDED_STATES for b in found):
            return None, 0
        ours = {item.custom_id for item in items}
        found = [b for b in found if _results_are(provider, b, ours)]
    if not found:
        return False, 0
    first, *others = found
    how = "found at the provider after a create whose answer was lost"
    if not ledger.record_submitted(batch, first.provider_batch_id, how):
        raise LeaseLostError()
    for duplicate in others:  # proven this intent's too: a second create that went through
        cancelled = (
            cancel_quietly(provider, duplicate.provider_batch_id)
            if duplicate.state not in ENDED_STATES
            else False
        )
        ledger.record_duplicate(
            batch, duplicate.provider_batch_id, "a second batch for one intent", cancelled=cancelled
        )
    return True, len(others)


def _polled(provider: BatchProvider, found: ProviderBatch) -> ProviderBatch:
    """A listed batch as it stands now (a running one is read again)."""
    if found.state in ENDED_STATES:
        return found
    return provider.retrieve_batch(found.provider_batch_id)


def _results_are(provider: BatchProvider, found: ProviderBatch, ours: set[str]) -> bool:
    """Whether an ended batch's results name only this intent's items (and some)."""
    named = {result.custom_id for result in provider.batch_results(found)}
    return bool(named) and named <= ours


def cancel_quietly(provider: BatchProvider, provider_batch_id: str) -> bool:
    try:
        provider.cancel_batch(provider_batch_id)
    except Exception:  # noqa: BLE001 - recorded as not cancelled; its results are never used
        return False
    return True
