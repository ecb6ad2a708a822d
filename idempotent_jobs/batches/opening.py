"""Opening a batch: :func:`open_intent` claims the runs of a range for a new batch (owner
``batch:<id>``), checkpoints their inputs as online, builds their requests, holds their worst
case under the job's budgets (at the batch tier) and commits the intent before any provider is
called. A run whose input, drill or request fails ends its own attempt; the batch goes on."""

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from idempotent_jobs.batches.job import BatchSteps
from idempotent_jobs.core.batch_book import BatchLease, batch_worker
from idempotent_jobs.core.collecting import collect_once
from idempotent_jobs.core.drills import take_drill
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    LeaseLostError,
    LedgerConnectionError,
    mark_unsent,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease
from idempotent_jobs.core.steps import end_attempt
from idempotent_jobs.models.batches import BatchProvider


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
