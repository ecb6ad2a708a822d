"""A new run's checkpoint goes out beside its model call (core/checkpoints.py): the call starts
before the checkpoint has landed, the commit confirms it (storing it when it has not landed),
a failure waits for it, and a pool of one connection awaits it as before."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from idempotent_jobs import Budget, LedgerAdmin, RunIdentity, run_idempotent
from idempotent_jobs.core.checkpoints import PendingCheckpoint
from idempotent_jobs.core.json_values import json_fingerprint
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import BothFaces

RAW = {"documents": ["a", "b"], "asked": {"z": 1, "a": [1.5, None, True]}}


@contextmanager
def held_checkpoint(
    ledger: BothFaces, until: Callable[[str], bool]
) -> Iterator[tuple[list[str], threading.Event]]:
    """Hold the checkpoint statement back (on its own thread) until a statement for which
    ``until(name)`` is true has run on the caller's thread; yields the statements in the
    order they ended and the event set when the checkpoint was let go."""
    fetch = ledger._db.fetch
    caller = threading.get_ident()
    ended: list[str] = []
    released = threading.Event()

    def held(name: str, params: Any, row_factory: Any) -> Any:
        if name == "save_raw_input" and threading.get_ident() != caller:
            assert released.wait(30), "the caller's statement never came"
        try:
            return fetch(name, params, row_factory)
        finally:
            ended.append(name if threading.get_ident() == caller else f"{name}@thread")
            if threading.get_ident() == caller and until(name):
                released.set()

    ledger._db.fetch = held  # type: ignore[method-assign]
    try:
        yield ended, released
    finally:
        ledger._db.fetch = fetch  # type: ignore[method-assign]


def stored(db: psycopg.Connection, run: RunIdentity) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT status, raw_input, input_fingerprint FROM idempotent_jobs.runs WHERE run_id = %s",
        (run.run_id,),
    ).fetchone()


def test_the_call_starts_before_the_checkpoint_lands_and_the_commit_stores_it(
    ledger: BothFaces, db: psycopg.Connection
) -> None:
    seen: list[tuple[dict[str, Any], bool]] = []
    with held_checkpoint(ledger, until=lambda name: name == "complete") as (ended, released):

        def transform(raw: dict[str, Any]) -> dict[str, Any]:
            seen.append((raw, released.is_set()))
            return {"summary": "s"}

        outcome = run_idempotent(ledger, identity(), collect=lambda i: RAW, transform=transform)
    assert outcome.executed and outcome.status == "completed"
    assert seen == [(RAW, False)]  # the model ran on the value as stored, nothing awaited
    # The commit went first and stored the checkpoint; the checkpoint then found the run done.
    assert ended == ["begin", "complete", "save_raw_input@thread"]
    assert stored(db, identity()) == ("completed", RAW, json_fingerprint(RAW, "raw_input"))
    attempts = db.execute(
        "SELECT lease_epoch, outcome FROM idempotent_jobs.run_attempts WHERE run_id = %s",
        (identity().run_id,),
    ).fetchall()
    assert attempts == [(1, "completed")]


def test_a_failed_call_waits_for_its_checkpoint_and_the_retry_reuses_it(
    ledger: BothFaces, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def failing(raw: dict[str, Any]) -> dict[str, Any]:
        calls.append(raw)
        raise RuntimeError("the model broke")

    with held_checkpoint(ledger, until=lambda name: False) as (ended, released):
        wait = PendingCheckpoint.wait

        def let_go_then_wait(pending: PendingCheckpoint) -> bool:
            released.set()  # the checkpoint is sent only once the failure waits for it
            return wait(pending)

        monkeypatch.setattr(PendingCheckpoint, "wait", let_go_then_wait)
        with pytest.raises(RuntimeError, match="the model broke"):
            run_idempotent(ledger, identity(), collect=lambda i: RAW, transform=failing)
    assert ended == ["begin", "save_raw_input@thread", "fail"]  # waited for, then the failure
    assert stored(db, identity()) == ("failed", RAW, json_fingerprint(RAW, "raw_input"))
    again = run_idempotent(
        ledger, identity(), collect=lambda i: {"other": True}, transform=lambda raw: dict(raw)
    )
    assert calls == [RAW] and again.output == RAW  # the retry computed on the same checkpoint


def test_a_pool_of_one_connection_awaits_the_checkpoint(database: str) -> None:
    with BothFaces(database, pool_min_size=1, pool_max_size=1) as ledger:
        caller, threads = threading.get_ident(), set()
        fetch = ledger._db.fetch

        def watched(name: str, params: Any, row_factory: Any) -> Any:
            threads.add(threading.get_ident())
            return fetch(name, params, row_factory)

        ledger._db.fetch = watched  # type: ignore[method-assign]
        outcome = run_idempotent(
            ledger, identity(), collect=lambda i: RAW, transform=lambda raw: {"s": 1}
        )
        assert outcome.executed and threads == {caller}


def test_the_claim_holds_the_calls_worst_case_and_a_failed_collect_gives_it_back(
    ledger: BothFaces, db: psycopg.Connection
) -> None:
    budget_id = f"job:tokens/day:{identity().job_name}"
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1000), job_name=identity().job_name)

    def collect(run: RunIdentity) -> dict[str, Any]:
        held = db.execute(
            "SELECT sum(amount) FROM idempotent_jobs.budget_holds WHERE run_id = %s",
            (run.run_id,),
        ).fetchone()
        assert held == (200,)  # held by the claim, before anything was collected
        raise RuntimeError("the source is down")

    with pytest.raises(RuntimeError, match="the source is down"):
        run_idempotent(ledger, identity(), collect=collect, transform=dict, max_tokens_per_call=200)
    reserved = db.execute(
        "SELECT sum(reserved), count(*) FILTER (WHERE reserved <> 0)"
        " FROM idempotent_jobs.budget_counters WHERE budget_id = %s",
        (budget_id,),
    ).fetchone()
    holds = db.execute("SELECT count(*) FROM idempotent_jobs.budget_holds").fetchone()
    assert reserved == (0, 0) and holds == (0,)
