"""Collecting an ended batch item by item through the attempt engine
(:func:`~idempotent_jobs.core.commits.accept_paid_answer`), as an online answer is taken: one bad
item ends its own attempt only; items with no result are given back. Bounded per step."""

import json
from collections.abc import Mapping
from typing import Any

from idempotent_jobs.batches.job import BatchSteps
from idempotent_jobs.core.batch_book import BatchItem, BatchLease
from idempotent_jobs.core.commits import accept_paid_answer
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    StaleCandidateError,
)
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import CallOrigin, Lease
from idempotent_jobs.core.steps import end_attempt
from idempotent_jobs.models.answers import prompt_texts, redact_echoes
from idempotent_jobs.models.batches import BatchProvider, ItemResult, ProviderBatch
from idempotent_jobs.models.prompts import Prompt

#: Renew the batch's lease every this many items while collecting.
RENEW_EVERY_ITEMS = 200
#: The most items one step collects (a sensor tick stays bounded; the next takes up the rest).
COLLECT_PER_STEP = 5000


class NoBatchResult(LedgerError):
    """A run's batch ended with no result for it (expired, cancelled, failed): its attempt ends
    failed with this error, and the run can go online or into a new batch."""


def give_back(
    ledger: RunLedger, batch: BatchLease, run_id: str, lease: Lease, error: str | None = None
) -> None:
    """Give back a run the batch holds and what it holds of the budgets; end its item. With
    ``error`` (no result came) the attempt ends failed with it; without (the batch was never
    submitted) it ends untouched."""
    ledger.release_budget(lease)
    if error is not None:
        end_attempt(ledger, lease, NoBatchResult(error))  # never raises; a lost lease: no write
    else:
        try:
            ledger.release(lease)
        except LeaseLostError:
            pass  # taken meanwhile: nothing of the batch's is left on it
    ledger.end_batch_item(batch, run_id, "released", error)


def collect(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    batch: BatchLease,
    found: ProviderBatch,
    *,
    resumed: bool,
) -> None:
    """Take the results of the ended batch (at most :data:`COLLECT_PER_STEP` items a step:
    the next step takes up the rest), then release what has none; mark it collected.
    ``resumed``: an earlier step may have taken some items and died before marking them, so
    each answered item is first looked up among the recorded calls."""
    pending = {item.custom_id: item for item in ledger.batch_items(batch.batch_id)}
    taken = 0
    for result in provider.batch_results(found):
        item = pending.get(result.custom_id)
        if item is None or item.state != "pending":
            continue  # not this batch's, or taken before a crash
        if taken == COLLECT_PER_STEP:
            return  # bounded: the next step goes on from here
        _take(ledger, steps, provider, batch, item, result, resumed)
        taken += 1
        if taken % RENEW_EVERY_ITEMS == 0:
            ledger.renew_batch(batch)
    release_pending(ledger, batch, f"no result: the batch {found.state}")
    ledger.finish_batch(batch)


def release_pending(ledger: RunLedger, batch: BatchLease, why: str) -> None:
    for item in ledger.batch_items(batch.batch_id, pending_only=True):
        give_back(ledger, batch, item.run_id, item.lease, why)


def _take(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    batch: BatchLease,
    item: BatchItem,
    result: ItemResult,
    resumed: bool,
) -> None:
    """Take one item's result through the attempt engine, as an online answer is taken; end the
    item as what became of it. Whatever fails of this item (its answer, the validator, its
    payload, the ledger's refusal of its output) ends this item's attempt only: the batch goes
    on. A ledger out of reach propagates (the item stays pending, taken up at the next step)."""
    lease = item.lease
    if result.missing:
        give_back(ledger, batch, item.run_id, lease, "no result: expired or cancelled")
        return
    if resumed and ledger.batch_item_paid(item):  # recorded before a crash: only its mark left
        ledger.end_batch_item(batch, item.run_id, _after_crash(ledger, item))
        return
    if result.error is not None:  # its text is recorded: not what the request carried
        redact_echoes(result.error, getattr(provider, "api_key", None), _sent(steps, item))
    notifications = steps.notifications

    def payload(output: dict[str, Any]) -> Mapping[str, dict[str, Any]]:
        assert notifications is not None
        return notifications(item.identity, output)

    try:
        done = accept_paid_answer(
            ledger,
            lease,
            lambda: provider.item_answer(result, steps.schema),
            basis=item.basis,
            config=steps.config,
            origin=CallOrigin(),
            validate=steps.validate,
            notifications=payload if notifications is not None else None,
        )
    except (StaleCandidateError, LeaseLostError) as moved:
        ledger.end_batch_item(batch, item.run_id, "not_accepted", describe_error(moved)[:2000])
        return
    except LedgerConnectionError:
        raise
    except Exception as exc:  # noqa: BLE001 - this item's failure, ended; the batch goes on
        ledger.end_batch_item(batch, item.run_id, "failed", describe_error(exc)[:2000])
        return
    ledger.end_batch_item(batch, item.run_id, "accepted" if done.accepted else "not_accepted")


def _sent(steps: BatchSteps, item: BatchItem) -> list[str]:
    """What the item's request carried, as far as it can be known again: its prompt built
    again from its checkpoint, and the checkpoint (a prompt builder that fails now leaves the
    checkpoint's strings)."""
    raw = item.raw_input or {}
    try:
        prompt: Prompt | None = steps.prompt(raw, item.identity)
    except Exception:  # noqa: BLE001 - the checkpoint's strings are still looked for
        prompt = None
    return request_texts(raw, prompt)


def request_texts(raw: dict[str, Any], prompt: Prompt | None) -> list[str]:
    """The texts to keep out of an error about a request built from ``raw`` (a checkpoint) as
    ``prompt``: the prompt's, and the checkpoint as JSON (its strings are looked for)."""
    return [json.dumps(raw, ensure_ascii=False), *(prompt_texts(prompt) if prompt else ())]


def _after_crash(ledger: RunLedger, item: BatchItem) -> str:
    """The state of an item whose call was recorded before the collection was cut."""
    record = ledger.get(item.run_id)
    if record is not None and record.status == "completed":
        return "accepted" if record.lease_epoch == item.epoch else "not_accepted"
    return "failed"
