"""The run ledger: a Dagster resource, usable without Dagster, backed by its own PostgreSQL schema.

PostgreSQL is the only authority: uniqueness is a constraint, the lease is one atomic UPDATE whose
expiry is the database clock, and every write after a claim is fenced by owner and epoch (see
``queries.py``). Each method is one statement on an autocommit connection, so a method is one round
trip and one transaction, and safe to retry when the connection drops: a statement that landed
before the drop is recognised on the retry instead of being applied twice. Lease-only writes do not
wait for the WAL flush unless ``durable_lease_commits`` is set (why that is safe: ``queries.py``).
"""

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, LiteralString, TypeVar

import dagster as dg
import psycopg
from psycopg import sql
from psycopg.rows import RowFactory, class_row, dict_row, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout
from pydantic import Field, PrivateAttr

from idempotent_jobs import queries
from idempotent_jobs.database import libpq_conninfo
from idempotent_jobs.errors import (
    IdentityConflictError,
    InvalidInputError,
    LeaseLostError,
    LedgerConnectionError,
    LedgerError,
    RunNotFoundError,
    SchemaNotMigratedError,
)
from idempotent_jobs.identity import RunIdentity
from idempotent_jobs.json_values import dump_json_object
from idempotent_jobs.records import (
    AttemptRecord,
    Completion,
    DeliveryReport,
    Lease,
    ModelUsage,
    OutboxRecord,
    RevisionRecord,
    RunRecord,
    RunStatus,
)
from idempotent_jobs.schema import apply_migrations, check_schema_name, verify_migrations

Row = TypeVar("Row")

MAX_LEASE_SECONDS = 24 * 3600.0
MAX_ERROR_CHARS = 4000
_NO_USAGE = ModelUsage()


def _check_worker_id(worker_id: str) -> str:
    if not isinstance(worker_id, str) or not worker_id.strip():
        raise InvalidInputError("worker_id", "must be a non-empty string")
    if len(worker_id) > 200 or not worker_id.isprintable():
        raise InvalidInputError("worker_id", "must be printable and at most 200 characters")
    return worker_id


def _check_lease_seconds(lease_seconds: float) -> float:
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
        raise InvalidInputError("lease_seconds", "must be a number of seconds")
    if not 0 < lease_seconds <= MAX_LEASE_SECONDS:
        raise InvalidInputError("lease_seconds", f"must be > 0 and <= {MAX_LEASE_SECONDS:.0f}")
    return float(lease_seconds)


def _check_channel(field: str, channel: object) -> None:
    if not isinstance(channel, str) or not channel.strip() or not channel.isprintable():
        raise InvalidInputError(field, f"channel name {channel!r} is not valid")


def _notifications_json(notifications: Mapping[str, Any] | None) -> str:
    notifications = dict(notifications or {})
    for channel, payload in notifications.items():
        _check_channel("notifications", channel)
        dump_json_object(payload, f"notifications[{channel!r}]")
    return dump_json_object(notifications, "notifications")


def _identity_params(identity: RunIdentity) -> dict[str, Any]:
    return {
        "run_id": identity.run_id,
        "job_name": identity.job_name,
        "subject_id": identity.subject_id,
        "scheduled_at": identity.scheduled_at,
        "version": identity.version,
    }


def _check_identity(record: RunRecord, identity: RunIdentity) -> None:
    stored = (record.job_name, record.subject_id, record.scheduled_at, record.version)
    wanted = (identity.job_name, identity.subject_id, identity.scheduled_at, identity.version)
    if stored != wanted:
        raise IdentityConflictError(
            f"run {identity.run_id} is stored with different identity fields"
        )


def _fence(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch}


