"""Create and verify the ledger's schema from the versioned SQL files in ``migrations/``.

``apply_migrations`` runs each missing file in its own transaction, records its version,
checksum and kind of change, and is serialised across processes by a PostgreSQL advisory lock:
running it twice, or from two processes at once, is a no-op the second time.
``missing_migrations`` only reads, so a worker starting up never runs DDL.

**Expand, then contract.** Each migration's first line says whether the previous release's code
keeps working on it: ``-- change: additive`` (new tables, nullable columns, wider types and
checks, indexes) or ``-- change: contracting`` (renames, drops, tighter constraints). The kind is
recorded with the migration, so a worker of an older release reads it for migrations it does not
ship: it runs on a schema newer than its code when every newer migration is additive, and
refuses, naming both versions, when one is contracting. A contracting change ships only in a
release after one whose code no longer uses what it removes (docs/operating.md, "Upgrading").
"""

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import psycopg
from psycopg import sql

from idempotent_jobs.core.errors import InvalidInputError, LedgerError, SchemaNotMigratedError

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


Change = Literal["additive", "contracting"]
_CHANGE_LINE = re.compile(r"^-- change: (additive|contracting)\n")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str
    change: Change = "contracting"

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    @property
    def checksum(self) -> str:
        """Of the statements: the ``-- change:`` line is not part of it (migrations applied
        before kinds were declared keep their checksums)."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @classmethod
    def parse(cls, version: int, name: str, source: str) -> "Migration":
        """A shipped file: its first line declares its kind of change, or it is refused."""
        declared = _CHANGE_LINE.match(source)
        if declared is None:
            raise LedgerError(
                f"migration {version:04d}_{name} does not start with "
                "'-- change: additive' or '-- change: contracting'"
            )
        kind: Change = "additive" if declared[1] == "additive" else "contracting"
        return cls(version, name, source[declared.end() :], kind)


def check_schema_name(schema_name: str) -> str:
    """Return the schema name if it is a plain lower-case SQL identifier, else raise.

    The whole text must match (``fullmatch``: a ``$`` anchor would let a trailing newline in).
    PostgreSQL's own schemas (``pg_*``, ``information_schema``) are refused.
    """
    if not isinstance(schema_name, str) or not _SCHEMA_NAME.fullmatch(schema_name):
        raise InvalidInputError(
            "schema_name",
            f"{schema_name!r} must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63)",
        )
    if schema_name.startswith("pg_") or schema_name == "information_schema":
        raise InvalidInputError(
            "schema_name", f"{schema_name!r} is reserved for PostgreSQL's own catalogues"
        )
    return schema_name


def shipped_migrations() -> list[Migration]:
    """The migrations this version of the code expects, in version order."""
    found = []
    for entry in resources.files("idempotent_jobs.core.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(
                Migration.parse(int(match[1]), match[2], entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    return found


# The lock key is derived from the schema name, so two ledgers in different schemas of one
# database migrate independently.
_LOCK = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"
_CREATE_VERSIONS = """
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# The kind of each change, read by workers of older releases (added beside the table: a ledger
# migrated before kinds existed gets the column, and its rows their kinds, at the next migrate).
_ADD_CHANGE_COLUMN = "ALTER TABLE {schema}.schema_migrations ADD COLUMN IF NOT EXISTS change text"
_SET_CHANGE = (
    "UPDATE {schema}.schema_migrations SET change = %s"
    " WHERE version = %s AND change IS DISTINCT FROM %s"
)
_VERSIONS_TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
# to_jsonb: the kind is read whether or not the ledger has the column yet.
_APPLIED = (
    "SELECT version, name, checksum, to_jsonb(m) ->> 'change'"
    " FROM {schema}.schema_migrations m ORDER BY version"
)
_RECORD = (
    "INSERT INTO {schema}.schema_migrations (version, name, checksum, change)"
    " VALUES (%s, %s, %s, %s)"
)


def _q(template: str, schema_name: str) -> sql.Composed:
    return sql.SQL(template).format(schema=sql.Identifier(schema_name))


@dataclass(frozen=True)
class AppliedMigration:
    """A row of ``schema_migrations``: what was applied, with its checksum and kind."""

    version: int
    name: str
    checksum: str
    change: Change

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def _applied(conn: psycopg.Connection, schema_name: str) -> dict[int, AppliedMigration]:
    """The applied migrations, by version, with the kind recorded (``contracting`` when none
    was: a ledger whose history predates kinds is never taken for an additive one)."""
    rows = conn.execute(_q(_APPLIED, schema_name)).fetchall()
    return {
        version: AppliedMigration(
            version, name, checksum, "additive" if change == "additive" else "contracting"
        )
        for version, name, checksum, change in rows
    }


