"""The "run it twice" kit: what users put in their own suites to prove a job is idempotent."""

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.protocol import RunOutcome

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
    ledger: RunLedger, run_once: Callable[[], RunOutcome]
) -> tuple[RunOutcome, RunOutcome]:
    """Call ``run_once`` (your job for one logical run) twice; raise if the second changed anything.

    ``run_once`` is whatever your code does for one scheduled run, typically building the
    identity and calling :func:`run_idempotent`. Checks: both calls address the same run id and
    end completed with the same output; the second did not execute the model; the stored record
    (output, completion time, epoch), its attempts and its outbox are unchanged.
    """
    first = run_once()
    before = _snapshot(ledger, first.run_id)
    second = run_once()
    problems = []
    if second.run_id != first.run_id:
        problems.append(
            "the second call addressed another run id (is the identity built from the wall "
            "clock or the scheduler's run id?)"
        )
    after = _snapshot(ledger, first.run_id)
    if first.status != "completed" or second.status != "completed":
        problems.append(f"status after the runs: {first.status}, {second.status}")
    if second.executed:
        problems.append("the second call executed the model again")
    if second.output != first.output:
        problems.append(f"the second call returned another output: {second.output!r}")
    if after != before:
        problems.append("the stored run, its attempts or its outbox changed on the second call")
    if problems:
        raise AssertionError("running twice is not idempotent: " + "; ".join(problems))
    return first, second


def _snapshot(ledger: RunLedger, run_id: str) -> tuple[Any, ...]:
    with LedgerAdmin.beside(ledger) as admin:  # the operator's reads of the same ledger
        return _state(admin, run_id)


def _state(admin: LedgerAdmin, run_id: str) -> tuple[Any, ...]:
    record = admin.get(run_id)
    if record is None:
        raise AssertionError(f"run {run_id} is not in the ledger")
    kept = (record.status, record.output, record.raw_input, record.completed_at, record.lease_epoch)
    outbox = [(row.channel, row.payload) for row in admin.outbox(run_id)]
    return kept, admin.attempts(run_id), outbox
