"""What ``migrate`` does beyond the schema: the data and grants an earlier release left.

Run after the migrations; the two data steps once per ledger (``upgrade_steps`` records them),
the grants at every ``migrate``:
- identities stored in another Unicode form than NFC (release 0.1 stored them as given) are put
  in NFC, keeping their run ids: the NFC form then finds the run by its identity key;
- values nested deeper than :data:`MAX_JSON_DEPTH` are reported: they read as
  :class:`~idempotent_jobs.core.json_values.UnreadableValue` and stay until revised;
- the group roles and their grants (core/grants.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from idempotent_jobs.core.grants import ensure_grants
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.json_values import MAX_JSON_DEPTH, json_depth
from idempotent_jobs.core.schema import apply_migrations, migration_lock

#: Lines per kind of finding; past that, one line says how many more there are.
MAX_REPORTED = 100


@dataclass(frozen=True, kw_only=True)
class MigrationReport:
    """What one ``migrate`` applied, changed besides the schema, and found for an operator."""

    applied: list[str]
    done: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)


_NOT_NFC = """
SELECT run_id, job_name, subject_id, version FROM {schema}.runs AS r
WHERE NOT (job_name IS NFC NORMALIZED AND subject_id IS NFC NORMALIZED
           AND version IS NFC NORMALIZED)
  AND NOT EXISTS (SELECT 1 FROM {schema}.identity_upgrades AS u WHERE u.run_id = r.run_id)
