"""Create and verify the ledger's schema from the versioned SQL files in ``migrations/``.

``apply_migrations`` runs each missing file in its own transaction, records its version and
checksum, and is serialised across processes by a PostgreSQL advisory lock: running it twice, or
from two processes at once, is a no-op the second time. ``verify_migrations`` only reads, so a
worker starting up never runs DDL.
"""

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from idempotent_jobs.core.errors import InvalidInputError, LedgerError, SchemaNotMigratedError

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


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
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
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
_VERSIONS_TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"
_APPLIED = "SELECT version, name, checksum FROM {schema}.schema_migrations ORDER BY version"
_RECORD = "INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"


def _q(template: str, schema_name: str) -> sql.Composed:
    return sql.SQL(template).format(schema=sql.Identifier(schema_name))


def _applied(conn: psycopg.Connection, schema_name: str) -> dict[int, tuple[str, str]]:
    rows = conn.execute(_q(_APPLIED, schema_name)).fetchall()
    return {version: (name, checksum) for version, name, checksum in rows}


def _compare(applied: dict[int, tuple[str, str]], shipped: list[Migration]) -> list[Migration]:
    """Return the shipped migrations not yet applied; raise if the two histories disagree."""
    known = {m.version: m for m in shipped}
    for version, (name, checksum) in applied.items():
        migration = known.get(version)
        if migration is None:
            raise SchemaNotMigratedError(
                f"the database has migration {version:04d}_{name}, which this code does not ship: "
                "the schema is newer than the code"
            )
        if migration.checksum != checksum:
            raise LedgerError(
                f"migration {version:04d}_{name} was changed after it was applied "
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
        with conn.transaction():
            conn.execute(_q(_CREATE_SCHEMA, schema_name))
            conn.execute(_q(_CREATE_VERSIONS, schema_name))
        pending = _compare(_applied(conn, schema_name), shipped_migrations())
        for migration in pending:
            with conn.transaction():
                conn.execute(_q(migration.text, schema_name))
                conn.execute(
                    _q(_RECORD, schema_name),
                    (migration.version, migration.name, migration.checksum),
                )
        return pending


def verify_migrations(conn: psycopg.Connection, schema_name: str) -> None:
    """Raise :class:`SchemaNotMigratedError` unless every shipped migration is applied."""
    schema_name = check_schema_name(schema_name)
    table = sql.Identifier(schema_name, "schema_migrations").as_string(conn)
    exists = conn.execute(_VERSIONS_TABLE_EXISTS, (table,)).fetchone()
    if not exists or not exists[0]:
        raise SchemaNotMigratedError(
            f"the ledger schema {schema_name!r} does not exist in this database: "
            "run `idempotent-jobs migrate`"
        )
    pending = _compare(_applied(conn, schema_name), shipped_migrations())
    if pending:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
        raise SchemaNotMigratedError(
            f"the ledger schema {schema_name!r} lacks migrations {names}: "
            "run `idempotent-jobs migrate`"
        )
