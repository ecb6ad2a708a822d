"""A shadow's life before its promotion: :func:`start` chooses its runs; :func:`advance` moves
it one step on under its own lease (any process may, after a crash): a started shadow is
computed (the batch lane: its requests admitted under the budgets and submitted once, the
provider searched first after a create whose answer was lost; the online lane: each item
called in turn), a submitted one polled and collected item by item, a collected one compared;
:func:`drop` ends it. Every paid request is recorded once, as the job's call (outcome
``shadow``), and no answer of a shadow is ever accepted or delivered here."""

from datetime import datetime
from decimal import Decimal
from typing import Any

from idempotent_jobs.batches.search import cancel_quietly, refused
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.batch_book import ENDED_STATES
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    InvalidInputError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    PaidCallError,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.steps import unpack_answer
from idempotent_jobs.core.usage import check_usage, recordable_usage
from idempotent_jobs.models.batches import BatchProvider, ProviderBatch
from idempotent_jobs.models.errors import ProviderError
from idempotent_jobs.shadows.compare import compare
from idempotent_jobs.shadows.job import ShadowProgress, ShadowSteps
from idempotent_jobs.shadows.online import compute_online

#: How long a shadow's lease lasts without a renewal.
SHADOW_LEASE_SECONDS = 600.0
#: Renew the shadow's lease every this many items.
RENEW_EVERY_ITEMS = 100


def start(
    admin: LedgerAdmin,
    steps: ShadowSteps,
    *,
    lane: str = "batch",
    baseline_version: str | None = None,
    window_from: datetime | None = None,
    window_to: datetime | None = None,
    subjects: list[str] | None = None,
    sample: int | None = None,
    budget: Decimal | None = None,
    provider: str | None = None,
    model: str | None = None,
    requested_by: str | None = None,
    quarantined: bool = False,
) -> tuple[str, int]:
    """A new shadow of ``steps``' version on the job's completed runs at ``baseline_version``
    (default: the version of its most recently completed run other than the new one); returns
    its id and how many runs it holds. Nothing is sent yet: :func:`advance` does that."""
    baseline = baseline_version or admin.baseline_version(steps.job_name, steps.version)
    if baseline is None:
        raise InvalidInputError(
            "--job", f"job {steps.job_name} has no completed run at another version to shadow"
        )
    if baseline == steps.version:
        raise InvalidInputError("--version", f"is the baseline's own version ({baseline})")
    selection = {
        "from": window_from.isoformat() if window_from else None,
        "to": window_to.isoformat() if window_to else None,
        "subjects": subjects or None,
        "sample": sample,
        "quarantined": quarantined,
    }
    shadow_id, count = admin.create_shadow(
        job_name=steps.job_name,
        baseline_version=baseline,
        version=steps.version,
        lane=lane,
        selection=selection,
        budget=budget,
        provider=provider,
        model=model,
        config_parts=dict(steps.config.parts),
        requested_by=requested_by,
        window_from=window_from,
        window_to=window_to,
        subjects=subjects,
        sample=sample,
        quarantined=quarantined,
    )
    return shadow_id, count


def identity_of(item: dict[str, Any], job_name: str, version: str) -> RunIdentity:
    """The stored run's identity (at its own version), for the prompt builder."""
    return RunIdentity(job_name, item["subject_id"], item["scheduled_at"], version)


def advance(
    ledger: RunLedger,
    steps: ShadowSteps,
    provider: BatchProvider | None,
    shadow_id: str,
    *,
    worker_id: str,
    lease_seconds: float = SHADOW_LEASE_SECONDS,
) -> ShadowProgress:
    """Move the shadow one step on under its lease (``lease_seconds``, renewed as it goes)
    and say where it stands: :class:`LeaseLostError` while another process advances it."""
    lease, row = ledger.claim_shadow(shadow_id, worker_id, lease_seconds)
    try:
        state = str(row["state"])
        if state == "started" and row["lane"] == "online":
            compute_online(ledger, steps, lease, row)
            ledger.shadow_to(lease, "collected", ["started"])
        elif state == "started":
            _submit(ledger, steps, _batch_provider(provider), lease, row)
        elif state == "submitted":
            batches = _batch_provider(provider)
            found = batches.retrieve_batch(str(row["provider_batch_id"]))
            if found.state in ENDED_STATES:
                _collect(ledger, steps, batches, lease, row, found)
        elif state == "collected":
            compare(ledger, steps, lease, row)
    finally:
        try:
            ledger.release_shadow(lease)
        except Exception:  # noqa: BLE001 - the lease lapses by itself
            pass
    return progress(ledger, shadow_id)


def _batch_provider(provider: BatchProvider | None) -> BatchProvider:
    if provider is None:
        raise InvalidInputError("lane", "the batch lane needs a model step with a batch API")
    return provider


