"""Who watches the attempt engine: its steps say what happened, and know nothing of who listens.

The engine (:mod:`~idempotent_jobs.core.steps`, :mod:`~idempotent_jobs.core.commits`,
:mod:`~idempotent_jobs.core.collecting`, :mod:`~idempotent_jobs.core.leases`, the call book and
the stores that price calls and deliver notifications) reports each step as it runs
(:meth:`EngineObserver.step`, a context around it) and each outcome once it is decided (the
other hooks), through :data:`watch`. OpenTelemetry's spans and metrics are one observer
(:class:`~idempotent_jobs.core.telemetry_observer.TelemetryObserver`, added when the package is
imported); :func:`add_observer` adds another (a team's own counters, a test's recorder).

Watching never changes an outcome: an observer's hook that raises is reported once (a warning
naming the observer and the hook) and the run goes on as if it had not been called. Hooks run
in the worker's thread, on its hot path: an observer that does I/O should queue it.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Literal

from idempotent_jobs.core.records import CallOutcome, FailedOutcome, Lease, ModelUsage

#: The engine's steps that run long enough to be watched around: the collector, the model call
#: (``chat``, the GenAI conventions' name), the fenced commit, a delivery of notifications.
StepName = Literal["collect", "chat", "commit", "deliver"]
#: How a claim ended: a lease to work under, the run completed already, another worker on it.
ClaimOutcome = Literal["claimed", "reused", "busy"]
#: What a wait was for and how it ended: another worker's lease, then claimed, reused or still
#: busy; or a place under a provider's rate limit.
WaitOutcome = Literal["claimed", "reused", "busy", "rate_limited"]
#: How a commit ended: accepted, another answer accepted first, the basis moved on (a revise),
#: or the lease taken over.
CommitOutcome = Literal["accepted", "reused", "superseded", "lease_lost"]


@dataclass(frozen=True)
class FailedAttempt:
    """How an attempt ended on failure, as :func:`~idempotent_jobs.core.steps.end_attempt`
    records it."""

    #: What the attempt failed on.
    error: BaseException
    #: How the ledger records the attempt's end: ``failed``, ``drill`` or ``budget``.
    ends: FailedOutcome
    #: The model call the attempt recorded with it (``failed``, ``rejected``), if one was made.
    call: CallOutcome | None
    #: That call's usage, when known.
    usage: ModelUsage | None


class EngineObserver:
    """What the engine reports. Every hook does nothing here: an observer overrides those it
    wants. Each is called once per event, in the order the events happen."""

    #: Whether every hook already keeps its own failures in (as telemetry's do): the engine then
    #: calls its :meth:`step` context without a guard of its own (a few microseconds a step).
    never_raises: ClassVar[bool] = False

    def step(
        self, name: StepName, lease: Lease | None, *, model: str | None = None
    ) -> AbstractContextManager[object]:
        """A context around the step ``name`` under ``lease`` (``None`` for a delivery);
        ``model``: the model a ``chat`` step asks for. An exception in the step leaves it."""
        return nullcontext()

    def claimed(
        self, outcome: ClaimOutcome, lease: Lease | None, *, started_ns: int, handed_over: bool
    ) -> None:
        """A claim ended (``lease``, when one was had; ``started_ns``: ``time.time_ns()`` as it
        began; ``handed_over``: the lease was an earlier step's, taken over)."""

    def waited(self, seconds: float, outcome: WaitOutcome) -> None:
        """The worker waited ``seconds`` for another worker's lease or a rate limit's place."""

    def reused(self, what: Literal["input", "answer"]) -> None:
        """A stored checkpoint (``input``) or an answer an earlier attempt paid for and
        recorded (``answer``) is used instead of collecting or calling again."""

    def answered(self, usage: ModelUsage) -> None:
        """The model call answered, and its usage is believable (inside its ``chat`` step)."""

    def priced(self, money: Decimal, currency: str, usage: ModelUsage) -> None:
        """The ledger recorded a paid call and priced it at ``money`` (in ``currency``), by the
        price row its admission fixed (a call with no price in force is not told)."""

    def in_doubt(self, usage: ModelUsage | None) -> None:
        """The ledger recorded a paid call whose usage is unknown: its money is in doubt."""

    def not_accepted(self, usage: ModelUsage, call: str) -> None:
        """Tokens were paid for and their answer was not accepted (``call``: ``failed``,
        ``rejected``, ``stale``, ``lease_lost``)."""

    def attempt_failed(self, failure: FailedAttempt) -> None:
        """The attempt ended on a failure (called inside the failing step)."""

    def call_lost(self, usage: ModelUsage | None) -> None:
        """A call was paid for under a lease another worker has taken over meanwhile."""

    def committed(self, outcome: CommitOutcome, usage: ModelUsage | None) -> None:
        """The commit ended (inside its ``commit`` step); ``usage``: the answer's call's."""

    def delivered(self, delivered: Sequence[str], failed: Sequence[str]) -> None:
        """A delivery sent notifications on these channels (one entry a notification) and
        failed to send on those (inside its ``deliver`` step)."""


_observers: tuple[EngineObserver, ...] = ()
_failures_reported: set[tuple[int, str, str]] = set()


def add_observer(observer: EngineObserver) -> Callable[[], None]:
    """Have ``observer`` told everything the engine reports from now on, in every thread of the
    process, after the observers added before it. Returns what removes it again."""
    global _observers
    if not isinstance(observer, EngineObserver):
        raise TypeError(f"observer: must be an EngineObserver, got {type(observer).__name__}")
    _observers = (*_observers, observer)
    return lambda: remove_observer(observer)


def remove_observer(observer: EngineObserver) -> None:
    """Tell ``observer`` nothing more (nothing happens when it was not added)."""
    global _observers
    _observers = tuple(o for o in _observers if o is not observer)


def current_observers() -> tuple[EngineObserver, ...]:
    """The observers told now, in the order they are told."""
    return _observers


def _hook_failed(observer: EngineObserver, hook: str, exc: Exception) -> None:
    key = (id(type(observer)), hook, type(exc).__name__)
    if key in _failures_reported:
        return
    _failures_reported.add(key)
    warnings.warn(
        f"idempotent_jobs: the engine observer {type(observer).__name__} failed in {hook} "
        f"({type(exc).__name__}); the run goes on as if it had not been called",
        RuntimeWarning,
        stacklevel=3,
    )


def _tell(hook: str, *args: Any, **kwargs: Any) -> None:
    for observer in _observers:
        try:
            getattr(observer, hook)(*args, **kwargs)
        except Exception as exc:
            _hook_failed(observer, hook, exc)


@contextmanager
def _guarded_steps(
    observers: tuple[EngineObserver, ...], name: StepName, lease: Lease | None, model: str | None
) -> Iterator[None]:
    """Every observer's context around the step; one that fails to enter or leave is left out
    (reported once), and the step's own exception always goes on out."""
    with ExitStack() as stack:
        for observer in observers:
            try:
                context = observer.step(name, lease, model=model)
                context.__enter__()
            except Exception as exc:
                _hook_failed(observer, "step", exc)
                continue
            stack.push(_exit_guard(observer, context))
        yield


def _exit_guard(
    observer: EngineObserver, context: AbstractContextManager[object]
) -> Callable[..., bool]:
    def leave(*exc_info: Any) -> bool:
        try:
            context.__exit__(*exc_info)
        except Exception as exc:
            _hook_failed(observer, "step", exc)
        return False  # the step's exception is never swallowed

    return leave


class _Broadcast(EngineObserver):
    """Every added observer, told in turn; what the engine calls (:data:`watch`)."""

    never_raises = True

    def step(
        self, name: StepName, lease: Lease | None, *, model: str | None = None
    ) -> AbstractContextManager[object]:
        observers = _observers
        if not observers:
            return nullcontext()
        if len(observers) == 1 and observers[0].never_raises:  # the hot path: telemetry alone
            return observers[0].step(name, lease, model=model)
        return _guarded_steps(observers, name, lease, model)

    def claimed(
        self, outcome: ClaimOutcome, lease: Lease | None, *, started_ns: int, handed_over: bool
    ) -> None:
        _tell("claimed", outcome, lease, started_ns=started_ns, handed_over=handed_over)

    def waited(self, seconds: float, outcome: WaitOutcome) -> None:
        _tell("waited", seconds, outcome)

    def reused(self, what: Literal["input", "answer"]) -> None:
        _tell("reused", what)

    def answered(self, usage: ModelUsage) -> None:
        _tell("answered", usage)

    def priced(self, money: Decimal, currency: str, usage: ModelUsage) -> None:
        _tell("priced", money, currency, usage)

    def in_doubt(self, usage: ModelUsage | None) -> None:
        _tell("in_doubt", usage)

    def not_accepted(self, usage: ModelUsage, call: str) -> None:
        _tell("not_accepted", usage, call)

    def attempt_failed(self, failure: FailedAttempt) -> None:
        _tell("attempt_failed", failure)

    def call_lost(self, usage: ModelUsage | None) -> None:
        _tell("call_lost", usage)

    def committed(self, outcome: CommitOutcome, usage: ModelUsage | None) -> None:
        _tell("committed", outcome, usage)

    def delivered(self, delivered: Sequence[str], failed: Sequence[str]) -> None:
        _tell("delivered", delivered, failed)


#: What the engine reports to: every observer added, in turn.
watch: EngineObserver = _Broadcast()
