"""The paid calls one model call makes on its way to an answer, told to the ledger as they go.

A model step may send several requests for one answer: a structured answer that failed its
schema gets a repair turn, and a provider error that may pass (a 429, a 5xx, a timeout) is
retried. Each request that reached the provider is a call to account for, and a crash later
must not lose it. While :func:`~idempotent_jobs.core.steps.call_model` runs the model, the
:class:`CallBook` of that call is the current one (:func:`current_calls`); a model step:

- calls :meth:`CallBook.before_request` before each request, which admits it in one statement:
  from the second on, the lease must still be held (nothing more is paid for a run another
  worker took over); under a budget, the request's worst case is reserved
  (:class:`BudgetExceededError` when it does not fit; see :mod:`idempotent_jobs.core.budgets`);
  under a provider's rate limit, its place is taken and waited for;
- calls :meth:`CallBook.paid` after each request that did not give the final answer: the call
  is recorded at once as a *turn* of the attempt (``rejected`` or ``failed``, with its usage),
  counted in the day's spend.

The final request's call is recorded by the attempt itself, as for any model step: accepted or
stale with the commit, ``rejected``/``failed`` when the step raises (a :class:`PaidCallError`
carries its usage). Outside :func:`call_model` (a model step called by hand, a test), the
current book is a :class:`CallBook` that records nothing.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import LeaseLostError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.observers import watch
from idempotent_jobs.core.rate_limits import (
    MIN_POLL_SECONDS,
    RateGrant,
    RateRequest,
    applies,
)
from idempotent_jobs.core.records import CallOrigin, CallOutcome, Lease, ModelUsage


@dataclass
class CallBook:
    """The requests of one model call and the ledger they are told to (none: a book that only
    counts, outside :func:`~idempotent_jobs.core.steps.call_model`)."""

    ledger: RunLedger | None = None
    lease: Lease | None = None
    origin: CallOrigin | None = None
    #: Whether a budget covers the run's job: each request's worst case is reserved.
    budgeted: bool = False
    #: The step's declared most tokens per call, for a request that does not say its own.
    max_tokens_per_call: int | None = None
    #: The worst case the lease holds already for the first request (the checkpoint or the
    #: handover reserved it): a first request within it reserves nothing more.
    held_tokens: int | None = None
    #: Raises :class:`LeaseLostError` once the heartbeat found the lease lost.
    lease_check: Callable[[], None] = lambda: None
    sleep: Callable[[float], None] = time.sleep
    requests: int = 0
    turns: list[CallOutcome] = field(default_factory=list)
    #: Seconds spent waiting for a place under a provider's rate limit.
    rate_wait_seconds: float = 0.0
    #: Whether a request was refused before it was sent (a lost lease, a spent budget).
    refused: bool = False

    def before_request(self, rate: RateRequest | None = None) -> None:
        """Before each provider request, admit it in one statement
        (:meth:`RunLedger.admit_request`): from the second on, the lease must still be held (a
        fenced renewal, :class:`LeaseLostError` otherwise); under a budget, the request's worst
        case (``rate``'s most input and output tokens, else the step's ``max_tokens_per_call``)
        is reserved, or the request refused (:class:`BudgetExceededError`); with ``rate`` (the
        provider, model and tokens of the request), its place is taken under the ledger's rate
        limit for that model, if there is one (:mod:`idempotent_jobs.core.rate_limits`), and
        waited for. A first request whose hold rides on the lease and that no limit covers
        costs no statement."""
        self.requests += 1
        if self.ledger is None or self.lease is None:
            return
        try:
            renew = self.requests > 1
            if renew:
                self.lease_check()
                if "lease_lost" in self.turns:
                    raise LeaseLostError()
            hold = self.budgeted and not self._held(rate)
            limit = self.ledger.known_rate_limits().get(rate.key) if rate is not None else None
            if not (renew or hold or limit is not None):
                return
            started = time.monotonic()
            output = rate.max_output_tokens if rate is not None else None
            tokens = applies(limit, rate) if limit is not None and rate is not None else 0
            grant = self.ledger.admit_request(
                self.lease,
                renew=renew,
                hold=hold,
                max_input_tokens=rate.max_input_tokens if rate is not None else None,
                max_output_tokens=output,
                max_tokens=self.max_tokens_per_call if output is None else None,
                requested_model=rate.model if rate is not None else None,
                place=rate if limit is not None else None,
                place_tokens=tokens,
            )
            if limit is not None and rate is not None:
                self._wait_for_place(self.ledger, self.lease, rate, tokens, grant, started)
        except BaseException:
            self.refused = True  # this request was never sent: no call to record for it
            raise

    def _held(self, rate: RateRequest | None) -> bool:
        """Whether the request is the first and its worst case is within what the lease holds
        (in tokens, so in money too: a held token is priced at the dearest kind)."""
        if self.requests != 1 or self.held_tokens is None:
            return False
        output = rate.max_output_tokens if rate is not None else None
        worst = (rate.max_input_tokens or 0) if rate is not None else 0
        worst += output if output is not None else (self.max_tokens_per_call or 0)
        return worst <= self.held_tokens

    def _wait_for_place(
        self,
        ledger: RunLedger,
        lease: Lease,
        rate: RateRequest,
        tokens: int,
        grant: RateGrant | None,
        started: float,
    ) -> None:
        """Wait for the place ``grant`` gave, or ask again (a place only) until one is given."""
        while True:
            if grant is None:  # the limit was deleted meanwhile
                ledger.forget_rate_limits()
                break
            if grant.granted:
                if grant.wait_seconds > 0:
                    self.sleep(grant.wait_seconds)
                break
            self.lease_check()  # nothing more is waited for on a lease another worker took
            self.sleep(max(grant.wait_seconds, MIN_POLL_SECONDS))
            grant = ledger.acquire_rate(lease, rate, tokens)
        waited = time.monotonic() - started
        self.rate_wait_seconds += waited
        watch.waited(waited, "rate_limited")

    def paid(
        self, usage: ModelUsage | None, call: CallOutcome, error: BaseException | str
    ) -> CallOutcome | None:
        """Record a request that reached the provider and did not give the final answer
        (``rejected``: its answer was refused and a repair turn follows; ``failed``: it raised
        and is retried). Returns the outcome the ledger recorded (``lease_lost`` when another
        claim took the run over meanwhile)."""
        text = error if isinstance(error, str) else describe_error(error)
        if usage is not None:
            watch.not_accepted(usage, call)
        if self.ledger is None or self.lease is None:
            self.turns.append(call)
            return call
        recorded = self.ledger.record_turn(
            self.lease,
            usage,
            turn=len(self.turns) + 1,
            call=call,
            error=text,
            origin=self.origin,
        )
        self.turns.append(recorded or call)
        return recorded


_current: ContextVar[CallBook | None] = ContextVar("idempotent_jobs_call_book", default=None)


def current_calls() -> CallBook:
    """The book of the model call running now (a fresh one that records nothing outside
    :func:`~idempotent_jobs.core.steps.call_model`)."""
    book = _current.get()
    return book if book is not None else CallBook()


@contextmanager
def keeping(book: CallBook) -> Iterator[CallBook]:
    """Make ``book`` the current one while the model runs."""
    token = _current.set(book)
    try:
        yield book
    finally:
        _current.reset(token)
