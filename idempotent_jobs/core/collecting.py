"""Collect a run's input once: the stored checkpoint, else the collector's value, stored before
the model call (:func:`collect_once`: the Dagster ops, the batch lane) or carried with it
(:func:`collect_to_carry`: ``run_idempotent``, whose critical path is then the claim and the
commit)."""

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from idempotent_jobs.core.checks import JsonPayload
from idempotent_jobs.core.json_values import read_json
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.observers import watch
from idempotent_jobs.core.records import AdvanceHold, Lease
from idempotent_jobs.core.steps import JSONDict, end_attempt, release_hold

Collected = TypeVar("Collected")


def collect_once(
    ledger: RunLedger,
    lease: Lease,
    collect: Callable[[], JSONDict],
    *,
    hold: AdvanceHold | None = None,
) -> Lease:
    """The lease with the run's checkpoint: the stored one, else ``collect()``'s value stored
    now (the first stored value wins), with ``hold`` reserved in the same statement. A failure
    (the collector, an input the ledger refuses) ends the attempt, gives back what the claim
    held for the call, and propagates."""
    if lease.stored_raw_input is not None:
        watch.reused("input")
        return lease
    return _collecting(ledger, lease, lambda: ledger.checkpoint(lease, collect(), hold=hold))


def collect_to_carry(
    ledger: RunLedger, lease: Lease, collect: Callable[[], JSONDict]
) -> tuple[Lease, JsonPayload | None]:
    """As :func:`collect_once`, but a checkpoint collected now is not awaited before the model
    call: it is checked and serialised here, and returned to travel with the call
    (:func:`call_model`'s ``carried_input``; the lease renewer stores it early in the call, the
    commit otherwise, in its own statement). The lease names it as its basis, and its value is
    the one the ledger would give back. A crash before either stores it loses only the
    collection: the next attempt collects again, and nothing was accepted."""
    if lease.stored_raw_input is not None:
        watch.reused("input")
        return lease, None
    payload = _collecting(ledger, lease, lambda: ledger.input_payload(collect()))
    value = read_json(payload.text)
    carried = replace(lease, stored_raw_input=value, input_fingerprint=payload.fingerprint)
    return carried, payload


def _collecting(ledger: RunLedger, lease: Lease, step: Callable[[], Collected]) -> Collected:
    """``step()`` (collect, then store or serialise) as the ``collect`` step; a failure ends the
    attempt, gives back what the claim held for the call, and propagates."""
    with watch.step("collect", lease):
        try:
            return step()
        except BaseException as exc:
            end_attempt(ledger, lease, exc)
            release_hold(ledger, lease)
            raise
