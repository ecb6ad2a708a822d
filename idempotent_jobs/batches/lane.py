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

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from idempotent_jobs.core.batch_book import ENDED_STATES, BatchItem, BatchLease, batch_worker
from idempotent_jobs.core.drills import take_drill
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    StaleCandidateError,
    mark_unsent,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import CallOrigin, JobConfig, Lease
from idempotent_jobs.core.steps import accept_paid_answer, collect_once, end_attempt
from idempotent_jobs.models.batches import BatchProvider, ItemResult, ProviderBatch
from idempotent_jobs.models.errors import ProviderError
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema

#: Renew the batch's lease every this many items while collecting.
RENEW_EVERY_ITEMS = 200
#: The most items one step collects (a sensor tick stays bounded; the next takes up the rest).
COLLECT_PER_STEP = 5000


@dataclass(frozen=True)
class BatchSteps:
    """What the lane needs of a job: its identity job name, the collector, the prompt builder
    (raw input and the run's identity -> :class:`Prompt`), the output schema, the validator and
    the payload builder (output and identity -> notifications by channel), as the online job
    has them."""

    job_name: str
    collect: Callable[[RunIdentity], dict[str, Any]]
    prompt: Callable[[dict[str, Any], RunIdentity], Prompt]
    schema: OutputSchema | None = None
    validate: Callable[[dict[str, Any]], object] | None = None
    notifications: Callable[[RunIdentity, dict[str, Any]], Mapping[str, dict[str, Any]]] | None = (
        None
    )
    config: JobConfig = field(default_factory=JobConfig)


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch stands after a step of :func:`advance`."""

    batch_id: str
    state: str
    provider_batch_id: str | None
    items: dict[str, int]
    duplicates: int = 0
    #: The money of the calls recorded so far (``None``: none, or none priced), its currency,
    #: and how many calls no price covers.
    money: Decimal | None = None
    currency: str | None = None
    unpriced: int = 0
    #: How many of its steps failed in a row, and the last one's error.
    failed_steps: int = 0
    last_step_error: str | None = None

    @property
    def collected(self) -> bool:
        return self.state == "collected"


def open_intent(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    identities: Iterable[RunIdentity],
    *,
    worker_id: str,
    lease_seconds: float = 1800.0,
    caller_run_id: str | None = None,
) -> BatchLease | None:
    """A new batch's intent for the runs of ``identities`` it could claim (a run completed or
    held elsewhere is left out), their inputs checkpointed, their requests built and their
    worst case held under the job's budgets; ``None`` when no run was left to compute (no
    batch is recorded then). :class:`BudgetExceededError` when the batch does not fit (nothing
    is held then, and its runs are given back).

    A run whose input, drill or request fails ends its own attempt and is left out, as it would
    online. While it claims, the intent renews its lease (and its claims') every third of
    ``lease_seconds``, so a slow collector never lets the lane's sensor take it over; should
    that happen all the same, its claims are given back and :class:`LeaseLostError` raised.

    It claims at most the provider's ``max_batch_requests`` runs (and ``max_batch_bytes`` of
    requests) and draws no identity after that: given an iterator, a caller opens the next
    batch with what is left."""
    batch = ledger.open_batch(
        steps.job_name,
        provider.name,
        provider.model,
        worker_id,
        lease_seconds,
        caller_run_id=caller_run_id,
    )
    owner = batch_worker(batch.batch_id)
    leases: list[Lease] = []
    identities_of: dict[str, RunIdentity] = {}
    total = largest = 0  # the bytes of the requests claimed, and the largest
    renewed = time.monotonic()
    try:
        for identity in identities:
            if time.monotonic() - renewed > lease_seconds / 3:
                leases = _renew_claims(ledger, batch, leases)
                renewed = time.monotonic()
            _, lease = ledger.begin(identity, owner, lease_seconds)
            if lease is None:
                continue
            claimed = _claimed(ledger, steps, provider, lease, identity)
            if claimed is None:
                continue  # its attempt ended: the batch goes on without it
            lease, size = claimed
            room = provider.max_batch_bytes - _LINE_ROOM - total
            if size > room and leases:  # larger than any before it: it stays out, given back
                _give_back_claims(ledger, [lease])
                break
            leases.append(lease)
            identities_of[lease.run_id] = identity
            total, largest = total + size, max(largest, size)
            if len(leases) >= provider.max_batch_requests or largest > room - size:
                break  # full, or the next request of this size would not fit
    except LeaseLostError:
        _give_back_claims(ledger, leases)
        raise LeaseLostError(
            f"batch {batch.batch_id}: its lease was taken over while its runs were claimed; "
            "they were given back"
        ) from None
    if not leases:
        ledger.discard_batch_intent(batch)
        return None
    # Held before the items make it an intent the lane would submit: a crash in between
    # leaves holds (given back with the empty intent), never an intent without them.
    try:
        _hold_budgets(ledger, steps, provider, leases, identities_of)
    except BudgetExceededError as refused:
        _give_back_claims(ledger, leases, holds=False)
        ledger.fail_batch_intent(batch, f"refused by its budget: {refused}")
        ledger.finish_batch(batch)
        raise
    added = set(ledger.add_batch_items(batch, leases))
    _give_back_claims(ledger, [lease for lease in leases if lease.run_id not in added])
    if not added:
        # Not one item: the batch was taken over (its claims are given back above).
        raise LeaseLostError(
            f"batch {batch.batch_id}: its lease was lost before its runs were added; they were "
            "given back"
        )
    return batch


#: Room kept under a provider's byte limit for the file's framing.
_LINE_ROOM = 1024


def _claimed(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    lease: Lease,
    identity: RunIdentity,
) -> tuple[Lease, int] | None:
    """A claimed run's lease with its checkpoint and its request's size in bytes, once its input
    is collected, the job's failure drill (if armed) did not take it and its request could be
    built; else its attempt is ended (as an online attempt would end) and ``None``."""
    try:
        lease = collect_once(ledger, lease, _collector(steps, identity))
    except Exception:  # noqa: BLE001 - collect_once ended that run's attempt
        return None
    raw_input = lease.stored_raw_input or {}
    try:
        take_drill(ledger, lease, steps.job_name)
        line = provider.batch_line("x" * 64, steps.prompt(raw_input, identity), steps.schema)
    except Exception as exc:  # noqa: BLE001 - this run's attempt ends; the batch goes on
        if isinstance(exc, (LedgerConnectionError, LeaseLostError)):
            raise
        mark_unsent(exc)
        end_attempt(ledger, lease, exc)
        return None
    return lease, len(json.dumps(line).encode()) + 1


def _renew_claims(ledger: RunLedger, batch: BatchLease, leases: list[Lease]) -> list[Lease]:
    """Renew the batch's lease (:class:`LeaseLostError` once taken over) and each claim's; a
    claim taken meanwhile is dropped."""
    ledger.renew_batch(batch)
    kept = []
    for lease in leases:
        try:
            ledger.renew(lease)
        except LeaseLostError:
            continue
        kept.append(lease)
    return kept


def _give_back_claims(ledger: RunLedger, leases: list[Lease], *, holds: bool = True) -> None:
    """Give back runs claimed for the batch and never made its items (and their holds)."""
    for lease in leases:
        if holds:
            ledger.release_budget(lease)
        try:
            ledger.release(lease)
        except LeaseLostError:
            pass  # taken meanwhile: nothing of the batch's is left on it


def _collector(steps: BatchSteps, identity: RunIdentity) -> Callable[[], dict[str, Any]]:
    return lambda: steps.collect(identity)


def _hold_budgets(
    ledger: RunLedger,
    steps: BatchSteps,
    provider: BatchProvider,
    leases: list[Lease],
    identities: dict[str, RunIdentity],
) -> None:
    """Hold every item's worst case at the batch tier; all or none."""
    held: list[Lease] = []
    try:
        for lease in leases:
            if lease.budgeted is False:
                continue
            prompt = steps.prompt(lease.stored_raw_input or {}, identities[lease.run_id])
            most_in, most_out = provider.worst_case(prompt, steps.schema)
            ledger.reserve_budget(
                lease,
                max_input_tokens=most_in,
                max_output_tokens=most_out,
                requested_model=provider.model,
                tier="batch",
            )
            held.append(lease)
    except BaseException:
        for lease in held:
            ledger.release_budget(lease)
        raise


