"""The run ledger: durable run records in their own PostgreSQL schema, usable without Dagster.

PostgreSQL is the only authority: uniqueness is a constraint, the lease is one atomic UPDATE whose
expiry is the database clock, and every write after a claim is fenced by owner and epoch (see
``sql/ledger.sql``). Each method is one statement on an autocommit connection (the
:class:`~idempotent_jobs.core.executor.Executor` runs it), so a method is one round trip and one
transaction, and safe to retry when the connection drops. Lease-only writes do not wait for the WAL
flush unless ``durable_lease_commits`` is set (why that is safe: ``sql/ledger.sql``).
"""

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any, TypeVar

from psycopg import Cursor
from psycopg.rows import RowMaker, dict_row
from psycopg_pool import ConnectionPool

from idempotent_jobs.core import telemetry
from idempotent_jobs.core.budgets import BudgetSpend, TokenBudget
from idempotent_jobs.core.constants import DEFAULT_SCHEMA
from idempotent_jobs.core.error_text import describe_error, safe_text
from idempotent_jobs.core.errors import (
    IdentityConflictError,
    InvalidInputError,
    LeaseLostError,
    LedgerError,
    RunNotFoundError,
    StaleCandidateError,
)
from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.identity import RunIdentity, normalize_text
from idempotent_jobs.core.json_values import MAX_JSON_BYTES, dump_json_object, text_fingerprint
from idempotent_jobs.core.records import (
    AttemptRecord,
    Basis,
    CallOrigin,
    CallOutcome,
    Completion,
    DeliveryReport,
    DrillRecord,
    FenceOutcome,
    JobConfig,
    Lease,
    ModelCallRecord,
    ModelUsage,
    OutboxRecord,
    RevisionRecord,
    RunRecord,
)
from idempotent_jobs.core.upgrade import MigrationReport
from idempotent_jobs.core.usage import recordable_usage

Row = TypeVar("Row")