ORDER BY run_id
FOR UPDATE"""
_SAME_IDENTITY = """
SELECT run_id FROM {schema}.runs
WHERE (job_name, subject_id, version) = (%s, %s, %s)
  AND scheduled_at = (SELECT scheduled_at FROM {schema}.runs WHERE run_id = %s)"""
_NORMALISE = """
UPDATE {schema}.runs SET job_name = %s, subject_id = %s, version = %s WHERE run_id = %s"""
_RECORD = """
INSERT INTO {schema}.identity_upgrades (run_id, job_name, subject_id, version, outcome, kept_for)
VALUES (%s, %s, %s, %s, %s, %s)"""


def _q(template: str, schema_name: str) -> sql.Composed:
    return sql.SQL(template).format(schema=sql.Identifier(schema_name))


def _bounded(lines: list[str], more: str) -> list[str]:
    if len(lines) <= MAX_REPORTED:
        return lines
    return [*lines[:MAX_REPORTED], f"... and {len(lines) - MAX_REPORTED} more {more}"]


def normalise_identities(
    conn: psycopg.Connection, schema_name: str, report: MigrationReport
) -> None:
    """Put non-NFC identity fields in NFC under the same run id, in one transaction."""
    encoding = conn.execute("SHOW server_encoding").fetchone()
    if not encoding or encoding[0] != "UTF8":
        report.found.append(
            f"identities not checked for Unicode form: the server encoding is {encoding}, not UTF8"
        )
        return
    done: list[str] = []
    found: list[str] = []
    with conn.transaction():
        for run_id, job_name, subject_id, version in conn.execute(_q(_NOT_NFC, schema_name)):
            fields = (normalize_text(job_name), normalize_text(subject_id), normalize_text(version))
            twin = conn.execute(_q(_SAME_IDENTITY, schema_name), (*fields, run_id)).fetchone()
            stored = f"{job_name}/{subject_id}/{version}".encode("unicode_escape").decode()
            if twin is not None:
                conn.execute(
                    _q(_RECORD, schema_name),
                    (run_id, job_name, subject_id, version, "kept", twin[0]),
                )
                found.append(
                    f"kept as stored: {run_id[:12]} ({stored}): its NFC identity is run "
                    f"{twin[0][:12]}'s, which the NFC form finds; this run is reachable by its id"
                )
                continue
            conn.execute(_q(_NORMALISE, schema_name), (*fields, run_id))
            conn.execute(
                _q(_RECORD, schema_name),
                (run_id, job_name, subject_id, version, "normalised", None),
            )
            done.append(
                f"identity normalised to NFC: {run_id[:12]} (stored as {stored}); it keeps its "
                "run id and notification keys, and its NFC form finds it"
            )
    report.done.extend(_bounded(done, "normalised"))
    report.found.extend(_bounded(found, "kept as stored"))


# Stored JSON that may nest too deep: more opening brackets than the limit (a cheap filter);
# the exact depth is measured in Python on those only.
_JSON_COLUMNS = (
    ("runs", "run_id", "raw_input", "raw input"),
    ("runs", "run_id", "output", "output"),
    ("run_revisions", "run_id", "previous_output", "previous output"),
    ("notification_outbox", "run_id", "payload", "outbox payload"),
)
_MANY_BRACKETS = """
SELECT {key}, {column}::text FROM {schema}.{table}
WHERE {column} IS NOT NULL
  AND length({column}::text) - length(translate({column}::text, '[{{', '')) > %s"""


def find_too_deep(conn: psycopg.Connection, schema_name: str, report: MigrationReport) -> None:
    """Report every stored value nested deeper than the limit (reads show it as unreadable)."""
    found: list[str] = []
    for table, key, column, label in _JSON_COLUMNS:
        query = sql.SQL(_MANY_BRACKETS).format(
            key=sql.Identifier(key),
            column=sql.Identifier(column),
            schema=sql.Identifier(schema_name),
            table=sql.Identifier(table),
        )
        with conn.transaction(), conn.cursor(name=f"too_deep_{column}") as cursor:
            cursor.execute(query, (MAX_JSON_DEPTH,))
            for run_id, text in cursor:
                depth = json_depth(text.encode("utf-8"))
                if depth > MAX_JSON_DEPTH:
                    found.append(
                        f"too deep to read: {run_id[:12]} {label}, {depth} levels (the limit is "
                        f"{MAX_JSON_DEPTH}); it reads as unreadable until "
                        f"`idempotent-jobs revise {run_id[:12]}` replaces it"
                    )
    report.found.extend(_bounded(found, "too deep"))


_STEP_DONE = "SELECT 1 FROM {schema}.upgrade_steps WHERE step = %s"
_MARK_DONE = "INSERT INTO {schema}.upgrade_steps (step) VALUES (%s) ON CONFLICT DO NOTHING"


def _once(
    conn: psycopg.Connection,
    schema_name: str,
    step: Callable[[psycopg.Connection, str, MigrationReport], None],
    report: MigrationReport,
) -> None:
    """Run a data step unless it has finished on this ledger before (``upgrade_steps``): each
    scans whole tables, once, at the upgrade; a step that failed runs again next time."""
    name = step.__name__
    if conn.execute(_q(_STEP_DONE, schema_name), (name,)).fetchone():
        return
    step(conn, schema_name, report)
    conn.execute(_q(_MARK_DONE, schema_name), (name,))


def upgrade(
    conn: psycopg.Connection, schema_name: str, split_roles: bool = False
) -> MigrationReport:
    """Apply the missing migrations, then the data and grant steps above; say what was done.
    ``split_roles``: leave the worker role only reads of prices, budgets and limits from now on
    (:mod:`idempotent_jobs.core.grants`); a ledger this call creates starts so, since no
    worker of an earlier release can be writing to it."""
    with migration_lock(conn, schema_name):
        applied = apply_migrations(conn, schema_name)
        report = MigrationReport(applied=[f"{m.version:04d}_{m.name}" for m in applied])
        table = sql.Identifier(schema_name, "identity_upgrades").as_string(conn)
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if not exists or not exists[0]:
            return report  # code shipping fewer migrations (a test's): nothing to upgrade yet
        for step in (normalise_identities, find_too_deep):
            _once(conn, schema_name, step, report)
        # A ledger created now has no worker of an earlier release: its roles start split.
        created = any(m.version == 1 for m in applied)
        grants = ensure_grants(conn, schema_name, split_roles or created, upgraded=bool(applied))
    report.done.extend(grants.done)
    report.found.extend(grants.found)
    return report
