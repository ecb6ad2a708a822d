"""Keep leases alive while long steps (model calls) run, and notice when one is lost.

One daemon thread per ledger and process renews every lease held through that ledger, each at
its own interval. Holding a lease costs a dictionary entry, not a thread: a step that ends within
its first interval makes no renewal and, while the thread looks at its holds often anyway (for a
second after a lease was last held or let go: :data:`IDLE_LOOK_SECONDS`), wakes nothing. The
thread is created on first use, exits after a while with nothing held, and a forked child gets a
renewer of its own (the parent's thread and lock do not survive a fork).

The same thread stores a checkpoint that travels with a model call (``run_idempotent``'s: sent
beside the call, not awaited before it): :data:`CARRY_SECONDS` into the call, so a call that
lasts (any call that goes over a network) finds its input stored long before it answers, while
a step that answers sooner leaves it to its commit, which stores it in the same statement. The
checkpoint is never sent twice: whoever takes it (the thread, or the step ending) sends it.
"""

import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from types import TracebackType

from idempotent_jobs.core.checks import JsonPayload
from idempotent_jobs.core.errors import LeaseLostError, LedgerError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease

#: How long the renewer's thread waits with nothing held before it exits (the next hold starts
#: a new one).
IDLE_EXIT_SECONDS = 30.0
#: How long into a model call a checkpoint that travels with it is stored by the renewer (a
#: call answered sooner commits it instead); far shorter than any provider's answer.
CARRY_SECONDS = 0.01
#: For how long after a lease was last held or let go the thread looks at the holds every
#: :data:`CARRY_SECONDS` instead of waiting to be woken: a worker running call after call
#: then wakes no thread per call (a futex call and a thread switch each), at the price of at
#: most a hundred looks after the last one.
IDLE_LOOK_SECONDS = 1.0


@dataclass(eq=False)
class LeaseHold:
    """One lease kept alive by a :class:`LeaseRenewer`: the newest renewed lease, and whether
    the fence refused a renewal (another worker owns the run now)."""

    lease: Lease
    interval_seconds: float
    due: float
    lost: bool = False
    renewing: bool = field(default=False, repr=False)
    #: The checkpoint travelling with the call, until the renewer stores it or the step takes
    #: it back (:meth:`LeaseRenewer.take_checkpoint`).
    checkpoint: JsonPayload | None = field(default=None, repr=False)
    #: When the first renewal is due (the checkpoint, if any, is stored before).
    renew_due: float = 0.0


