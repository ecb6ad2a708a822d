"""How the ledger talks to PostgreSQL: a pool, its statements, retries and typed errors.

Every runtime statement is one of its face's (in ``sql/<store>.sql``), rendered
once per executor with the quoted schema name. Each runs on an autocommit connection, so one call
is one round trip and one transaction, and safe to retry when the connection breaks: every
statement is written so that one which landed before the break is recognised on the retry instead
of being applied twice.
"""

import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import RawCursor, sql
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from idempotent_jobs.core.connections import (
    behind_pooler,
    configure_connection,
    configure_pooled_connection,
    permission_error,
    stale_plan,
)
from idempotent_jobs.core.database import ledger_conninfo, redact
from idempotent_jobs.core.errors import (
    IdentityConflictError,
    LedgerConnectionError,
    LedgerError,
    SchemaNotMigratedError,
)
from idempotent_jobs.core.privilege_checks import (
    RoleAbilities,
    missing_privileges,
    role_abilities,
)
from idempotent_jobs.core.schema import (
    AppliedMigration,
    check_schema_name,
    missing_migrations,
    newer_than_code,
    not_migrated,
)
from idempotent_jobs.core.settings import LedgerSettings
from idempotent_jobs.core.sql import Face, positional, statement
from idempotent_jobs.core.upgrade import MigrationReport, upgrade

Row = TypeVar("Row")
_log = logging.getLogger(__name__)
#: How often a worker waiting for ``migrate`` reads the migration history again.
_SCHEMA_POLL_SECONDS = 1.0


