"""Keep a lease alive while a long step (the model call) runs, and notice when it is lost."""

import threading
from types import TracebackType

from idempotent_jobs.core.errors import LeaseLostError, LedgerError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease


class LeaseHeartbeat:
    """Renew ``lease`` every ``interval_seconds`` on a background thread while the block runs.

    A renewal refused by the fence means another worker owns the run now: the heartbeat stops and
    :meth:`raise_if_lost` raises :class:`LeaseLostError`. A connection error is retried at the
    next beat; the fence, not the heartbeat, keeps a stale worker from writing.
    """

    def __init__(self, ledger: RunLedger, lease: Lease, interval_seconds: float) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be > 0")
        self.ledger = ledger
        self.lease = lease
        self.interval_seconds = interval_seconds
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"lease-heartbeat-{lease.run_id[:12]}", daemon=True
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.lease = self.ledger.renew(self.lease)
            except LeaseLostError:
                self.lost = True
                return
            except LedgerError:
                continue

    def __enter__(self) -> "LeaseHeartbeat":
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def raise_if_lost(self) -> None:
        if self.lost:
            raise LeaseLostError()
