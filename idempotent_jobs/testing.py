"""The "run it twice" kit: what users put in their own suites to prove a job is idempotent."""

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from idempotent_jobs.identity import RunIdentity
from idempotent_jobs.ledger import RunLedger
from idempotent_jobs.protocol import ModelAnswer, RunOutcome, run_idempotent

JSONDict = dict[str, Any]


class ScriptedModel:
    """A fake model that answers differently on every call and counts its calls (thread-safe).

    ``answers`` are returned in order (then the last one repeats with a call number added); by
    default each answer is ``{"summary": "answer #N", "input_keys": [...]}``.
    ``fail_on`` lists 1-based call numbers that raise ``failure`` instead of answering.
    """

    def __init__(
        self,
        answers: Sequence[JSONDict] = (),
        *,
        fail_on: Sequence[int] = (),
        failure: type[Exception] = TimeoutError,
    ) -> None:
        self.answers = list(answers)
        self.fail_on = set(fail_on)
        self.failure = failure
        self.inputs: list[JSONDict] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.inputs)

    def __call__(self, raw_input: JSONDict) -> JSONDict:
        with self._lock:
            self.inputs.append(raw_input)
            number = next(self._counter)
        if number in self.fail_on:
            raise self.failure(f"scripted failure on call {number}")
        if number <= len(self.answers):
            return dict(self.answers[number - 1])
        base = dict(self.answers[-1]) if self.answers else {}
        return {**base, "summary": f"answer #{number}", "input_keys": sorted(raw_input)}


def assert_run_twice_is_idempotent(
    ledger: RunLedger,
    identity: RunIdentity,
    *,
    collect: Callable[[RunIdentity], JSONDict],
    transform: Callable[[JSONDict], JSONDict | ModelAnswer],
    notifications: Callable[[JSONDict], Mapping[str, JSONDict]] | None = None,
    validate: Callable[[JSONDict], object] | None = None,
) -> tuple[RunOutcome, RunOutcome]:
    """Run the same logical run twice; raise ``AssertionError`` if the second changed anything.

    Checks: both calls end completed with the same output; the second did not execute; the
    stored record (output, completion time, epoch), its attempts and its outbox are unchanged.
    """

    def once() -> RunOutcome:
        return run_idempotent(
            ledger,
            identity,
            collect=collect,
            transform=transform,
            notifications=notifications,
            validate=validate,
        )

    first = once()
    before = _snapshot(ledger, identity.run_id)
    second = once()
    after = _snapshot(ledger, identity.run_id)
    problems = []
    if first.status != "completed" or second.status != "completed":
        problems.append(f"status after the runs: {first.status}, {second.status}")
    if second.executed:
        problems.append("the second run executed the model again")
    if second.output != first.output:
        problems.append(f"the second run returned another output: {second.output!r}")
    if after != before:
        problems.append("the stored run, its attempts or its outbox changed on the second run")
    if problems:
        raise AssertionError("run twice is not idempotent: " + "; ".join(problems))
    return first, second


def _snapshot(ledger: RunLedger, run_id: str) -> tuple[Any, ...]:
    record = ledger.get(run_id)
    if record is None:
        raise AssertionError(f"run {run_id} is not in the ledger")
    kept = (record.status, record.output, record.raw_input, record.completed_at, record.lease_epoch)
    outbox = [(row.channel, row.payload) for row in ledger.outbox(run_id)]
    return kept, ledger.attempts(run_id), outbox