class LeaseRenewer:
    """Renews, on one daemon thread, every lease held through one ledger in this process."""

    def __init__(self, ledger: RunLedger) -> None:
        # Weak: the ledger holds its renewer, and a dropped ledger is let go.
        self._ledger = weakref.ref(ledger)
        self._wake = threading.Condition()
        self._holds: set[LeaseHold] = set()
        self._thread: threading.Thread | None = None
        # When the thread, waiting, will look at the holds again by itself (monotonic); minus
        # infinity while it is not waiting (it looks again before it waits). A hold due sooner
        # wakes it; any other needs no wake-up.
        self._wakes_at = -math.inf
        self._busy_at = -math.inf  # when a lease was last held or let go
        self.thread_name = f"lease-renewer-{id(self):x}"

    @property
    def held(self) -> int:
        """How many leases are held right now."""
        with self._wake:
            return len(self._holds)

    def hold(
        self, lease: Lease, interval_seconds: float, checkpoint: JsonPayload | None = None
    ) -> LeaseHold:
        """Renew ``lease`` every ``interval_seconds`` until :meth:`release`; store
        ``checkpoint`` (its collected input, not stored yet) :data:`CARRY_SECONDS` from now
        unless :meth:`take_checkpoint` takes it back first."""
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        now = time.monotonic()
        renew_due = now + interval_seconds
        due = renew_due if checkpoint is None else min(now + CARRY_SECONDS, renew_due)
        hold = LeaseHold(lease, interval_seconds, due, checkpoint=checkpoint, renew_due=renew_due)
        with self._wake:
            self._holds.add(hold)
            self._busy_at = now
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=self.thread_name, daemon=True
                )
                self._wakes_at = -math.inf
                self._thread.start()
            elif hold.due < self._wakes_at:
                self._wake.notify()
        return hold

    def release(self, hold: LeaseHold) -> None:
        """Stop renewing; returns once no renewal of this lease is in flight."""
        with self._wake:
            self._holds.discard(hold)
            self._busy_at = time.monotonic()
            while hold.renewing:
                self._wake.wait()

    def take_checkpoint(self, hold: LeaseHold) -> JsonPayload | None:
        """The hold's checkpoint if the renewer has not stored it (it no longer will), once
        no store of it is in flight; ``None`` when it was stored (or there was none)."""
        with self._wake:
            while hold.renewing:
                self._wake.wait()
            checkpoint, hold.checkpoint = hold.checkpoint, None
            if checkpoint is not None:  # nothing is due before the first renewal now
                hold.due = hold.renew_due
            return checkpoint

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._wake:
                now = time.monotonic()
                due = [h for h in self._holds if h.due <= now]
                if not due:
                    # Lately busy (a lease held or let go within IDLE_LOOK_SECONDS): look again
                    # within CARRY_SECONDS, as soon as a new hold's checkpoint can fall due, so
                    # that hold need not wake this thread.
                    look = CARRY_SECONDS if now - self._busy_at < IDLE_LOOK_SECONDS else math.inf
                    if self._holds:
                        idle_since = None
                        self._sleep(min(min(h.due for h in self._holds) - now, look), now)
                        continue
                    idle_since = idle_since if idle_since is not None else now
                    idle = now - idle_since
                    if idle >= IDLE_EXIT_SECONDS:
                        self._thread = None
                        return
                    self._sleep(min(IDLE_EXIT_SECONDS - idle, look), now)
                    continue
                for hold in due:
                    hold.renewing = True
            for hold in due:
                self._renew(hold)

    def _sleep(self, seconds: float, now: float) -> None:
        """Wait (the condition held) until ``seconds`` from ``now`` or a wake-up, saying until
        when for :meth:`hold`."""
        self._wakes_at = now + seconds
        try:
            self._wake.wait(seconds)
        finally:
            self._wakes_at = -math.inf

    def _renew(self, hold: LeaseHold) -> None:
        lease, lost, stored = hold.lease, False, False
        ledger = self._ledger()
        try:
            if ledger is not None and hold.checkpoint is not None:
                lease = ledger.checkpoint(hold.lease, hold.checkpoint)
                stored = True
            elif ledger is not None:
                lease = ledger.renew(hold.lease)
        except LeaseLostError:
            lost = True
        except LedgerError:
            pass  # retried at the next beat; the fence, not the renewer, stops a stale writer
        with self._wake:
            hold.lease, hold.renewing = lease, False
            if stored:
                hold.checkpoint = None
                hold.due = max(hold.renew_due, time.monotonic())
            else:
                hold.due = time.monotonic() + hold.interval_seconds
            if lost:
                hold.lost = True
                self._holds.discard(hold)
            self._wake.notify_all()


def renewer_for(ledger: RunLedger) -> LeaseRenewer:
    """This process's renewer for ``ledger``, kept on the ledger itself (a forked child gets
    one of its own)."""
    return ledger.process_local("lease_renewer", lambda: LeaseRenewer(ledger))


class LeaseHeartbeat:
    """Renew ``lease`` every ``interval_seconds`` while the block runs.

    A renewal refused by the fence means another worker owns the run now: renewal stops and
    :meth:`raise_if_lost` raises :class:`LeaseLostError`. A connection error is retried at the
    next beat; the fence, not the heartbeat, keeps a stale worker from writing.
    """

    def __init__(
        self,
        ledger: RunLedger,
        lease: Lease,
        interval_seconds: float,
        checkpoint: JsonPayload | None = None,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        self._renewer = renewer_for(ledger)
        self._lease = lease
        self.interval_seconds = interval_seconds
        self._checkpoint = checkpoint
        self._hold: LeaseHold | None = None

    @property
    def lease(self) -> Lease:
        """The newest renewed lease (it carries the stored checkpoint)."""
        return self._hold.lease if self._hold is not None else self._lease

    @property
    def lost(self) -> bool:
        return self._hold is not None and self._hold.lost

    def __enter__(self) -> "LeaseHeartbeat":
        self._hold = self._renewer.hold(self._lease, self.interval_seconds, self._checkpoint)
        return self

    def take_checkpoint(self) -> JsonPayload | None:
        """The checkpoint travelling with the call if it is not stored yet (the caller sends
        it: with the commit, or before ending the attempt); ``None`` once it is stored."""
        if self._hold is None:
            checkpoint, self._checkpoint = self._checkpoint, None
            return checkpoint
        return self._renewer.take_checkpoint(self._hold)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hold is not None:
            self._renewer.release(self._hold)

    def raise_if_lost(self) -> None:
        if self.lost:
            raise LeaseLostError()