@cache
def _field_names(cls: Callable[..., object]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def record_from(cls: Callable[..., Row], row: Mapping[str, Any]) -> Row:
    """A record from a row's columns, ignoring columns the record has no field for (a
    ``SELECT *`` keeps working when a later migration adds one)."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in row.items() if k in names})


def record_row(cls: Callable[..., Row]) -> Callable[[Cursor[Any]], RowMaker[Row]]:
    """A psycopg row factory building ``cls`` records with :func:`record_from`."""

    def factory(cursor: Cursor[Any]) -> RowMaker[Row]:
        make_dict = dict_row(cursor)

        def make(values: Sequence[Any]) -> Row:
            return record_from(cls, make_dict(values))

        return make

    return factory


#: The default size limit of a raw input and of an output, as JSON text: a ledger row is no
#: place for a bulk payload (keep those in object storage and checkpoint a reference).
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


def _check_payload_limit(field: str, limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(field, f"must be a whole number of bytes, got {limit!r}")
    if not 1 <= limit <= MAX_JSON_BYTES:
        raise InvalidInputError(field, f"must be 1 to {MAX_JSON_BYTES} bytes, got {limit}")
    return limit


def _within(text: str, field: str, limit: int) -> str:
    """``text`` if it fits ``limit`` bytes; checked before anything is written."""
    size = len(text.encode("utf-8"))
    if size > limit:
        raise InvalidInputError(
            field, f"is {size:,} bytes as JSON, over the limit of {limit:,} (max_{field}_bytes)"
        )
    return text


MAX_LEASE_SECONDS = 24 * 3600.0
MAX_NAME_CHARS = 200
MAX_CHANNEL_CHARS = 100
MAX_REASON_CHARS = 2000
_NO_USAGE = ModelUsage()


def _check_name(field: str, value: object, limit: int = MAX_NAME_CHARS) -> str:
    """A short free-text column (worker id, caller run id, step, model, requested_by)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(field, "must be a non-empty string")
    if len(value) > limit:
        raise InvalidInputError(field, f"must be at most {limit} characters, got {len(value)}")
    if not value.isprintable():
        raise InvalidInputError(field, "must not contain control or other unprintable characters")
    return value


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError("limit", f"must be a whole number, got {limit!r}")
    if limit < 1:
        raise InvalidInputError("limit", f"must be at least 1, got {limit}")
    return limit


def _optional_name(field: str, value: str | None) -> str | None:
    return None if value is None else _check_name(field, value)


def _check_worker_id(worker_id: str) -> str:
    return _check_name("worker_id", worker_id)


def _check_lease_seconds(lease_seconds: float) -> float:
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
        raise InvalidInputError("lease_seconds", "must be a number of seconds")
    if not 0 < lease_seconds <= MAX_LEASE_SECONDS:
        raise InvalidInputError("lease_seconds", f"must be > 0 and <= {MAX_LEASE_SECONDS:.0f}")
    return float(lease_seconds)


def _check_channel(field: str, channel: object) -> None:
    """A channel name is part of the idempotency key ``<run_id>:<channel>[:r<revision>]``, so a
    ``:`` in it could produce another channel's key (``ops:r1`` at revision 0 is ``ops`` at 1)."""
    if not isinstance(channel, str) or not channel.strip() or not channel.isprintable():
        raise InvalidInputError(field, f"channel name {channel!r} is not valid")
    if ":" in channel:
        raise InvalidInputError(
            field, f"channel name {channel!r} must not contain ':' (it separates the key's parts)"
        )
    if len(channel) > MAX_CHANNEL_CHARS:
        raise InvalidInputError(
            field, f"channel name {channel[:20]!r}... is longer than {MAX_CHANNEL_CHARS}"
        )


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


def _stale(run_id: str, candidate: Basis, current: Basis) -> StaleCandidateError:
    def show(basis: Basis) -> str:
        checkpoint = (basis.input_fingerprint or "none")[:12]
        return f"revision {basis.revision}, checkpoint {checkpoint}"

    return StaleCandidateError(
        f"run {run_id}: the answer was computed on {show(candidate)}, the run is now on "
        f"{show(current)}; it was not accepted and nothing was sent",
        run_id=run_id,
        candidate=candidate,
        current=current,
    )


def _origin(origin: CallOrigin | None) -> dict[str, Any]:
    origin = origin or CallOrigin()
    return {
        "call_caller_step": _optional_name("caller_step", origin.caller_step),
        "call_caller_run_id": _optional_name("caller_run_id", origin.caller_run_id),
        "call_retry": origin.retry_number,
    }


def _fence(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.run_id, "worker_id": lease.worker_id, "epoch": lease.epoch}


def _model_name(name: str | None) -> str | None:
    """The model name a provider reported, kept to 200 printable characters: it arrives with an
    answer already paid for, so it is trimmed rather than refused."""
    if name is None:
        return None
    text = "".join(ch if ch.isprintable() else "?" for ch in str(name))
    return text[:MAX_NAME_CHARS]


def _job_names(names: Collection[str] | None) -> list[str] | None:
    """Identity job names as the ledger stores them (NFC), for a ``job_names`` filter."""
    if names is None:
        return None
    if isinstance(names, str):
        raise InvalidInputError("job_names", "must be a collection of job names, not one string")
    return sorted({normalize_text(name) for name in names})


def _budget_params(budget: TokenBudget) -> dict[str, Any]:
    return {
        "tokens_per_day": budget.tokens_per_day,
        "tokens_per_subject_per_day": budget.tokens_per_subject_per_day,
    }


def _usage(usage: ModelUsage | None) -> dict[str, Any]:
    """The columns of a call's usage: only believable counts (a bad one is stored as NULL, so
    recording a paid call never fails on it; see :mod:`idempotent_jobs.core.usage`)."""
    usage = recordable_usage(usage) or _NO_USAGE
    return {
        "model_name": _model_name(usage.model_name),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


class RunLedger:
    """Durable record of logical runs: registration, fenced leases, checkpoint, commit, outbox.

    ``RunLedger(conninfo)`` takes a PostgreSQL URL or libpq conninfo string (it may hold a
    password: it is never shown). The pool opens on first use (``close()`` or a ``with`` block
    closes it), or pass ``pool=`` a psycopg ``ConnectionPool`` of autocommit connections that
    you open and close. Opening verifies the schema and never runs DDL: call :meth:`migrate` (or
    ``idempotent-jobs migrate``) once per database. In Dagster, the
    :class:`~idempotent_jobs.dagster.resource.RunLedgerResource` creates one per run.

    ``durable_lease_commits``: wait for the WAL flush on lease-only writes too (claim,
    checkpoint, renew, release). Off, those commit without waiting: visible at once, lost only if
    the server crashes within a few hundred ms, which the fence makes harmless. Results, outbox
    rows and failures always wait for the flush.

    ``prepared_statements``: prepare each statement on the server at first use (``True``), never
    (``False``), or, unset, unless opening finds a connection pooler such as PgBouncer between
    the ledger and PostgreSQL (PgBouncer before 1.21 in transaction mode cannot keep them).
    """

    executor_class: type[Executor] = Executor  # how statements run (a benchmark counts them)

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool: ConnectionPool | None = None,
        pool_min_size: int = 1,
        pool_max_size: int = 4,
        connect_timeout_seconds: float = 10.0,
        connection_retries: int = 3,
        durable_lease_commits: bool = False,
        max_raw_input_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_output_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        prepared_statements: bool | None = None,
    ) -> None:
        self.max_raw_input_bytes = _check_payload_limit("max_raw_input_bytes", max_raw_input_bytes)
        self.max_output_bytes = _check_payload_limit("max_output_bytes", max_output_bytes)
        self._db = self.executor_class(
            conninfo,
            schema=schema,
            pool=pool,
            pool_min_size=pool_min_size,
            pool_max_size=pool_max_size,
            connect_timeout_seconds=connect_timeout_seconds,
            connection_retries=connection_retries,
            prepared_statements=prepared_statements,
        )
        self.durable_lease_commits = durable_lease_commits
        self._declared_budgets: set[tuple[str, TokenBudget]] = set()

    def __repr__(self) -> str:  # the conninfo may hold a password: never shown
        return f"RunLedger(schema={self.schema!r})"

    @property
    def executor(self) -> Executor:
        """The statements' executor and its pool: the operator reads
        (:class:`~idempotent_jobs.core.operator_reads.LedgerReads`) and retention
        (:mod:`idempotent_jobs.core.retention`) run over it, outside the worker's path."""
        return self._db

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the ledger's tables."""
        return self._db.schema

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Verify the schema and open the connection pool; a no-op when already open."""
        self._db.open()

    def close(self) -> None:
        """Close the pool this ledger opened (it can be opened again)."""
        self._db.close()

    def __enter__(self) -> "RunLedger":
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def migrate(self) -> list[str]:
        """Apply missing migrations and the upgrade steps (idempotent, serialised by an advisory
        lock); return the migrations applied now. :meth:`upgrade` says what else it did."""
        return self._db.migrate().applied

    def upgrade(self) -> MigrationReport:
        """:meth:`migrate`, returning its whole report: the migrations applied, what was done
        besides (identities normalised, grants) and what an operator should look at."""
        return self._db.migrate()

    def missing_privileges(self) -> tuple[str, list[str]]:
        """The connected role's name, and what it lacks of the privileges workers need
        (``PRIVILEGE on schema.table``; empty when it has them all)."""
        return self._db.privileges()

    def _lease_write(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` of a lease-only write plus its commit mode (see ``sql/ledger.sql``)."""
        params["lease_commit"] = None if self.durable_lease_commits else "off"
        return params

    # -- registration and leases -------------------------------------------------------------

    def register(self, identity: RunIdentity) -> RunRecord:
        """Create the run's row if it is new; return the stored record either way."""
        params = _identity_params(identity)
        try:
            rows = self._db.fetch("register", params, record_row(RunRecord))
        except IdentityConflictError:
            # The identity key holds another run id: see _stored_id_of.
            params = self._stored_id_of(params)
            rows = self._db.fetch("register", params, record_row(RunRecord))
        record = rows[0]
        _check_identity(record, identity)
        return record

    def _stored_id_of(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` under the run id stored for their identity fields, after the identity key
        refused them. ON CONFLICT (run_id) arbitrates on the primary key only, so this is either
        a first registration that raced this one (the same id: the retry takes the existing-row
        path) or a run an earlier release registered in another Unicode form, whose fields
        migrate put in NFC under its old id (core/upgrade.py): the retry works on that run."""
        rows = self._db.rows("run_id_by_identity", params)
        return {**params, "run_id": rows[0][0]} if rows else params

    def begin(
        self,
        identity: RunIdentity,
        worker_id: str,
        lease_seconds: float,
        *,
        caller_run_id: str | None = None,
        caller_step: str | None = None,
    ) -> tuple[RunRecord, Lease | None]:
        """:meth:`register` and :meth:`claim` in one round trip (one statement).

        Returns the record and the new lease, or the record and ``None`` when the run is
        completed (nothing is written) or another worker holds it (then only its updated_at
        moves). Raises :class:`IdentityConflictError` like :meth:`register`.
        """
        lease_seconds = _check_lease_seconds(lease_seconds)
        params = self._lease_write(
            {
                **_identity_params(identity),
                "worker_id": _check_worker_id(worker_id),
                "lease_seconds": lease_seconds,
                "caller_run_id": _optional_name("caller_run_id", caller_run_id),
                "caller_step": _optional_name("caller_step", caller_step),
            }
        )
        rows: list[dict[str, Any]] = []
        for attempt in range(3):
            # No row: a first registration raced this one, or the run completed while this
            # statement waited for its lock. Either has committed and is seen by the next try.
            try:
                rows = self._db.fetch("begin", params, dict_row)
            except IdentityConflictError:  # see _stored_id_of
                if attempt:
                    raise  # a real conflict raises again
                params = self._stored_id_of(params)
                continue
            if rows:
                break
        if not rows:
            raise LedgerError(f"run {identity.run_id} was deleted while being registered")
        claimed = rows[0]["claimed"]
        record = record_from(RunRecord, rows[0])
        _check_identity(record, identity)
        if not claimed:
            return record, None
        lease = Lease(
            run_id=record.run_id,
            worker_id=worker_id,
            epoch=record.lease_epoch,
            expires_at=record.lease_expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=record.raw_input,
            attempts=record.attempts,
            revision=record.revision,
            input_fingerprint=record.input_fingerprint,
            drill_armed=rows[0]["drill_armed"],
        )
        return record, lease

    def claim(
        self,
        run_id: str,
        worker_id: str,
        lease_seconds: float,
        *,
        caller_run_id: str | None = None,
        caller_step: str | None = None,
    ) -> Lease | None:
        """Take the run's lease; ``None`` if another worker holds it or the run is completed."""
        lease_seconds = _check_lease_seconds(lease_seconds)
        rows = self._db.rows(
            "claim",
            self._lease_write(
                {
                    "run_id": run_id,
                    "worker_id": _check_worker_id(worker_id),
                    "lease_seconds": lease_seconds,
                    "caller_run_id": _optional_name("caller_run_id", caller_run_id),
                    "caller_step": _optional_name("caller_step", caller_step),
                }
            ),
        )
        if not rows:
            return None
        epoch, expires_at, raw_input, attempts, revision, fingerprint = rows[0]
        return Lease(
            run_id=run_id,
            worker_id=worker_id,
            epoch=epoch,
            expires_at=expires_at,
            lease_seconds=lease_seconds,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
        )

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its duration from now (database clock); raise if it was lost.

        Also how a later step (another process, even) takes over a lease handed on to it: the
        owner and epoch are the capability, and the returned lease carries the checkpoint.
        """
        params = self._lease_write({**_fence(lease), "lease_seconds": lease.lease_seconds})
        rows = self._db.rows("renew", params)
        if not rows:
            raise LeaseLostError()
        expires_at, raw_input, attempts, revision, fingerprint, _ = rows[0]
        return replace(
            lease,
            expires_at=expires_at,
            stored_raw_input=raw_input,
            attempts=attempts,
            revision=revision,
            input_fingerprint=fingerprint,
        )

    def checkpoint(self, lease: Lease, raw_input: dict[str, Any]) -> Lease:
        """Checkpoint the collected input; the first stored value wins. Returns the lease with
        the stored checkpoint and its fingerprint: the :class:`Basis` of an answer computed on
        it."""
        text = _within(
            dump_json_object(raw_input, "raw_input"), "raw_input", self.max_raw_input_bytes
        )
        params = self._lease_write(
            {**_fence(lease), "raw_input": text, "input_fingerprint": text_fingerprint(text)}
        )
        rows = self._db.rows("save_raw_input", params)
        if not rows:
            raise LeaseLostError()
        stored, fingerprint, _ = rows[0]
        return replace(lease, stored_raw_input=stored, input_fingerprint=fingerprint)

    def check_storable_output(self, output: object) -> None:
        """Raise :class:`InvalidInputError` naming ``output`` if :meth:`complete` could not store
        it (not a JSON object, NaN, NUL, too deep, over ``max_output_bytes``). Nothing is
        written: a caller checks an answer before it decides the call's outcome."""
        _within(dump_json_object(output, "output"), "output", self.max_output_bytes)

    def save_raw_input(self, lease: Lease, raw_input: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint the collected input; the first stored value wins and is returned."""
        stored = self.checkpoint(lease, raw_input).stored_raw_input
        assert stored is not None
        return stored

    def complete(
        self,
        lease: Lease,
        output: dict[str, Any],
        notifications: Mapping[str, dict[str, Any]] | None = None,
        usage: ModelUsage | None = None,
        *,
        basis: Basis | None = None,
        config: JobConfig | None = None,
        origin: CallOrigin | None = None,
    ) -> Completion:
        """Accept ``output`` and queue ``notifications`` in one transaction.

        ``basis`` is what the output was computed against (default: the lease's revision and
        checkpoint, right when the lease is the one the output was computed under). The output
        is accepted only while the run is still on that basis; otherwise nothing of it is
        stored or sent, the lease is given back, the attempt is recorded ``superseded``, and
        :class:`StaleCandidateError` is raised. ``config`` is recorded with the result, and
        the model call that produced ``output`` (``usage``, made at ``origin``) in
        ``model_calls``, as accepted or stale.

        If the run was already completed, return the stored output: ``accepted`` tells whether
        it was this lease's (a retry after a lost answer) or another attempt's. If the lease was
        lost before completion, raise :class:`LeaseLostError` having written nothing of the run:
        only the model call, as ``lease_lost`` (:meth:`record_lost_call`), which a later commit
        of the same answer from the same caller run, step and retry updates.
        """
        basis = basis or lease.basis
        config = config or JobConfig()
        parts = dict(config.parts)
        params = {
            **_fence(lease),
            **_usage(usage),
            **_origin(origin),
            "output": _within(dump_json_object(output, "output"), "output", self.max_output_bytes),
            "notifications": _notifications_json(notifications),
            "revision": basis.revision,
            "input_fingerprint": basis.input_fingerprint,
            "config_fingerprint": config.fingerprint if parts else None,
            "config_parts": dump_json_object(parts, "config") if parts else None,
        }
        [(outcome, stored, revision, fingerprint, mine, stored_parts)] = self._db.rows(
            "complete", params
        ) or [("lease_lost", None, None, None, False, None)]
        if outcome == FenceOutcome.APPLIED:
            return Completion(output=stored, accepted=True, config_parts=parts or None)
        if outcome == FenceOutcome.STALE:
            raise _stale(
                lease.run_id, basis, Basis(revision=revision, input_fingerprint=fingerprint)
            )
        if outcome == FenceOutcome.ALREADY_DONE and stored is not None:
            if not mine:  # another attempt completed the run: this call is still paid for
                self.record_lost_call(lease, usage, basis.revision, origin=origin)
            return Completion(output=stored, accepted=bool(mine), config_parts=stored_parts)
        self.record_lost_call(lease, usage, basis.revision, origin=origin)
        raise LeaseLostError()

    def fail(
        self,
        lease: Lease,
        error: str,
        usage: ModelUsage | None = None,
        *,
        call: CallOutcome | None = None,
        origin: CallOrigin | None = None,
        drilled: bool = False,
        refused_by_budget: bool = False,
    ) -> FenceOutcome:
        """Record a failed attempt and free the run for a retry; raise if the lease was lost.

        ``drilled``: the failure was made on purpose by a drill; the attempt ends ``drill``.
        ``refused_by_budget``: the job's token budget refused the model call; it ends ``budget``.

        Returns ``applied``, or ``already_done`` when this very failure had landed (a retry
        after a lost answer). ``error`` is stored made safe (:func:`safe_text`).

        ``call`` says a model call ended this way (``failed``: it raised; ``rejected``: the
        validator refused its answer); it is recorded with ``usage`` in ``model_calls``, even
        when the lease was lost (then as ``lease_lost``, :meth:`record_lost_call`).
        """
        error = safe_text(str(error)) or "unknown error"
        if call not in (None, "failed", "rejected"):
            raise InvalidInputError("call", f"must be 'failed' or 'rejected', got {call!r}")
        params = {
            **_fence(lease),
            **_usage(usage),
            **_origin(origin),
            "error": error,
            "call_outcome": call,
            "attempt_outcome": (
                "drill" if drilled else "budget" if refused_by_budget else "failed"
            ),
        }
        try:
            return self._fenced("fail", params)
        except LeaseLostError:
            if call is not None:
                self.record_lost_call(lease, usage, lease.revision, origin=origin, error=error)
            raise

    def record_answer(
        self,
        lease: Lease,
        output: dict[str, Any],
        usage: ModelUsage | None,
        *,
        basis: Basis,
        config: JobConfig,
        origin: CallOrigin,
    ) -> None:
        """Record the paid call that answered ``output`` (outcome ``answered``: usage, model,
        epoch, counted in the spend), with the answer and its basis and configuration, before
        the answer crosses a step boundary. :meth:`complete` (or :meth:`fail`) later updates
        this row, matched by ``origin``; :meth:`recorded_answer` finds it for a later attempt.
        Raises :class:`LeaseLostError` (the call recorded ``lease_lost``) if the lease was lost.
        """
        parts = dict(config.parts)
        params = {
            **_fence(lease),
            **_usage(usage),
            **_origin(origin),
            "revision": basis.revision,
            "input_fingerprint": basis.input_fingerprint,
            "answer": _within(dump_json_object(output, "output"), "output", self.max_output_bytes),
            "config_parts": dump_json_object(parts, "config") if parts else None,
        }
        if self._db.rows("record_answer", params):
            return
        try:  # no row: recorded already (a retried statement), or the lease was lost
            self.renew(lease)
        except LeaseLostError:
            self.record_lost_call(lease, usage, basis.revision, origin=origin)
            raise

    def recorded_answer(self, lease: Lease) -> dict[str, Any] | None:
        """The latest answer recorded by :meth:`record_answer` and not committed yet, on the
        lease's revision and checkpoint (its columns as a dict), or ``None``."""
        params = {
            "run_id": lease.run_id,
            "revision": lease.revision,
            "input_fingerprint": lease.input_fingerprint,
        }
        rows = self._db.fetch("recorded_answer", params, dict_row)
        return rows[0] if rows else None

    def end_caller_attempt(self, run_id: str, caller_run_id: str, error: str) -> FenceOutcome:
        """End, as failed, the attempt that the Dagster run ``caller_run_id`` holds on the run,
        for a step that failed before its body could (its input could not be loaded, its
        output not stored). Fenced by the Dagster run that claimed the lease: a lease another
        run or worker has taken since is never touched. ``applied`` or ``lease_lost``."""
        params = {
            "run_id": run_id,
            "caller_run_id": _check_name("caller_run_id", caller_run_id),
            "error": safe_text(str(error)) or "unknown error",
        }
        rows = self._db.rows("fail_by_caller", params)
        return FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST

    def store_step_output(
        self, dagster_run_id: str, step_key: str, output_name: str, value: dict[str, Any]
    ) -> None:
        """Keep ``value`` (JSON) as what a Dagster step hands the next (the ledger IO manager);
        ``value["run_id"]``, when it names a registered run, ties it to that run."""
        params = {
            "dagster_run_id": _check_name("dagster_run_id", dagster_run_id),
            "step_key": _check_name("step_key", step_key),
            "output_name": _check_name("output_name", output_name),
            "run_id": value.get("run_id") if isinstance(value.get("run_id"), str) else None,
            "value": dump_json_object(value, "step output"),
        }
        self._db.rows("store_step_output", params)

    def load_step_output(
        self, dagster_run_id: str, step_key: str, output_name: str
    ) -> dict[str, Any] | None:
        """What :meth:`store_step_output` kept for that Dagster run, step and output."""
        params = {
            "dagster_run_id": dagster_run_id,
            "step_key": step_key,
            "output_name": output_name,
        }
        rows = self._db.rows("load_step_output", params)
        return dict(rows[0][0]) if rows else None

    def record_lost_call(
        self,
        lease: Lease,
        usage: ModelUsage | None,
        revision: int,
        *,
        origin: CallOrigin | None = None,
        error: str | None = None,
    ) -> bool:
        """Record the model call ``lease`` paid for after the lease was lost (taken over by
        another claim), as ``lease_lost`` with its usage: nothing else of the attempt can be
        written, but what the call cost is never left out. Once per epoch and worker; returns
        whether a row was added. Never raises: the caller is already failing."""
        params = {
            **_fence(lease),
            **_usage(usage),
            **_origin(origin),
            "revision": revision,
            "error": safe_text(error) if error else "the lease was lost before the call ended",
        }
        try:
            return bool(self._db.rows("record_lost_call", params))
        except Exception:  # an outage: the LeaseLostError that follows says enough
            return False

    def release(self, lease: Lease) -> FenceOutcome:
        """Give the lease back without an outcome; raise if it was already lost (``applied``,
        or ``already_done`` when this release had landed)."""
        return self._fenced("release", self._lease_write(_fence(lease)))

    def _fenced(self, name: str, params: dict[str, Any]) -> FenceOutcome:
        """Run fenced statement ``name``; its outcome, or :class:`LeaseLostError`."""
        rows = self._db.rows(name, params)
        outcome = FenceOutcome(rows[0][0]) if rows else FenceOutcome.LEASE_LOST
        if outcome == FenceOutcome.LEASE_LOST:
            raise LeaseLostError()
        return outcome

    # -- budgets -------------------------------------------------------------------------------

    def check_budget(self, lease: Lease, budget: TokenBudget) -> BudgetSpend:
        """What the run's job and subject have spent today against ``budget``; raise
        :class:`BudgetExceededError` when a limit is spent (see :mod:`.budgets`). The first
        check of a job by this ledger records the budget its workers enforce."""
        rows = self._db.fetch(
            "budget_check", {"run_id": lease.run_id, **_budget_params(budget)}, dict_row
        )
        if not rows:
            raise RunNotFoundError(f"run {lease.run_id} is not registered")
        spend = BudgetSpend(budget=budget, **rows[0])
        declared = (spend.job_name, budget)
        if declared not in self._declared_budgets:
            self._db.rows("declare_budget", {"job_name": spend.job_name, **_budget_params(budget)})
            self._declared_budgets.add(declared)
        if spend.refused is not None:
            raise spend.error()
        return spend

    def price_rows(self) -> list[dict[str, Any]]:
        """Every model's price per million tokens, as rows (the metrics' money figure; see
        :mod:`idempotent_jobs.core.costs` for the operator's side)."""
        return self._db.fetch("list_prices", {}, dict_row)

    # -- failure drills ------------------------------------------------------------------------

    def arm_drill(
        self, job_name: str, calls: int, seconds: float, *, armed_by: str | None = None
    ) -> DrillRecord:
        """Make the next ``calls`` model calls of ``job_name`` (identity job name; ``*``: every
        job) fail on purpose, for at most ``seconds``; every worker sees it."""
        if not isinstance(calls, int) or isinstance(calls, bool) or not 0 < calls <= 10**7:
            raise InvalidInputError(
                "calls", f"must be a whole number from 1 to 10^7, got {calls!r}"
            )
        if not (isinstance(seconds, int | float) and 0 < seconds <= 10 * 366 * 86400):
            raise InvalidInputError("seconds", f"must be from 0 to ten years, got {seconds!r}")
        params = {
            "job_name": normalize_text(job_name) if job_name != "*" else "*",
            "calls": calls,
            "seconds": float(seconds),
            "armed_by": _optional_name("armed_by", armed_by),
        }
        [drill] = self._db.fetch("arm_drill", params, record_row(DrillRecord))
        return drill

    def disarm_drills(self, job_name: str | None = None) -> list[DrillRecord]:
        """End the drill of ``job_name`` (every drill when ``None``); return those ended."""
        params = {"job_name": job_name}
        return self._db.fetch("disarm_drills", params, record_row(DrillRecord))

    def take_drill(self, job_name: str) -> int | None:
        """Use up one drilled failure for a model call of ``job_name``: the calls the drill
        still fails after this one, or ``None`` when no drill takes it."""
        rows = self._db.rows("take_drill", {"job_name": normalize_text(job_name)})
        return int(rows[0][1]) if rows else None

    # -- reading -----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of a run, or ``None``."""
        rows = self._db.fetch("get_run", {"run_id": run_id}, record_row(RunRecord))
        return rows[0] if rows else None

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every successful claim of the run, oldest first."""
        return self._db.fetch("list_attempts", {"run_id": run_id}, record_row(AttemptRecord))

    def model_calls(self, run_id: str) -> list[ModelCallRecord]:
        """Every recorded model call of the run, oldest first (see :class:`CallCosts`)."""
        return self._db.fetch("list_model_calls", {"run_id": run_id}, record_row(ModelCallRecord))

    def outbox(
        self,
        run_id: str | None = None,
        *,
        pending_only: bool = False,
        limit: int = 1000,
        job_names: Collection[str] | None = None,
    ) -> list[OutboxRecord]:
        """Outbox rows, optionally of one run, of the identity jobs ``job_names``, and/or only
        those not delivered yet."""
        params = {
            "run_id": run_id,
            "pending_only": pending_only,
            "limit": check_limit(limit),
            "job_names": _job_names(job_names),
        }
        return self._db.fetch("list_outbox", params, record_row(OutboxRecord))

    def revisions(self, run_id: str) -> list[RevisionRecord]:
        """The accepted results a run had before each explicit revision, oldest first."""
        return self._db.fetch("list_revisions", {"run_id": run_id}, record_row(RevisionRecord))

    # -- revisions ---------------------------------------------------------------------------

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
        under the next revision, keeping its raw input unless ``recollect`` (required when
        retention pruned the raw input). The next completion
        queues notifications only for ``channels`` (none: the new result is stored silently).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("reason", "must say why the result is recomputed")
        if len(reason.strip()) > MAX_REASON_CHARS:
            raise InvalidInputError("reason", f"must be at most {MAX_REASON_CHARS} characters")
        if isinstance(channels, str):
            raise InvalidInputError("channels", "must be a list of channel names, not one string")
        for channel in channels:
            _check_channel("channels", channel)
        params = {
            "run_id": run_id,
            "reason": reason.strip(),
            "channels": list(dict.fromkeys(channels)),
            "recollect": bool(recollect),
            "requested_by": _optional_name("requested_by", requested_by),
        }
        rows = self._db.fetch("revise", params, record_row(RunRecord))
        if rows:
            return rows[0]
        record = self.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        if record.status == "completed" and record.raw_input_pruned_at is not None:
            raise InvalidInputError(
                "recollect",
                f"the raw input of run {run_id} was pruned "
                f"{record.raw_input_pruned_at.isoformat(timespec='seconds')}: revise it with "
                "recollect (--recollect) to collect the input again",
            )
        raise InvalidInputError(
            "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
        )

    # -- delivery ----------------------------------------------------------------------------

    def deliver_outbox(
        self,
        send: Callable[[OutboxRecord], None],
        *,
        run_id: str | None = None,
        limit: int = 100,
        job_names: Collection[str] | None = None,
    ) -> DeliveryReport:
        """Send undelivered notifications once each, keyed ``<run_id>:<channel>``.

        Each row is locked (``FOR UPDATE SKIP LOCKED``) while ``send`` runs, so concurrent
        deliverers never send the same row at once. A crash between a successful send and the
        mark re-sends later with the same key: receivers deduplicate on it.

        ``job_names``: only rows of these identity jobs are sent (a deliverer passes the jobs
        its code location owns, so on a shared ledger another team's rows are never sent
        through its channels); the report counts, by job, the pending rows it left.
        ``None`` sends every job's rows (the caller routes each row by its ``job_name``).
        """
        with telemetry.span("idempotent_jobs.deliver") as span:
            report = self._deliver(send, run_id, limit, job_names)
            telemetry.annotate(span, delivered=len(report.delivered), failed=len(report.failed))
        for row in report.delivered:
            telemetry.count_notification(row.channel, "delivered")
        for row, _ in report.failed:
            telemetry.count_notification(row.channel, "failed")
        return report

    def _deliver(
        self,
        send: Callable[[OutboxRecord], None],
        run_id: str | None,
        limit: int,
        job_names: Collection[str] | None,
    ) -> DeliveryReport:
        delivered: list[OutboxRecord] = []
        failed: list[tuple[OutboxRecord, str]] = []
        pending = self.outbox(run_id, pending_only=True, limit=limit, job_names=job_names)
        for candidate in pending:
            key = {
                "run_id": candidate.run_id,
                "channel": candidate.channel,
                "revision": candidate.revision,
            }
            try:
                done = self._deliver_one(send, key)
            except Exception as exc:  # one bad row never stops the pass
                reason = safe_text(f"delivery not recorded: {describe_error(exc)}")
                self._record_delivery_failure(key, reason)
                failed.append((candidate, reason))
                continue
            if done is None:  # delivered meanwhile, or another deliverer holds it
                continue
            row, refused = done
            if refused is None:
                delivered.append(row)
            else:
                failed.append((row, refused))
        left: dict[str, int] = {}
        if job_names is not None:
            params = {"job_names": _job_names(job_names), "run_id": run_id}
            left = dict(self._db.rows("pending_outbox_by_job", params))
        return DeliveryReport(delivered=delivered, failed=failed, left_pending=left)

    def _deliver_one(
        self, send: Callable[[OutboxRecord], None], key: dict[str, Any]
    ) -> tuple[OutboxRecord, str | None] | None:
        """Lock one undelivered row, send it, mark it: the row and ``None`` (delivered), or the
        row and the receiver's failure (recorded); ``None`` when the row is not to be had."""
        with self._db.transaction() as conn:
            with conn.cursor(row_factory=record_row(OutboxRecord)) as cur:
                row = cur.execute(self._db.query("lock_undelivered"), key).fetchone()
            if row is None:
                return None
            try:
                send(row)
            except Exception as exc:  # the receiver's failure is recorded, not raised
                reason = describe_error(exc)
                conn.execute(self._db.query("mark_delivery_failed"), {**key, "error": reason})
                return row, reason
            conn.execute(self._db.query("mark_delivered"), key)
            return row, None

    def _record_delivery_failure(self, key: dict[str, Any], reason: str) -> None:
        """Best effort, in a transaction of its own: the row whose delivery could not be
        recorded says why (when even this fails, the row simply stays undelivered)."""
        try:
            with self._db.transaction() as conn:
                conn.execute(self._db.query("mark_delivery_failed"), {**key, "error": reason})
        except Exception:  # noqa: S110 - the pass goes on; the row stays pending
            pass


__all__ = ["RunLedger"]
