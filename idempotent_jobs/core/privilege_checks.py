"""What the connected role lacks of the worker's privileges, and what it may do in the ledger:
``doctor``'s and the worker's start-up checks, over the maps of :mod:`.grants`."""

from dataclasses import dataclass

import psycopg

from idempotent_jobs.core.grants import (
    operator_role,
    reader_role,
    roles_split,
    settle_function,
    worker_privileges,
    worker_role,
)

_MISSING = """
SELECT relation, privilege, col
FROM unnest(%(relations)s::text[], %(privileges)s::text[], %(columns)s::text[])
  AS wanted(relation, privilege, col)
WHERE NOT CASE WHEN col IS NULL
  THEN has_table_privilege(quote_ident(%(schema)s) || '.' || quote_ident(relation), privilege)
  ELSE has_column_privilege(quote_ident(%(schema)s) || '.' || quote_ident(relation), col,
    privilege) END
ORDER BY relation, privilege, col"""

Wanted = list[tuple[str, str, str | None]]


def _wanted(privileges: dict[str, tuple[str, ...]]) -> Wanted:
    """Each (relation, privilege, column) a map names: ``UPDATE (a, b)`` is one per column."""
    wanted: Wanted = []
    for relation, names in privileges.items():
        for name in names:
            privilege, _, columns = name.partition(" (")
            if not columns:
                wanted.append((relation, privilege, None))
                continue
            wanted.extend((relation, privilege, c.strip()) for c in columns.rstrip(")").split(","))
    return wanted


def _lacking(conn: psycopg.Connection, schema_name: str, wanted: Wanted) -> Wanted:
    rows = conn.execute(
        _MISSING,
        {
            "relations": [w[0] for w in wanted],
            "privileges": [w[1] for w in wanted],
            "columns": [w[2] for w in wanted],
            "schema": schema_name,
        },
    ).fetchall()
    return [(str(r), str(p), c) for r, p, c in rows]


def missing_privileges(conn: psycopg.Connection, schema_name: str) -> list[str]:
    """What the connected role lacks of the worker's privileges, as ``PRIVILEGE on schema.t``
    (``PRIVILEGE (column) on schema.t`` for a column's)."""
    usage = conn.execute("SELECT has_schema_privilege(%s, 'USAGE')", (schema_name,)).fetchone()
    if not usage or not usage[0]:
        return [f"USAGE on schema {schema_name}"]
    wanted = _wanted(worker_privileges(roles_split(conn, schema_name)))
    return [
        f"{privilege}{f' ({column})' if column else ''} on {schema_name}.{relation}"
        for relation, privilege, column in _lacking(conn, schema_name, wanted)
    ]


#: What ``doctor`` says a role may do, by the privilege that shows it.
_ABILITIES: tuple[tuple[str, str, str, str | None], ...] = (
    ("runs model calls", "runs", "UPDATE", None),
    ("sets prices", "price_history", "INSERT", None),
    ("sets budgets", "spend_budgets", "UPDATE", None),
    ("sets rate limits", "rate_limits", "DELETE", None),
    ("cancels batches", "batches", "UPDATE", "cancel_requested_at"),
)


@dataclass(frozen=True)
class RoleAbilities:
    """The connected role, the ledger's group roles it is a member of, and what it may do."""

    role: str
    groups: list[str]
    may: list[str]
    split: bool

    def describe(self) -> str:
        member = f" (member of {', '.join(self.groups)})" if self.groups else ""
        what = ", ".join(self.may) or "reads only"
        return f"role {self.role}{member}: {what}"


def role_abilities(conn: psycopg.Connection, schema_name: str) -> RoleAbilities:
    """What the connected role is and may do in the ledger (``doctor`` says it)."""
    row = conn.execute("SELECT current_user").fetchone()
    groups = []
    for group in (operator_role(schema_name), worker_role(schema_name), reader_role(schema_name)):
        member = conn.execute(
            "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)"
            " AND pg_has_role(current_user, (SELECT oid FROM pg_roles WHERE rolname = %s),"
            " 'MEMBER')",
            (group, group),
        ).fetchone()
        if member and member[0]:
            groups.append(group)
    wanted: Wanted = [(r, p, c) for _, r, p, c in _ABILITIES]
    lacking = set(_lacking(conn, schema_name, wanted))
    may = [what for what, r, p, c in _ABILITIES if (r, p, c) not in lacking]
    settle = settle_function(schema_name).as_string(conn)
    can = conn.execute(
        "SELECT to_regprocedure(%s) IS NOT NULL"
        " AND has_function_privilege(to_regprocedure(%s), 'EXECUTE')",
        (settle, settle),
    ).fetchone()
    if can and can[0]:
        may.append("settles calls in doubt")
    return RoleAbilities(str(row[0] if row else "?"), groups, may, roles_split(conn, schema_name))