def code_version() -> str:
    """This code's release and the newest migration it ships, as messages name them."""
    from idempotent_jobs import __version__

    shipped = shipped_migrations()
    return f"idempotent-jobs {__version__} (schema {shipped[-1].label if shipped else 'none'})"


def newer_than_code(conn: psycopg.Connection, schema_name: str) -> list[AppliedMigration]:
    """The applied migrations this code does not ship (a later release migrated the ledger)."""
    known = {m.version for m in shipped_migrations()}
    return [m for v, m in sorted(_applied(conn, schema_name).items()) if v not in known]


def _compare(applied: dict[int, AppliedMigration], shipped: list[Migration]) -> list[Migration]:
    """Return the shipped migrations not yet applied; raise if the two histories disagree or
    the ledger holds a newer migration that is not additive (an additive one is run on)."""
    known = {m.version: m for m in shipped}
    for version, stored in applied.items():
        migration = known.get(version)
        if migration is None:
            if stored.change == "additive":
                continue  # the previous release's code keeps working on an additive change
            raise SchemaNotMigratedError(
                f"the ledger's schema is newer than the code: migration {stored.label} "
                f"(contracting, or of a release that did not say) is applied, and this code is "
                f"{code_version()}: deploy the release that ships it"
            )
        if migration.checksum != stored.checksum:
            raise LedgerError(
                f"migration {stored.label} was changed after it was applied "
                "(checksum differs); add a new migration instead of editing an applied one"
            )
    return [m for m in shipped if m.version not in applied]


@contextmanager
def migration_lock(conn: psycopg.Connection, schema_name: str) -> Iterator[None]:
    """Hold the schema's migration lock (a session advisory lock, re-entrant) on an autocommit
    connection: one migrate at a time per ledger schema, across processes."""
    lock_key = f"idempotent_jobs.migrate:{check_schema_name(schema_name)}"
    conn.autocommit = True
    conn.execute(_LOCK, (lock_key,))
    try:
        yield
    finally:
        conn.execute(_UNLOCK, (lock_key,))


def apply_migrations(conn: psycopg.Connection, schema_name: str) -> list[Migration]:
    """Apply the missing migrations on an autocommit connection; return those applied now."""
    schema_name = check_schema_name(schema_name)
    with migration_lock(conn, schema_name):
        shipped = shipped_migrations()
        with conn.transaction():
            conn.execute(_q(_CREATE_SCHEMA, schema_name))
            conn.execute(_q(_CREATE_VERSIONS, schema_name))
            conn.execute(_q(_ADD_CHANGE_COLUMN, schema_name))
        pending = _compare(_applied(conn, schema_name), shipped)
        with conn.transaction():
            for migration in shipped:
                if migration not in pending:
                    kind = migration.change
                    conn.execute(_q(_SET_CHANGE, schema_name), (kind, migration.version, kind))
        for migration in pending:
            with conn.transaction():
                conn.execute(_q(migration.text, schema_name))
                conn.execute(
                    _q(_RECORD, schema_name),
                    (migration.version, migration.name, migration.checksum, migration.change),
                )
        return pending


def missing_migrations(conn: psycopg.Connection, schema_name: str) -> list[Migration]:
    """The shipped migrations this ledger lacks (empty when it is at this code's schema, or
    ahead of it by additive ones only). Raise :class:`SchemaNotMigratedError` when the schema
    was never migrated, or is ahead by a contracting change."""
    schema_name = check_schema_name(schema_name)
    table = sql.Identifier(schema_name, "schema_migrations").as_string(conn)
    exists = conn.execute(_VERSIONS_TABLE_EXISTS, (table,)).fetchone()
    if not exists or not exists[0]:
        raise SchemaNotMigratedError(
            f"the ledger schema {schema_name!r} does not exist in this database: "
            "run `idempotent-jobs migrate`"
        )
    applied = _applied(conn, schema_name)
    pending = _compare(applied, shipped_migrations())
    if pending and not applied:
        raise not_migrated(schema_name, pending)
    return pending


def not_migrated(schema_name: str, pending: list[Migration], waited: float = 0.0) -> LedgerError:
    """The error for a ledger that lacks ``pending`` (after waiting ``waited`` seconds)."""
    names = ", ".join(m.label for m in pending)
    after = f" (waited {waited:.1f}s for it)" if waited else ""
    return SchemaNotMigratedError(
        f"the ledger schema {schema_name!r} lacks migrations {names}, which this code "
        f"({code_version()}) needs: run `idempotent-jobs migrate`{after}"
    )
