"""A checkpoint collected by ``run_idempotent`` travels with the model call (issue 45).

A new run waits on two statements, the claim and the commit: the checkpoint is not awaited
before the call. The lease renewer stores it a moment into the call, the commit stores it in its
own statement when the call answered sooner, and a failed attempt stores it as it ends. A worker
killed before either stored it leaves the promise whole: the next attempt collects again and one
answer is accepted; killed after, the next attempt reuses it.
"""

import multiprocessing
import os
import signal
from typing import Any

import psycopg
import pytest

from idempotent_jobs import InvalidInputError, run_idempotent
from idempotent_jobs.core import heartbeat
from idempotent_jobs.core.heartbeat import renewer_for
from idempotent_jobs.core.json_values import json_fingerprint
from idempotent_jobs_tests.helpers import (
    Collector,
    count,
    email,
    expire_lease,
    identity,
    sent_statements,
    wait_for_checkpoint,
)
from idempotent_jobs_tests.ledgers import HarnessLedger

FORK = multiprocessing.get_context("fork")


def _stored(db: psycopg.Connection, run_id: str) -> tuple[Any, Any]:
    row = db.execute(
        "SELECT raw_input, input_fingerprint FROM idempotent_jobs.runs WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_new_run_waits_on_the_claim_and_the_commit_which_stores_its_checkpoint(
    ledger: HarnessLedger, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sent_statements(ledger, monkeypatch)
    collector = Collector()
    outcome = run_idempotent(
        ledger, identity(), collect=collector, transform=lambda raw: {"summary": "s"}
    )
    assert outcome.executed and sent == ["begin", "complete"]
    raw, fingerprint = _stored(db, identity().run_id)
    assert raw == collector.value and fingerprint == json_fingerprint(collector.value)
    again = run_idempotent(ledger, identity(), collect=collector, transform=lambda raw: {})
    assert again.output == {"summary": "s"} and collector.calls == 1


def test_a_call_that_lasts_finds_its_checkpoint_stored_before_it_answers(
    ledger: HarnessLedger, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewer stores it ``CARRY_SECONDS`` into the call; the commit then carries nothing."""
    sent = sent_statements(ledger, monkeypatch)
    seen: list[Any] = []
    collector = Collector()

    def transform(raw: dict[str, Any]) -> dict[str, Any]:
        seen.append(wait_for_checkpoint(ledger, identity().run_id))
        return {"summary": "after the checkpoint"}

    outcome = run_idempotent(ledger, identity(), collect=collector, transform=transform)
    assert outcome.executed and seen == [collector.value]
    # The model's own reads of the run (`get_run`) apart, as the worker sent them:
    assert [name for name in sent if name != "get_run"] == ["begin", "save_raw_input", "complete"]


@pytest.mark.parametrize("looking", [True, False], ids=["lately-busy", "asleep"])
def test_the_renewer_stores_a_carried_checkpoint_without_being_woken_while_it_looks(
    ledger: HarnessLedger, monkeypatch: pytest.MonkeyPatch, looking: bool
) -> None:
    """A renewer busy lately looks at its holds every ``CARRY_SECONDS``, so a new call's hold
    wakes no thread (a futex call and a thread switch saved per run); one asleep past that
    (``IDLE_LOOK_SECONDS``) is woken by the hold. Either way the checkpoint is stored."""
    monkeypatch.setattr(heartbeat, "IDLE_LOOK_SECONDS", 3600.0 if looking else 0.0)
    wake = renewer_for(ledger)._wake  # noqa: SLF001 - counting its wake-ups is the point
    wakes: list[int] = []  # a hold's notify(); a renewal's notify_all() (it calls notify) apart
    all_of, notify, notify_all = [False], wake.notify, wake.notify_all

    def counted_notify(n: int = 1) -> None:
        if not all_of[0]:
            wakes.append(n)
        notify(n)

    def counted_notify_all() -> None:
        all_of[0] = True
        try:
            notify_all()
        finally:
            all_of[0] = False

    monkeypatch.setattr(wake, "notify", counted_notify)
    monkeypatch.setattr(wake, "notify_all", counted_notify_all)
    run_idempotent(ledger, identity(hour=0), collect=Collector(), transform=lambda raw: {})
    for hour in range(1, 4):
        collector = Collector()

        def transform(raw: dict[str, Any], hour: int = hour) -> dict[str, Any]:
            return {"stored": wait_for_checkpoint(ledger, identity(hour=hour).run_id)}

        done = run_idempotent(ledger, identity(hour=hour), collect=collector, transform=transform)
        assert done.output == {"stored": collector.value}
    if looking:
        assert wakes == []


@pytest.mark.parametrize("fails_in", ["transform", "notifications"])
def test_a_failed_attempt_stores_its_checkpoint_and_the_retry_reuses_it(
    ledger: HarnessLedger, db: psycopg.Connection, fails_in: str
) -> None:
    collector = Collector()

    def transform(raw: dict[str, Any]) -> dict[str, Any]:
        if fails_in == "transform":
            raise RuntimeError("the model is down")
        return {"summary": "s"}

    def notifications(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
        raise RuntimeError("no channel today")

    with pytest.raises(RuntimeError):
        run_idempotent(
            ledger,
            identity(),
            collect=collector,
            transform=transform,
            notifications=notifications if fails_in == "notifications" else None,
        )
    assert _stored(db, identity().run_id)[0] == collector.value
    done = run_idempotent(
        ledger, identity(), collect=collector, transform=lambda raw: {"seen": raw}
    )
    assert done.output == {"seen": collector.value} and collector.calls == 1


def _killed_in_the_call(database: str, stored_first: bool) -> None:
    """A worker that collects, then dies (SIGKILL) in its model call: at once, or once the
    renewer stored the checkpoint travelling with it."""
    with HarnessLedger(database) as ledger:

        def transform(raw: dict[str, Any]) -> dict[str, Any]:
            if stored_first:
                wait_for_checkpoint(ledger, identity().run_id)
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        run_idempotent(
            ledger,
            identity(),
            collect=lambda ident: {"documents": [f"collected by {os.getpid()}"]},
            transform=transform,
            lease_seconds=60,
        )


@pytest.mark.parametrize("stored_first", [False, True], ids=["in_flight", "stored"])
def test_a_worker_killed_in_its_call_leaves_one_answer_on_one_checkpoint(
    ledger: HarnessLedger, db: psycopg.Connection, database: str, stored_first: bool
) -> None:
    worker = FORK.Process(target=_killed_in_the_call, args=(database, stored_first))
    worker.start()
    worker.join(timeout=60)
    assert worker.exitcode == -signal.SIGKILL
    run_id = identity().run_id
    raw, _ = _stored(db, run_id)
    victims = {"documents": [f"collected by {worker.pid}"]}
    assert raw == (victims if stored_first else None)
    expire_lease(db, run_id)
    collector = Collector()
    done = run_idempotent(
        ledger,
        identity(),
        collect=collector,
        transform=lambda raw: {"summary": "s", "seen": raw},
        notifications=email,
    )
    expected = victims if stored_first else collector.value
    assert done.executed and done.output == {"summary": "s", "seen": expected}
    assert collector.calls == (0 if stored_first else 1)
    assert _stored(db, run_id)[0] == expected
    assert count(db, "notification_outbox", run_id) == 1


def test_a_commit_refuses_a_carried_checkpoint_its_basis_does_not_name(
    ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    _, lease = ledger.begin(identity(), "w", 30)
    assert lease is not None
    payload = ledger.input_payload({"documents": ["d"]})
    with pytest.raises(InvalidInputError, match="carried_input"):
        ledger.complete(lease, {"summary": "s"}, carried_input=payload)
    assert _stored(db, identity().run_id) == (None, None)