class Executor:
    """Runs one face's named statements against one ledger schema through a connection pool.

    The pool is opened on first use (or by :meth:`open`, which first verifies the schema with a
    direct connection, so a wrong password or a missing database fails at once with the server's
    reason). A ``pool`` passed in is the caller's: it must be opened by them, with
    ``autocommit=True`` connections, and is never closed here.

    Statements are prepared on the server at first use, unless ``prepared_statements`` is
    false, or unset and :meth:`open` finds a connection pooler in between (see
    :func:`behind_pooler`): PgBouncer before 1.21 in transaction mode hands each transaction a
    server connection of its own, where a statement prepared on another is missing or, worse,
    another client's statement of the same name.
    """

    def __init__(
        self, settings: LedgerSettings, face: Face, *, pool: ConnectionPool | None = None
    ) -> None:
        self.settings = settings
        self.face: Face = face
        self._url = settings.conninfo
        self.prepared_statements = settings.prepared_statements
        self.schema = settings.schema
        self.pool_min_size = settings.pool_min_size
        self.pool_max_size = settings.pool_max_size
        self.connect_timeout_seconds = settings.connect_timeout_seconds
        self.connection_retries = settings.connection_retries
        self._pool = pool
        self._own_pool = pool is None
        self._verified = False
        #: Whether :meth:`open` found a connection pooler between the ledger and PostgreSQL.
        self.pooled = False
        self._rendered: dict[str, LiteralString] = {}
        self._positional: dict[str, tuple[LiteralString, tuple[str, ...]]] = {}
        self._open_lock = threading.Lock()

    def __repr__(self) -> str:  # the conninfo may hold a password: never shown
        return f"{type(self).__name__}(schema={self.schema!r})"

    # -- lifecycle ---------------------------------------------------------------------------

    def _conninfo(self) -> str:
        return ledger_conninfo(self._url, self.connect_timeout_seconds)

    def connection_error(self, doing: str, exc: psycopg.Error) -> LedgerError:
        """The typed error for ``exc``, its real cause in one line, no password in it."""
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return permission_error(exc, self.schema)
        text = " ".join(redact(str(exc), self._url).split())  # libpq's lines, one line
        if isinstance(exc, psycopg.OperationalError):
            return LedgerConnectionError(f"could not {doing}: {text}")
        return LedgerError(f"could not {doing}: {text}")

    def connect(self, doing: str) -> psycopg.Connection:
        """One direct connection: fails at once with the server's reason (wrong password,
        missing database, bad sslmode), where a pool would retry until its timeout."""
        try:
            # Never prepared: it may go through a transaction-mode pooler (checked only here).
            conn = psycopg.connect(self._conninfo(), autocommit=True, prepare_threshold=None)
        except psycopg.Error as exc:
            raise self.connection_error(doing, exc) from None
        configure_connection(conn)
        return conn

    def open(self) -> None:
        """Verify the schema and open the pool; a no-op when already open."""
        with self._open_lock:
            if self._verified:
                return
            check_schema_name(self.schema)
            if self._pool is not None:  # the caller's pool: verify through it
                with self._pool.connection() as conn:
                    self._verify(conn)
                self._verified = True
                return
            with self.connect("connect to the ledger database") as probe:
                self._verify(probe)
                self.pooled = self._probe_pooler(probe)
            prepare = (
                not self.pooled if self.prepared_statements is None else self.prepared_statements
            )
            pool = ConnectionPool(
                conninfo=self._conninfo(),
                min_size=self.pool_min_size,
                max_size=max(self.pool_max_size, self.pool_min_size),
                kwargs={"autocommit": True, "prepare_threshold": 0 if prepare else None},
                configure=self._configure_new_connection,
                timeout=self.connect_timeout_seconds,
                name="idempotent_jobs.ledger",
                open=False,
            )
            try:
                pool.open(wait=True, timeout=self.connect_timeout_seconds)
            except PoolTimeout:
                pool.close()
                raise LedgerConnectionError(
                    f"could not connect to the ledger database within "
                    f"{self.connect_timeout_seconds:g}s"
                ) from None
            except BaseException:
                pool.close()
                raise
            self._pool, self._verified = pool, True

    def _configure_new_connection(self, conn: psycopg.Connection) -> None:
        """Each new pool connection is checked for a pooler, not only the probe at open: a
        multi-host URL may fail over from a direct host to PgBouncer, or a pooler be put in
        front of the server, while the pool lives. Behind one, the connection prepares
        nothing (unless ``prepared_statements`` says otherwise) and sets its zone to UTC
        (:func:`configure_pooled_connection`); one round trip, once per connection."""
        if not behind_pooler(conn):
            configure_connection(conn)
            return
        if self.prepared_statements is None:
            conn.prepare_threshold = None
        if not self.pooled:
            self.pooled = True  # a later connection found one: say so (doctor, benchmarks)
        configure_pooled_connection(conn)

    def _probe_pooler(self, conn: psycopg.Connection) -> bool:
        try:
            return behind_pooler(conn)
        except psycopg.Error as exc:
            raise self.connection_error("read the ledger's server process id", exc) from None

    def _verify(self, conn: psycopg.Connection) -> None:
        """Check the ledger is at this code's schema. On the worker face, a ledger that a
        previous release migrated (it lacks only this release's migrations) is waited for, up
        to ``schema_wait_seconds``: new code deployed before ``migrate`` runs once it is done
        instead of failing each run in the meantime (docs/operating.md, "Upgrading")."""
        waited_from: float | None = None
        while True:
            try:
                pending = missing_migrations(conn, self.schema)
            except psycopg.Error as exc:
                raise self.connection_error("read the ledger schema", exc) from None
            if not pending:
                if waited_from is not None:
                    _log.warning(
                        "the ledger schema %r is migrated: going on after %.1fs",
                        self.schema,
                        time.monotonic() - waited_from,
                    )
                return
            now = time.monotonic()
            if waited_from is None:
                waited_from = now
                if self.face == "worker" and self.settings.schema_wait_seconds > 0:
                    _log.warning(
                        "the ledger schema %r lacks migrations %s, which this code needs: "
                        "waiting up to %gs for `idempotent-jobs migrate`",
                        self.schema,
                        ", ".join(m.label for m in pending),
                        self.settings.schema_wait_seconds,
                    )
            waited = now - waited_from
            limit = self.settings.schema_wait_seconds if self.face == "worker" else 0.0
            if waited >= limit:
                raise not_migrated(self.schema, pending, waited)
            time.sleep(min(_SCHEMA_POLL_SECONDS, limit - waited))

    def close(self) -> None:
        """Close the pool this executor opened (it can be opened again); a caller's pool is
        left open."""
        with self._open_lock:
            pool = self._pool
            self._verified = False
            if self._own_pool:
                self._pool = None
        if pool is not None and self._own_pool:
            pool.close()

    def migrate(self, split_roles: bool = False) -> MigrationReport:
        """Apply missing migrations and the upgrade steps (idempotent, serialised by an
        advisory lock); say what was applied, done and found. ``split_roles``: see
        :func:`~idempotent_jobs.core.grants.ensure_grants`."""
        check_schema_name(self.schema)
        with self.connect("connect to migrate the ledger") as conn:
            if self._probe_pooler(conn):
                raise LedgerError(
                    "migrate needs a direct connection to PostgreSQL, and this URL goes through "
                    "a connection pooler (PgBouncer?): the migration lock is a session advisory "
                    "lock, which a transaction-mode pool would leave on a server connection "
                    "other clients then get. Run migrate with the server's own host and port"
                )
            try:
                return upgrade(conn, self.schema, split_roles)
            except psycopg.Error as exc:
                raise self.connection_error("migrate the ledger", exc) from None

    def abilities(self) -> RoleAbilities:
        """What the connected role is and may do in the ledger (core/grants.py)."""
        with self.connect("connect to check the role's privileges") as conn:
            try:
                return role_abilities(conn, self.schema)
            except psycopg.Error as exc:
                raise self.connection_error("check the role's privileges", exc) from None

    def privileges(self) -> tuple[str, list[str]]:
        """The connected role, and what it lacks of the worker's privileges (core/grants.py)."""
        with self.connect("connect to check the role's privileges") as conn:
            try:
                row = conn.execute("SELECT current_user").fetchone()
                return str(row[0] if row else "?"), missing_privileges(conn, self.schema)
            except psycopg.Error as exc:
                raise self.connection_error("check the role's privileges", exc) from None

    def migrations_ahead(self) -> list[AppliedMigration]:
        """The applied migrations this code does not ship: a later release migrated the ledger
        (its workers and this code's share it while every such migration is additive)."""
        with self.connect("connect to read the ledger's migrations") as conn:
            try:
                return newer_than_code(conn, self.schema)
            except psycopg.Error as exc:
                raise self.connection_error("read the ledger's migrations", exc) from None

    # -- statements --------------------------------------------------------------------------

    def query(self, name: str) -> LiteralString:
        """Statement ``name`` with the quoted schema name, rendered once per executor.

        A plain string (not a ``Composed``) lets psycopg reuse its parsed form instead of
        composing the statement again on every call.
        """
        query = self._rendered.get(name)
        if query is None:
            text = statement(self.face, name)
            rendered = sql.SQL(text).format(schema=sql.Identifier(self.schema))
            # A package constant plus a validated, quoted identifier: a literal in all but type.
            query = rendered.as_string(None)
            assert query is not None
            self._rendered[name] = query
        return query

    def _pool_or_open(self) -> ConnectionPool:
        if not self._verified:
            self.open()
        assert self._pool is not None
        return self._pool

    def fetch(
        self, name: str, params: Mapping[str, Any], row_factory: RowFactory[Row]
    ) -> list[Row]:
        """Run statement ``name``, retrying on a broken connection or when the server rolled
        it back (a deadlock victim); return its rows.

        Every runtime statement returns rows (a SELECT, or a write with RETURNING) except the
        outbox marks, which run in :meth:`transaction`.
        """
        pool = self._pool_or_open()
        form = self._positional.get(name)
        if form is None:  # numbered once (see core.sql.positional), sent as it is
            form = self._positional[name] = positional(self.query(name))
        query, names = form
        values = [params[n] for n in names]
        for attempt in range(self.connection_retries + 1):
            conn: psycopg.Connection | None = None
            try:
                with pool.connection() as conn, RawCursor(conn, row_factory=row_factory) as cur:
                    if not self._own_pool:
                        configure_connection(conn)
                    try:
                        cur.execute(query, values)
                    except psycopg.errors.FeatureNotSupported as exc:
                        if not stale_plan(exc):
                            raise
                        # A migrate changed a table under this connection's prepared statement
                        # (an added column): forget its plans and prepare afresh, once. The
                        # refused statement did nothing (it failed before executing).
                        conn.execute("DEALLOCATE ALL")
                        cur.execute(query, values)
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
            except psycopg.errors.InsufficientPrivilege as exc:
                raise permission_error(exc, self.schema, name) from None
            except psycopg.errors.TransactionRollback as exc:
                # A deadlock victim (racing first inserts of one run can meet on its two unique
                # keys in opposite orders): the statement was rolled back whole, so run it again.
                if attempt == self.connection_retries:
                    raise LedgerError(
                        f"ledger statement {name} rolled back {attempt + 1} times "
                        f"({type(exc).__name__}): {redact(str(exc), self._url)}"
                    ) from None
                time.sleep(random.uniform(0.001, 0.01 * 2**attempt))
            except psycopg.OperationalError as exc:
                broken = conn is None or conn.broken or isinstance(exc, PoolTimeout)
                if not broken or attempt == self.connection_retries:
                    text = redact(str(exc), self._url)
                    raise LedgerConnectionError(
                        f"ledger statement failed ({type(exc).__name__}): {text}"
                    ) from None
                pool.check()  # drop the other connections the same outage broke
                time.sleep(min(0.2 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    def rows(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self.fetch(name, params, tuple_row)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """A transaction in pipeline mode: BEGIN travels with the first statement, COMMIT with
        the last, so a lock-send-mark delivery costs two round trips instead of four."""
        pool = self._pool_or_open()
        try:
            with pool.connection() as conn:
                if not self._own_pool:
                    configure_connection(conn)
                with conn.pipeline(), conn.transaction():
                    yield conn
        except psycopg.OperationalError as exc:
            raise LedgerConnectionError(
                f"ledger transaction failed: {redact(str(exc), self._url)}"
            ) from exc