def progress(ledger: RunLedger | LedgerAdmin, shadow_id: str) -> ShadowProgress:
    row = ledger.shadow(shadow_id)
    if row is None:
        raise LedgerError(f"no shadow {shadow_id}")
    return ShadowProgress(
        shadow_id=shadow_id,
        job_name=str(row["job_name"]),
        version=str(row["version"]),
        baseline_version=str(row["baseline_version"]),
        lane=str(row["lane"]),
        state=str(row["state"]),
        items=dict(row["item_states"] or {}),
        summary=row["summary"],
        money=row["money"],
        currency=row["currency"],
        calls=int(row["calls"] or 0),
        provider_batch_id=row["provider_batch_id"],
        error=row["error"],
    )


def _submit(
    ledger: RunLedger,
    steps: ShadowSteps,
    provider: BatchProvider,
    lease: Any,
    row: dict[str, Any],
) -> None:
    """Admit every pending item's request (its worst case held at the batch tier; an item the
    budgets refuse, or whose request cannot be built, ends unsent), mark the start, and create
    the provider batch once: after a start that may have reached the provider, it is searched
    for first and adopted."""
    items = ledger.shadow_items(lease.shadow_id, pending_only=True)
    if row["submit_started_at"] is not None:  # an earlier step may have created it: look
        # first, before any item is admitted again or ended
        adopted = _search(ledger, provider, lease, row["submit_started_at"], items)
        if adopted is not False:
            return  # adopted, or a batch that may be this shadow's still runs: wait
    lines = []
    for n, item in enumerate(items, 1):
        if n % RENEW_EVERY_ITEMS == 0:
            ledger.renew_shadow(lease)
        identity = identity_of(item, steps.job_name, str(row["baseline_version"]))
        try:
            prompt = steps.prompt(item["raw_input"] or {}, identity)
            most_in, most_out = provider.worst_case(prompt, steps.schema)
            ledger.admit_shadow_item(
                lease,
                item["run_id"],
                max_input_tokens=most_in,
                max_output_tokens=most_out,
                requested_model=provider.model,
                tier="batch",
            )
            lines.append(provider.batch_line(item["run_id"], prompt, steps.schema))
        except (LeaseLostError, LedgerConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - that item ends unsent; the shadow goes on
            ledger.end_shadow_item(lease, item["run_id"], "failed", _unsent(exc))
    if not lines:
        ledger.shadow_to(lease, "collected", ["started"], error="no request could be sent")
        return
    ledger.shadow_start_submit(lease)  # committed before the provider is called
    try:
        made = provider.create_batch(lines, lease.shadow_id)
    except ProviderError as exc:
        if not refused(exc):
            raise  # it may have been made: the next step searches for it first
        why = f"the provider refused the batch: {describe_error(exc)}"
        for item in ledger.shadow_items(lease.shadow_id, pending_only=True):
            ledger.end_shadow_item(lease, item["run_id"], "failed", why)
        ledger.shadow_to(lease, "collected", ["started"], error=why)
        return
    ledger.shadow_to(lease, "submitted", ["started"], provider_batch_id=made.provider_batch_id)


def _unsent(exc: Exception) -> str:
    if isinstance(exc, BudgetExceededError):
        return f"not sent: {describe_error(exc)}"
    return f"not sent: its request could not be built: {describe_error(exc)}"


def _search(
    ledger: RunLedger,
    provider: BatchProvider,
    lease: Any,
    since: datetime,
    items: list[dict[str, Any]],
) -> bool | None:
    """After a start that may have reached the provider: adopt the batch it made (the oldest
    proven this shadow's: by its metadata, or once ended by results naming only its runs), and
    cancel any second one. ``None`` while a batch that may be it still runs."""
    found = provider.find_batches(lease.shadow_id, since, len(items))
    if not provider.marks_batches:
        found = [
            b if b.state in ENDED_STATES else provider.retrieve_batch(b.provider_batch_id)
            for b in found
        ]
        if any(b.state not in ENDED_STATES for b in found):
            return None
        ours = {item["run_id"] for item in items}
        found = [b for b in found if _results_are(provider, b, ours)]
    if not found:
        return False
    first, *others = found
    for duplicate in others:
        if duplicate.state not in ENDED_STATES:
            cancel_quietly(provider, duplicate.provider_batch_id)
    ledger.shadow_to(
        lease,
        "submitted",
        ["started"],
        provider_batch_id=first.provider_batch_id,
        duplicates=len(others),
    )
    return True


def _results_are(provider: BatchProvider, found: ProviderBatch, ours: set[str]) -> bool:
    named = {result.custom_id for result in provider.batch_results(found)}
    return bool(named) and named <= ours


def _collect(
    ledger: RunLedger,
    steps: ShadowSteps,
    provider: BatchProvider,
    lease: Any,
    row: dict[str, Any],
    found: ProviderBatch,
) -> None:
    """Record each answered item's paid call and answer once (an item recorded before a crash
    is not recorded again), end those with no result, and mark the shadow collected."""
    pending = {item["run_id"]: item for item in ledger.shadow_items(lease.shadow_id)}
    taken = 0
    for result in provider.batch_results(found):
        item = pending.get(result.custom_id)
        if item is None or item["state"] != "pending":
            continue
        if result.missing:
            ledger.end_shadow_item(lease, item["run_id"], "missing", "no result: expired")
            continue
        record_answer(ledger, steps, lease, item["run_id"], _item_answer(provider, steps, result))
        taken += 1
        if taken % RENEW_EVERY_ITEMS == 0:
            ledger.renew_shadow(lease)
    for item in ledger.shadow_items(lease.shadow_id, pending_only=True):
        ledger.end_shadow_item(
            lease, item["run_id"], "missing", f"no result: the batch {found.state}"
        )
    ledger.shadow_to(lease, "collected", ["submitted"])


def _item_answer(provider: BatchProvider, steps: ShadowSteps, result: Any) -> Any:
    return lambda: provider.item_answer(result, steps.schema)


def record_answer(
    ledger: RunLedger, steps: ShadowSteps, lease: Any, run_id: str, produce: Any
) -> None:
    """Record the item's paid call with what ``produce()`` gave: an answer (valid when it is
    storable and the job's validator accepts it) or the provider's error for it (with the
    usage it reported: an error the provider answered costs nothing)."""
    try:
        answer = produce()
    except LedgerConnectionError:
        raise
    except PaidCallError as exc:  # an answer outside the schema, or the provider's error
        usage = recordable_usage(exc.usage)
        state = "answered" if exc.answered else "failed"
        ledger.record_shadow_call(
            lease, run_id, usage, state=state, valid=False, error=describe_error(exc)
        )
        return
    except Exception as exc:  # noqa: BLE001 - this item's failure; the shadow goes on
        ledger.record_shadow_call(lease, run_id, None, state="failed", error=describe_error(exc))
        return
    output, reported = unpack_answer(answer)
    usage = recordable_usage(reported)
    valid, error = True, None
    try:
        check_usage(reported)  # unbelievable counts: the answer is refused, as online
        stored = ledger.output_payload(output).value
        if steps.validate is not None and steps.validate(stored) is False:
            raise InvalidInputError("output", "the job's validator refused it")
    except Exception as exc:  # noqa: BLE001 - an invalid answer: quarantined, not accepted
        valid, error = False, describe_error(exc)
        stored = output if isinstance(output, dict) else {"answer": repr(output)[:2000]}
    try:
        ledger.record_shadow_call(
            lease, run_id, usage, state="answered", answer=stored, valid=valid, error=error
        )
    except LedgerError as exc:  # an answer the ledger cannot store: recorded without it
        if isinstance(exc, (LeaseLostError, LedgerConnectionError)):
            raise
        ledger.record_shadow_call(
            lease, run_id, usage, state="answered", valid=False, error=describe_error(exc)
        )


def drop(
    ledger: RunLedger,
    provider: BatchProvider | None,
    shadow_id: str,
    *,
    worker_id: str,
    lease_seconds: float = SHADOW_LEASE_SECONDS,
) -> ShadowProgress:
    """End the shadow: a batch still running at the provider is cancelled (nothing it answers
    later is taken), what its pending items hold is given back; its recorded calls stay."""
    lease, row = ledger.claim_shadow(shadow_id, worker_id, lease_seconds)
    try:
        if row["state"] == "promoting":
            raise InvalidInputError("shadow", f"{shadow_id} is being promoted: promote it again")
        if provider is not None and row["provider_batch_id"] is not None:
            found = provider.retrieve_batch(str(row["provider_batch_id"]))
            if found.state not in ENDED_STATES:
                cancel_quietly(provider, found.provider_batch_id)
        elif provider is not None and row["submit_started_at"] is not None:
            items = ledger.shadow_items(shadow_id, pending_only=True)
            for made in provider.find_batches(shadow_id, row["submit_started_at"], len(items)):
                if provider.marks_batches and made.state not in ENDED_STATES:
                    cancel_quietly(provider, made.provider_batch_id)
        for item in ledger.shadow_items(shadow_id, pending_only=True):
            ledger.end_shadow_item(lease, item["run_id"], "missing", "the shadow was dropped")
        ledger.shadow_to(lease, "dropped", [s for s in _OPEN if s != "promoting"])
    finally:
        try:
            ledger.release_shadow(lease)
        except Exception:  # noqa: BLE001
            pass
    return progress(ledger, shadow_id)


_OPEN = ("started", "submitted", "collected", "compared", "promoting")