class NoBatchResult(LedgerError):
    """A run's batch ended with no result for it (expired, cancelled, failed): its attempt ends
    failed with this error, and the run can go online or into a new batch."""


def _give_back(
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
            adopted, duplicates = _search(ledger, provider, batch, started, items)
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
            _collect(ledger, steps, provider, batch, found, resumed=False)
    elif state in ENDED_STATES and row["provider_batch_id"] is None:
        # Never sent, and ended by a step cut short: what it still holds is given back.
        _end_unsent(ledger, batch, str(row["error"]), f"the intent {state}: {row['error']}")
    elif state in ENDED_STATES:  # a collection begun by an earlier step, perhaps cut short
        found = provider.retrieve_batch(str(row["provider_batch_id"]))
        _collect(ledger, steps, provider, batch, found, resumed=True)
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
        if not _refused(exc):
            raise  # may pass: the next step sends it again
        ledger.batch_cancel_sent(batch)
        found = provider.retrieve_batch(provider_batch_id)
        if found.state in ENDED_STATES:
            ledger.record_batch_status(batch, found.state, found.status, found.error)
            _collect(ledger, steps, provider, batch, found, resumed=False)
            return
        # Still running there, and not to be cancelled: ended here, its runs given back (an
        # answer it makes later is never taken: the lane does not poll it again).
        why = f"the provider refused to cancel it: {exc}"[:2000]
        ledger.record_batch_status(batch, "cancelled", found.status, why)
        _release_pending(ledger, batch, why)
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
        adopted, duplicates = _search(ledger, provider, batch, earlier, items)
        if adopted is None:  # a batch that may be this intent's still runs: wait for it
            return 0
        if adopted:
            return duplicates
    lines = []
    for item in items:
        try:
            prompt = steps.prompt(item.raw_input or {}, item.identity)
            lines.append(provider.batch_line(item.custom_id, prompt, steps.schema))
        except Exception as exc:  # noqa: BLE001 - that run's attempt ends; the batch goes on
            _end_item(ledger, batch, item, exc)
    if not lines:
        why = "no request of the batch could be built"
        _end_unsent(ledger, batch, why, why)
        return 0
    try:
        made = provider.create_batch(lines, batch.batch_id)
    except ProviderError as exc:
        if not _refused(exc):
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


def _refused(exc: ProviderError) -> bool:
    """Whether a create's error says the provider made no batch and never will for the same
    request: a 4xx answer, except a timeout, a conflict and a rate limit (408, 409, 429)."""
    return exc.status is not None and 400 <= exc.status < 500 and exc.status not in (408, 409, 429)


def _search(
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
            _cancel_quietly(provider, duplicate.provider_batch_id)
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


def _cancel_quietly(provider: BatchProvider, provider_batch_id: str) -> bool:
    try:
        provider.cancel_batch(provider_batch_id)
    except Exception:  # noqa: BLE001 - recorded as not cancelled; its results are never used
        return False
    return True


def _collect(
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
    _release_pending(ledger, batch, f"no result: the batch {found.state}")
    ledger.finish_batch(batch)


def _end_unsent(
    ledger: RunLedger, batch: BatchLease, error: str, why: str, state: str = "failed"
) -> None:
    """End an intent the provider never took (``error`` on the batch, ``state`` ``failed`` or
    ``cancelled``), give its runs back (``why`` on each) and mark it collected."""
    ledger.fail_batch_intent(batch, error, state)  # no-op once the intent has ended
    _release_pending(ledger, batch, why)
    ledger.give_back_strays(batch)
    ledger.finish_batch(batch)


def _release_pending(ledger: RunLedger, batch: BatchLease, why: str) -> None:
    for item in ledger.batch_items(batch.batch_id, pending_only=True):
        _give_back(ledger, batch, item.run_id, item.lease, why)


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
        _give_back(ledger, batch, item.run_id, lease, "no result: expired or cancelled")
        return
    if resumed and ledger.batch_item_paid(item):  # recorded before a crash: only its mark left
        ledger.end_batch_item(batch, item.run_id, _after_crash(ledger, item))
        return
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


def _after_crash(ledger: RunLedger, item: BatchItem) -> str:
    """The state of an item whose call was recorded before the collection was cut."""
    record = ledger.get(item.run_id)
    if record is not None and record.status == "completed":
        return "accepted" if record.lease_epoch == item.epoch else "not_accepted"
    return "failed"
