"""The attempt engine reports to observers, and telemetry is one of them (issue 45): a team's
own observer, added with ``add_observer``, is told each step and outcome of a run, in order;
one that raises changes no outcome and is warned about once; removed, it is told nothing."""

import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from decimal import Decimal
from typing import Any, Literal

import pytest

from idempotent_jobs import (
    EngineObserver,
    FailedAttempt,
    JobConfig,
    Lease,
    ModelAnswer,
    ModelUsage,
    add_observer,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.observers import current_observers
from idempotent_jobs.core.telemetry_observer import TelemetryObserver
from idempotent_jobs_tests.helpers import Collector, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.otel import installed, tree

CONFIG = JobConfig.of(prompt="Summarise.", model="m-observed", validator="any")


def _answer(raw: dict[str, Any]) -> ModelAnswer:
    return ModelAnswer({"summary": "ok"}, ModelUsage("m-observed", 1000, 100))


def _fails(raw: dict[str, Any]) -> ModelAnswer:
    raise TimeoutError("no answer in time")


class Recorder(EngineObserver):
    """Every event, as a short line."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextmanager
    def _around(self, name: str, lease: Lease | None, model: str | None) -> Iterator[None]:
        epoch = lease.epoch if lease is not None else "-"
        self.events.append(f"{name}@{epoch}" + (f" {model}" if model else ""))
        try:
            yield
        except BaseException as exc:
            self.events.append(f"/{name} {type(exc).__name__}")
            raise
        self.events.append(f"/{name}")

    def step(
        self, name: Any, lease: Lease | None, *, model: str | None = None
    ) -> AbstractContextManager[object]:
        return self._around(name, lease, model)

    def claimed(
        self, outcome: Any, lease: Lease | None, *, started_ns: int, handed_over: bool
    ) -> None:
        self.events.append(f"claimed {outcome}")

    def reused(self, what: Literal["input", "answer"]) -> None:
        self.events.append(f"reused {what}")

    def answered(self, usage: ModelUsage) -> None:
        self.events.append(f"answered {usage.input_tokens}+{usage.output_tokens}")

    def priced(self, money: Decimal, currency: str, usage: ModelUsage) -> None:
        self.events.append(f"priced {money.normalize()} {currency}")

    def in_doubt(self, usage: ModelUsage | None) -> None:
        self.events.append("in doubt")

    def attempt_failed(self, failure: FailedAttempt) -> None:
        error = type(failure.error).__name__
        self.events.append(f"failed {failure.ends} call={failure.call} {error}")

    def committed(self, outcome: Any, usage: ModelUsage | None) -> None:
        self.events.append(f"committed {outcome}")

    def delivered(self, delivered: Sequence[str], failed: Sequence[str]) -> None:
        self.events.append(f"delivered {list(delivered)} failed {list(failed)}")


class Raising(EngineObserver):
    """Every hook raises, the step's context as it is entered."""

    def step(self, name: Any, lease: Lease | None, *, model: str | None = None) -> Any:
        raise RuntimeError("observer broken")

    def claimed(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("observer broken")

    def answered(self, usage: ModelUsage) -> None:
        raise RuntimeError("observer broken")

    def committed(self, outcome: Any, usage: ModelUsage | None) -> None:
        raise RuntimeError("observer broken")


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    observer = Recorder()
    remove = add_observer(observer)
    yield observer
    remove()


def test_an_observer_is_told_each_step_and_outcome_of_a_run_in_order(
    ledger: HarnessLedger, operator: LedgerAdmin, recorder: Recorder
) -> None:
    operator.set_price("m-observed", "2.00", "10.00")
    ident, collect = identity(), Collector()
    with pytest.raises(TimeoutError):
        run_idempotent(ledger, ident, collect=collect, transform=_fails, config=CONFIG)
    assert recorder.events == [
        "claimed claimed",
        "collect@1",
        "/collect",
        "chat@1 m-observed",
        "failed failed call=failed TimeoutError",
        "in doubt",  # a timeout: no usage, so its money is in doubt
        "/chat TimeoutError",
    ]
    recorder.events.clear()
    run_idempotent(
        ledger, ident, collect=collect, transform=_answer, notifications=email, config=CONFIG
    )
    assert recorder.events == [
        "claimed claimed",
        "reused input",  # the failed attempt stored its checkpoint
        "chat@2 m-observed",
        "answered 1000+100",
        "/chat",
        "commit@2",
        "priced 0.003 USD",  # 1000 x 2.00 + 100 x 10.00 per million tokens
        "committed accepted",
        "/commit",
    ]
    recorder.events.clear()
    run_idempotent(ledger, ident, collect=collect, transform=_answer, config=CONFIG)
    assert recorder.events == ["claimed reused"]
    recorder.events.clear()
    ledger.deliver_outbox(lambda row: None)
    assert recorder.events == ["deliver@-", "delivered ['email'] failed []", "/deliver"]
    assert collect.calls == 1


def test_an_observer_that_raises_changes_no_outcome_and_is_warned_about_once(
    ledger: HarnessLedger, recorder: Recorder
) -> None:
    remove = add_observer(Raising())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = run_idempotent(ledger, identity(), collect=Collector(), transform=_answer)
            second = run_idempotent(
                ledger, identity(hour=10), collect=Collector(), transform=_answer
            )
    finally:
        remove()
    assert first.executed and second.executed
    warned = sorted(str(w.message) for w in caught if "Raising" in str(w.message))
    assert warned == [
        "idempotent_jobs: the engine observer Raising failed in "
        f"{hook} (RuntimeError); the run goes on as if it had not been called"
        for hook in ("answered", "claimed", "committed", "step")
    ]
    # The observer added before it was told everything, its steps whole.
    assert recorder.events.count("committed accepted") == 2
    assert recorder.events.count("/commit") == 2


def test_a_step_that_fails_leaves_every_observers_context_with_its_own_error(
    ledger: HarnessLedger, recorder: Recorder
) -> None:
    second = Recorder()
    remove = add_observer(second)
    try:
        with pytest.raises(TimeoutError):
            run_idempotent(ledger, identity(), collect=Collector(), transform=_fails)
    finally:
        remove()
    assert recorder.events == second.events
    assert "/chat TimeoutError" in second.events


def test_a_removed_observer_is_told_nothing_and_telemetry_stays(ledger: HarnessLedger) -> None:
    observer = Recorder()
    remove = add_observer(observer)
    remove()
    run_idempotent(ledger, identity(), collect=Collector(), transform=_answer)
    assert observer.events == []
    assert any(isinstance(o, TelemetryObserver) for o in current_observers())
    with pytest.raises(TypeError, match="observer: must be an EngineObserver"):
        add_observer(object())  # type: ignore[arg-type]


def test_telemetry_is_an_observer_and_makes_the_same_spans_beside_another(
    ledger: HarnessLedger, recorder: Recorder
) -> None:
    """With a second observer the engine guards each context; the spans are telemetry's own."""
    with installed() as otel:
        run_idempotent(ledger, identity(), collect=Collector(), transform=_answer, config=CONFIG)
        assert tree(otel.finished()) == [
            "idempotent_jobs.attempt [executed]",
            "  idempotent_jobs.claim [claimed]",
            "  idempotent_jobs.collect",
            "  chat m-observed",
            "  idempotent_jobs.commit [accepted]",
        ]