def _usage(usage: ModelUsage | None) -> dict[str, Any]:
    usage = usage or _NO_USAGE
    return {
        "model_name": usage.model_name,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


class RunLedger(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Durable record of logical runs: registration, fenced leases, checkpoint, commit, outbox.

    In Dagster, configure ``database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")``; outside it,
    ``RunLedger(database_url=...)`` works the same and opens its pool on first use (``close()`` or
    a ``with`` block closes it). Opening verifies the schema and never runs DDL: call
    :meth:`migrate` (or ``idempotent-jobs migrate``) once per database.
    """

    database_url: str = Field(
        description="PostgreSQL URL of the ledger database (use an EnvVar: it may hold a password)",
        repr=False,
    )
    schema_name: str = Field(
        default="idempotent_jobs", description="PostgreSQL schema holding the ledger's tables"
    )
    pool_min_size: int = Field(default=1, description="Connections kept open by the pool")
    pool_max_size: int = Field(default=4, description="Most connections the pool opens")
    connect_timeout_seconds: float = Field(
        default=10.0, description="How long to wait for a connection before failing"
    )
    connection_retries: int = Field(
        default=3, description="Retries of a statement whose connection broke (all are idempotent)"
    )
    durable_lease_commits: bool = Field(
        default=False,
        description=(
            "Wait for the WAL flush on lease-only writes too (claim, checkpoint, renew, release). "
            "Off, those commit without waiting: visible at once, lost only if the server crashes "
            "within a few hundred ms, which the fence makes harmless. Results, outbox rows and "
            "failures always wait for the flush."
        ),
    )

    _pool: ConnectionPool | None = PrivateAttr(default=None)
    _sql: dict[str, LiteralString] = PrivateAttr(default_factory=dict)
    _open_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    # -- lifecycle ---------------------------------------------------------------------------

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.open()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def open(self) -> None:
        """Open the connection pool and verify the schema; a no-op when already open."""
        with self._open_lock:
            if self._pool is not None:
                return
            check_schema_name(self.schema_name)
            pool = ConnectionPool(
                conninfo=libpq_conninfo(self.database_url),
                min_size=self.pool_min_size,
                max_size=max(self.pool_max_size, self.pool_min_size),
                kwargs={"autocommit": True, "prepare_threshold": 0},
                timeout=self.connect_timeout_seconds,
                name="idempotent_jobs.ledger",
                open=False,
            )
            try:
                pool.open(wait=True, timeout=self.connect_timeout_seconds)
                with pool.connection() as conn:
                    verify_migrations(conn, self.schema_name)
            except PoolTimeout:
                pool.close()
                raise LedgerConnectionError(
                    f"could not connect to the ledger database within "
                    f"{self.connect_timeout_seconds:g}s"
                ) from None
            except BaseException:
                pool.close()
                raise
            self._pool = pool

    def close(self) -> None:
        """Close the pool this ledger opened (it can be opened again)."""
        with self._open_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "RunLedger":
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def migrate(self) -> list[str]:
        """Apply missing migrations (idempotent, serialised by an advisory lock); return them."""
        check_schema_name(self.schema_name)
        try:
            with psycopg.connect(
                self.database_url,
                autocommit=True,
                connect_timeout=int(self.connect_timeout_seconds),
            ) as conn:
                applied = apply_migrations(conn, self.schema_name)
        except psycopg.OperationalError as exc:
            raise LedgerConnectionError(f"could not migrate the ledger: {exc}") from None
        except psycopg.Error as exc:
            raise LedgerError(f"could not migrate the ledger: {exc}") from None
        return [f"{m.version:04d}_{m.name}" for m in applied]

    # -- statements --------------------------------------------------------------------------

    def _query(self, template: LiteralString) -> LiteralString:
        """The statement with the quoted schema name, rendered once per ledger.

        A plain string (not a ``Composed``) lets psycopg reuse its parsed and prepared form
        instead of composing the statement again on every call. Indentation is dropped: psycopg
        caches the conversion of statements up to 4,096 characters only, and the claim's
        statement is longer than that indented.
        """
        query = self._sql.get(template)
        if query is None:
            rendered = sql.SQL(template).format(schema=sql.Identifier(self.schema_name))
            # Constants plus a validated, quoted identifier: a literal in all but type. No
            # statement has a comment or a string literal spanning lines, so lines can be trimmed.
            text = rendered.as_string(None)
            query = "\n".join(line.strip() for line in text.splitlines() if line.strip())
            self._sql[template] = query
        return query

    def _pool_or_open(self) -> ConnectionPool:
        if self._pool is None:
            self.open()
        assert self._pool is not None
        return self._pool

    def _fetch(
        self,
        template: LiteralString,
        params: Mapping[str, Any],
        row_factory: RowFactory[Row],
    ) -> list[Row]:
        """Run one statement, retrying on a broken connection; return its rows.

        Every runtime statement returns rows (a SELECT, or a write with RETURNING).
        """
        pool = self._pool_or_open()
        query = self._query(template)
        for attempt in range(self.connection_retries + 1):
            conn: psycopg.Connection | None = None
            try:
                with pool.connection() as conn, conn.cursor(row_factory=row_factory) as cur:
                    cur.execute(query, params)
                    return cur.fetchall()
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name == "runs_identity_key":
                    raise IdentityConflictError(
                        "a run with the same job, subject, window and version is stored under "
                        "another run id"
                    ) from None
                raise
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                raise SchemaNotMigratedError() from None
            except psycopg.OperationalError as exc:
                broken = conn is None or conn.broken or isinstance(exc, PoolTimeout)
                if not broken or attempt == self.connection_retries:
                    raise LedgerConnectionError(
                        f"ledger statement failed ({type(exc).__name__}): {exc}"
                    ) from exc
                pool.check()  # drop the other connections the same outage broke
                time.sleep(min(0.2 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    def _rows(self, template: LiteralString, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self._fetch(template, params, tuple_row)

    def _lease_write(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` of a lease-only write plus its commit mode (see queries._LEASE_COMMIT)."""
        params["lease_commit"] = None if self.durable_lease_commits else "off"
        return params

    # -- registration and leases -------------------------------------------------------------

    def register(self, identity: RunIdentity) -> RunRecord:
        """Create the run's row if it is new; return the stored record either way."""
        params = _identity_params(identity)
        try:
            rows = self._fetch(queries.REGISTER, params, class_row(RunRecord))
        except IdentityConflictError:
            # ON CONFLICT (run_id) arbitrates on the primary key only: two first registrations
            # racing can trip runs_identity_key instead. The winner has committed by now, so
            # the retry takes the DO UPDATE path; a real conflict raises again.
            rows = self._fetch(queries.REGISTER, params, class_row(RunRecord))
        record = rows[0]
        _check_identity(record, identity)
        return record

    def begin(
        self,
        identity: RunIdentity,
        worker_id: str,
        lease_seconds: float,
        *,
        dagster_run_id: str | None = None,
        step_key: str | None = None,
    ) -> tuple[RunRecord, Lease | None]:
        """:meth:`register` and :meth:`claim` in one round trip (one statement).

        Returns the record and the new lease, or the record and ``None`` when the run is
        completed or another worker holds it (then only its updated_at moves). Raises
        :class:`IdentityConflictError` like :meth:`register`.
        """
        lease_seconds = _check_lease_seconds(lease_seconds)
        params = self._lease_write(
            {
                **_identity_params(identity),
                "worker_id": _check_worker_id(worker_id),
                "lease_seconds": lease_seconds,
                "dagster_run_id": dagster_run_id,
                "step_key": step_key,
            }
        )
        try:
            rows = self._fetch(queries.BEGIN, params, dict_row)
        except IdentityConflictError:  # racing first inserts: see register()
            rows = []
        if not rows:  # a first registration raced this one and has committed: it is seen now
            rows = self._fetch(queries.BEGIN, params, dict_row)
        if not rows:
            raise LedgerError(f"run {identity.run_id} was deleted while being registered")
        claimed = rows[0].pop("claimed")
        record = RunRecord(**rows[0])
        _check_identity(record, identity)
        if not claimed:
            return record, None
        lease = Lease(
            record.run_id,
            worker_id,
            record.lease_epoch,
            record.lock_expires_at,
            lease_seconds,
            record.raw_input,
            record.attempts,
        )
        return record, lease

    def claim(
        self,
        run_id: str,
        worker_id: str,
        lease_seconds: float,
        *,
        dagster_run_id: str | None = None,
        step_key: str | None = None,
    ) -> Lease | None:
        """Take the run's lease; ``None`` if another worker holds it or the run is completed."""
        lease_seconds = _check_lease_seconds(lease_seconds)
        rows = self._rows(
            queries.CLAIM,
            self._lease_write(
                {
                    "run_id": run_id,
                    "worker_id": _check_worker_id(worker_id),
                    "lease_seconds": lease_seconds,
                    "dagster_run_id": dagster_run_id,
                    "step_key": step_key,
                }
            ),
        )
        if not rows:
            return None
        epoch, expires_at, raw_input, attempts = rows[0]
        return Lease(run_id, worker_id, epoch, expires_at, lease_seconds, raw_input, attempts)

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its duration from now (database clock); raise if it was lost.

        Also how a later step (another process, even) takes over a lease handed on to it: the
        owner and epoch are the capability, and the returned lease carries the checkpoint.
        """
        params = self._lease_write({**_fence(lease), "lease_seconds": lease.lease_seconds})
        rows = self._rows(queries.RENEW, params)
        if not rows:
            raise LeaseLostError()
        expires_at, raw_input, attempts, _ = rows[0]
        return replace(lease, expires_at=expires_at, stored_raw_input=raw_input, attempts=attempts)

    def save_raw_input(self, lease: Lease, raw_input: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint the collected input; the first stored value wins and is returned."""
        text = dump_json_object(raw_input, "raw_input")
        params = self._lease_write({**_fence(lease), "raw_input": text})
        rows = self._rows(queries.SAVE_RAW_INPUT, params)
        if not rows:
            raise LeaseLostError()
        stored: dict[str, Any] = rows[0][0]
        return stored

    def complete(
        self,
        lease: Lease,
        output: dict[str, Any],
        notifications: Mapping[str, dict[str, Any]] | None = None,
        usage: ModelUsage | None = None,
    ) -> Completion:
        """Accept ``output`` and queue ``notifications`` in one transaction.

        If the run was already completed, return the stored output: ``accepted`` tells whether
        it was this lease's (a retry after a lost answer) or another attempt's. If the lease was
        lost before completion, raise :class:`LeaseLostError` and write nothing.
        """
        params = {
            **_fence(lease),
            **_usage(usage),
            "output": dump_json_object(output, "output"),
            "notifications": _notifications_json(notifications),
        }
        rows = self._rows(queries.COMPLETE, params)
        if rows:
            return Completion(output=rows[0][0], accepted=True)
        record = self.get(lease.run_id)
        if record is not None and record.status == "completed" and record.output is not None:
            return Completion(output=record.output, accepted=record.lease_epoch == lease.epoch)
        raise LeaseLostError()

    def fail(self, lease: Lease, error: str, usage: ModelUsage | None = None) -> None:
        """Record a failed attempt and free the run for a retry; raise if the lease was lost."""
        error = str(error)[:MAX_ERROR_CHARS] or "unknown error"
        rows = self._rows(queries.FAIL, {**_fence(lease), **_usage(usage), "error": error})
        if rows:
            return
        record = self.get(lease.run_id)
        landed_before = (
            record is not None
            and record.status == "failed"
            and record.lease_epoch == lease.epoch
            and record.last_error == error
        )
        if not landed_before:
            raise LeaseLostError()

    def release(self, lease: Lease) -> None:
        """Give the lease back without an outcome; raise if it was already lost."""
        if self._rows(queries.RELEASE, self._lease_write(_fence(lease))):
            return
        record = self.get(lease.run_id)
        landed_before = (
            record is not None
            and record.status == "pending"
            and record.lease_epoch == lease.epoch
            and record.lock_owner is None
        )
        if not landed_before:
            raise LeaseLostError()

    # -- reading -----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of a run, or ``None``."""
        rows = self._fetch(queries.GET_RUN, {"run_id": run_id}, class_row(RunRecord))
        return rows[0] if rows else None

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every successful claim of the run, oldest first."""
        return self._fetch(queries.LIST_ATTEMPTS, {"run_id": run_id}, class_row(AttemptRecord))

    def outbox(
        self, run_id: str | None = None, *, pending_only: bool = False, limit: int = 1000
    ) -> list[OutboxRecord]:
        """Outbox rows, optionally of one run and/or only those not delivered yet."""
        return self._fetch(
            queries.LIST_OUTBOX,
            {"run_id": run_id, "pending_only": pending_only, "limit": limit},
            class_row(OutboxRecord),
        )

    def list_runs(
        self,
        *,
        job_name: str | None = None,
        subject_id: str | None = None,
        status: RunStatus | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = 100,
    ) -> list[RunRecord]:
        """Runs, newest window first (``limit=None``: all); ``since``/``until`` bound the
        window start, ``until`` exclusive."""
        params = {
            "job_name": job_name,
            "subject_id": subject_id,
            "status": status,
            "since": since,
            "until": until,
            "limit": limit,
        }
        return self._fetch(queries.LIST_RUNS, params, class_row(RunRecord))

    def resolve_run_id(self, prefix: str) -> str:
        """The one run id starting with ``prefix`` (hex); raise if none or several match."""
        prefix = prefix.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix) or len(prefix) > 64:
            raise InvalidInputError("run_id", f"{prefix!r} is not a run id or a hex prefix of one")
        matches = [r[0] for r in self._rows(queries.RUN_IDS_BY_PREFIX, {"prefix": prefix})]
        if len(matches) != 1:
            many = "several runs" if matches else "no run"
            raise RunNotFoundError(f"run id prefix {prefix!r} matches {many}")
        return str(matches[0])

    def revisions(self, run_id: str) -> list[RevisionRecord]:
        """The accepted results a run had before each explicit revision, oldest first."""
        return self._fetch(queries.LIST_REVISIONS, {"run_id": run_id}, class_row(RevisionRecord))

    def revise(
        self,
        run_id: str,
        reason: str,
        *,
        channels: Sequence[str] = (),
        recollect: bool = False,
        requested_by: str | None = None,
    ) -> RunRecord:
        """Reopen a completed run for recomputation: the only way a result is ever replaced.

        The accepted output moves to ``run_revisions`` with ``reason``; the run becomes pending
        under the next revision, keeping its raw input unless ``recollect``. The next completion
        queues notifications only for ``channels`` (none: the new result is stored silently).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("reason", "must say why the result is recomputed")
        for channel in channels:
            _check_channel("channels", channel)
        params = {
            "run_id": run_id,
            "reason": reason.strip()[:MAX_ERROR_CHARS],
            "channels": list(channels),
            "recollect": recollect,
            "requested_by": requested_by,
        }
        rows = self._fetch(queries.REVISE, params, class_row(RunRecord))
        if rows:
            return rows[0]
        record = self.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        raise InvalidInputError(
            "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
        )

    def expired_leases(self) -> list[RunRecord]:
        """Running runs whose lease expired (by the database clock) without completion."""
        return self._fetch(queries.EXPIRED_LEASES, {}, class_row(RunRecord))

    def stale_outbox(self, older_than_seconds: float) -> list[OutboxRecord]:
        """Undelivered notifications queued more than ``older_than_seconds`` ago."""
        params = {"older_than_seconds": float(older_than_seconds)}
        return self._fetch(queries.STALE_OUTBOX, params, class_row(OutboxRecord))

    def failed_past_retries(self, max_attempts: int) -> list[RunRecord]:
        """Failed runs that have used ``max_attempts`` claims or more."""
        params = {"max_attempts": max_attempts}
        return self._fetch(queries.FAILED_PAST_RETRIES, params, class_row(RunRecord))

    # -- delivery ----------------------------------------------------------------------------

    def deliver_outbox(
        self,
        send: Callable[[OutboxRecord], None],
        *,
        run_id: str | None = None,
        limit: int = 100,
    ) -> DeliveryReport:
        """Send undelivered notifications once each, keyed ``<run_id>:<channel>``.

        Each row is locked (``FOR UPDATE SKIP LOCKED``) while ``send`` runs, so concurrent
        deliverers never send the same row at once. A crash between a successful send and the
        mark re-sends later with the same key: receivers deduplicate on it.
        """
        delivered: list[OutboxRecord] = []
        failed: list[tuple[OutboxRecord, str]] = []
        for candidate in self.outbox(run_id, pending_only=True, limit=limit):
            with self._transaction() as conn:
                key = {
                    "run_id": candidate.run_id,
                    "channel": candidate.channel,
                    "revision": candidate.revision,
                }
                with conn.cursor(row_factory=class_row(OutboxRecord)) as cur:
                    row = cur.execute(self._query(queries.LOCK_UNDELIVERED), key).fetchone()
                if row is None:  # delivered meanwhile, or another deliverer holds it
                    continue
                try:
                    send(row)
                except Exception as exc:  # the receiver's failure is recorded, not raised
                    reason = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
                    conn.execute(
                        self._query(queries.MARK_DELIVERY_FAILED), {**key, "error": reason}
                    )
                    failed.append((row, reason))
                    continue
                conn.execute(self._query(queries.MARK_DELIVERED), key)
                delivered.append(row)
        return DeliveryReport(delivered, failed)

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection]:
        """A transaction in pipeline mode: BEGIN travels with the first statement, COMMIT with
        the last, so a lock-send-mark delivery costs two round trips instead of four."""
        pool = self._pool_or_open()
        try:
            with pool.connection() as conn, conn.pipeline(), conn.transaction():
                yield conn
        except psycopg.OperationalError as exc:
            raise LedgerConnectionError(f"ledger transaction failed: {exc}") from exc


__all__ = ["RunLedger"]
