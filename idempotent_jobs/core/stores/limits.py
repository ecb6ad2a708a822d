"""The limits store: fleet-wide provider rate limits a spec declares or an operator sets, and a
request's place under them on the database clock (``sql/limits.sql``)."""

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from idempotent_jobs.core.checks import check_name
from idempotent_jobs.core.rate_limits import (
    BURST_SHARE,
    LIMITS_TTL_SECONDS,
    PACE_SHARE,
    RateGrant,
    RateLimit,
    RateRequest,
)
from idempotent_jobs.core.records import Lease
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.stores.base import Store

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class LimitsStore(Store):
    """Rate limits; what this process read and declared of them is cached here."""

    def __init__(self, db: "Executor", settings: LedgerSettings) -> None:
        super().__init__(db, settings)
        self._lock = threading.Lock()
        self._known: tuple[float, dict[tuple[str, str, str], RateLimit]] | None = None
        self._declared: set[tuple[RateLimit, str]] = set()

    def known(self) -> dict[tuple[str, str, str], RateLimit]:
        """The limits in the ledger, by (provider, model, key name), read at most every
        :data:`LIMITS_TTL_SECONDS`: a model with none costs no statement."""
        now = time.monotonic()
        with self._lock:
            cached = self._known
        if cached is not None and now - cached[0] < LIMITS_TTL_SECONDS:
            return cached[1]
        table = {}
        for row in self.rate_limit_rows():
            limit = RateLimit(
                row["provider"],
                row["model"],
                row["requests_per_window"],
                row["tokens_per_window"],
                row["key_name"],
                row["window_seconds"],
            )
            table[limit.key] = limit
        with self._lock:
            self._known = (now, table)
        return table

    def forget(self) -> None:
        """Read the limits afresh at the next request (after this process declared one, or
        the ledger refused a place under a limit it no longer has)."""
        with self._lock:
            self._known = None

    def declare_rate_limits(self, limits: Sequence[RateLimit], job_name: str) -> None:
        """Declare a job's limits in the ledger, once per process and ledger (a statement each,
        the first time only)."""
        if not limits:
            return
        with self._lock:
            todo = [limit for limit in limits if (limit, job_name) not in self._declared]
        for limit in todo:
            self.declare_rate_limit(limit, job_name)
            with self._lock:
                self._declared.add((limit, job_name))

    def rate_limit_rows(self) -> list[dict[str, Any]]:
        """Every provider rate limit in the ledger, as rows (read through
        :func:`~idempotent_jobs.core.rate_limits.limits_of`, which caches them)."""
        return self._db.fetch("list_rate_limits", {}, dict_row)

    def declare_rate_limit(self, limit: RateLimit, declared_by: str) -> bool:
        """Record ``limit`` as the job ``declared_by`` declares it (once per process is enough;
        an operator's limit stands over it). Returns whether the row changed."""
        params = {**limit.params(), "declared_by": check_name("declared_by", declared_by)}
        changed = bool(self._db.rows("declare_rate_limit", params))
        if changed:
            self.forget()
        return changed

    def acquire_rate(self, lease: Lease, request: RateRequest, tokens: int) -> RateGrant | None:
        """Reserve a place for ``request`` (``tokens`` as it reserves them) under its limit,
        for the run under ``lease`` (its subject's share); ``None`` when there is no such
        limit. See :mod:`idempotent_jobs.core.rate_limits`."""
        params = {
            "run_id": lease.run_id,
            "provider": request.provider,
            "model": request.model,
            "key_name": request.key_name,
            "tokens": tokens,
            "burst": BURST_SHARE,
            "pace": PACE_SHARE,
        }
        rows = self._db.rows("acquire_rate", params)
        return RateGrant(bool(rows[0][0]), float(rows[0][1])) if rows else None

    def set_rate_limit(self, limit: RateLimit) -> dict[str, Any]:
        """Set a provider rate limit as the operator (it stands over a spec's declaration);
        every worker of every deployment keeps it within half a minute."""
        [row] = self._db.fetch("set_rate_limit", limit.params(), dict_row)
        return row

    def delete_rate_limit(self, provider: str, model: str, key_name: str = "") -> bool:
        """Remove a rate limit; whether there was one."""
        params = {"provider": provider, "model": model, "key_name": key_name}
        return bool(self._db.rows("delete_rate_limit", params))
