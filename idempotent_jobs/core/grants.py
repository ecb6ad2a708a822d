"""Who may do what in a ledger schema: two group roles, granted by every ``migrate``.

``<schema>_worker`` (``idempotent_jobs_worker`` for the default schema) holds what workers,
deliverers and the retention job need, and nothing more: it reads the migration history but
cannot write it, and deletes only the attempt rows retention prunes. ``<schema>_reader`` may read
everything. Deployments grant these to their login roles (``GRANT idempotent_jobs_worker TO
app``), so a later migration's new table reaches every worker with no grant of their own:
``migrate`` makes the group roles' privileges exactly :data:`WORKER_PRIVILEGES` each time.
"""

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

#: Every relation of the ledger schema and what the worker role may do on it.
WORKER_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "runs": ("SELECT", "INSERT", "UPDATE"),
    "run_attempts": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # retention prunes attempt rows
    "notification_outbox": ("SELECT", "INSERT", "UPDATE"),
    "run_revisions": ("SELECT", "INSERT", "UPDATE"),
    "model_calls": ("SELECT", "INSERT", "UPDATE"),
    "identity_upgrades": ("SELECT",),
    "upgrade_steps": ("SELECT",),
    "drills": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # operators arm, workers take
    "budgets": ("SELECT", "INSERT", "UPDATE"),  # workers declare the budget they enforce
    # model_calls' trigger (release 0.2's) keeps it; retention prunes old days.
    "spend_days": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "model_prices": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # release 0.2's prices
    # Prices with their history, in the ledger's one currency: operators set, workers read.
    "price_history": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "ledger_currency": ("SELECT", "INSERT"),
    # Budgets: workers declare their spec's, reserve and settle; operators set and clear.
    "spend_budgets": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "budget_counters": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # retention prunes old periods
    "budget_holds": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    # What calls in doubt hold of each budget: recorded as they settle, cleared by `costs settle`.
    "budget_doubts": ("SELECT", "INSERT", "DELETE"),
    "step_outputs": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # the ledger IO manager's
    # Workers declare limits and reserve places; operators set and delete them.
    "rate_limits": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "rate_subjects": ("SELECT", "INSERT", "UPDATE"),  # each subject's latest reservation
    # The batch lane: a worker opens, submits, polls and collects batches; operators cancel.
    "batches": ("SELECT", "INSERT", "UPDATE"),
    "batch_items": ("SELECT", "INSERT", "UPDATE"),
    "batch_submissions": ("SELECT", "INSERT", "UPDATE"),
    "attempts": ("SELECT",),
    "schema_migrations": ("SELECT",),
}
_WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
_ROLE_NAME_MAX = 63


def worker_role(schema_name: str) -> str:
    return f"{schema_name}_worker"


def reader_role(schema_name: str) -> str:
    return f"{schema_name}_reader"


@dataclass
class GrantReport:
    done: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)


def _role_exists(conn: psycopg.Connection, role: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None


def _ensure_role(conn: psycopg.Connection, role: str, report: GrantReport) -> bool:
    """Create the NOLOGIN group ``role`` if missing; False (and why, in ``found``) if it
    cannot be."""
    if _role_exists(conn, role):
        return True
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        return True  # another database's migrate made it meanwhile (roles are per server)
    except psycopg.errors.InsufficientPrivilege:
        report.found.append(
            f"group role {role} does not exist and this role may not create it: a superuser "
            f"can run `CREATE ROLE {role} NOLOGIN`, then migrate again"
        )
        return False
    report.done.append(f"created group role {role}")
    return True


def _grant_exactly(conn: psycopg.Connection, schema_name: str, worker: str, reader: str) -> None:
    """The two roles' privileges made exactly the map's, in one transaction."""
    schema = sql.Identifier(schema_name)
    roles = sql.SQL("{}, {}").format(sql.Identifier(worker), sql.Identifier(reader))
    with conn.transaction():
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, roles))
        for relation, privileges in WORKER_PRIVILEGES.items():
            target = sql.Identifier(schema_name, relation)
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(target, roles))
            conn.execute(
                sql.SQL("GRANT {} ON {} TO {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privileges),
                    target,
                    sql.Identifier(worker),
                )
            )
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(target, sql.Identifier(reader)))


# Roles other than the owner holding privileges directly on a ledger relation (not through a
# group role): how earlier releases' deployments granted their workers.
_DIRECT_GRANTEES = """
SELECT g.rolname, c.relname, a.privilege_type
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(c.relacl) AS a
JOIN pg_roles g ON g.oid = a.grantee
WHERE n.nspname = %s AND a.grantee <> c.relowner AND g.rolname <> ALL(%s)
ORDER BY 1, 2, 3"""


def _adopt_direct_grantees(
    conn: psycopg.Connection, schema_name: str, worker: str, reader: str, report: GrantReport
) -> None:
    """Roles granted table by table (release 0.1's advice) become members of the group roles,
    and lose their direct grants, so no later migration leaves them short and none of them
    can write the migration history."""
    rows = conn.execute(_DIRECT_GRANTEES, (schema_name, [worker, reader])).fetchall()
    held: dict[str, set[tuple[str, str]]] = {}
    for role, relation, privilege in rows:
        held.setdefault(role, set()).add((relation, privilege))
    for role, privileges in held.items():
        group = worker if ("runs", "INSERT") in privileges else reader
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(role))
                )
                conn.execute(
                    sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(
                        sql.Identifier(schema_name), sql.Identifier(role)
                    )
                )
        except psycopg.errors.InsufficientPrivilege as exc:
            report.found.append(
                f"{role} holds privileges on the ledger's tables directly and could not be "
                f"made a member of {group} ({exc.diag.message_primary}): a superuser can run "
                f"`GRANT {group} TO {role}`"
            )
            continue
        wrote_history = any(
            relation == "schema_migrations" and privilege in _WRITES
            for relation, privilege in privileges
        )
        report.done.append(
            f"granted {group} to {role}, in place of its {len(privileges)} direct table "
            "privileges" + (" (which let it write schema_migrations)" if wrote_history else "")
        )


def ensure_grants(conn: psycopg.Connection, schema_name: str) -> GrantReport:
    """Create the group roles if missing, make their privileges the map's, and turn roles
    granted table by table into members. Needs the schema's owner (the role that migrates),
    and CREATEROLE the first time; what cannot be done is said in ``found``, never raised."""
    report = GrantReport()
    worker, reader = worker_role(schema_name), reader_role(schema_name)
    if len(worker) > _ROLE_NAME_MAX:
        report.found.append(
            f"no group roles for schema {schema_name}: {worker} would be longer than "
            f"{_ROLE_NAME_MAX} characters; grant the privileges of core/grants.py by hand"
        )
        return report
    if not (_ensure_role(conn, worker, report) and _ensure_role(conn, reader, report)):
        return report
    try:
        _grant_exactly(conn, schema_name, worker, reader)
    except psycopg.errors.InsufficientPrivilege as exc:
        report.found.append(
            f"could not grant the ledger's tables to {worker} and {reader}: "
            f"{exc.diag.message_primary} (migrate as the schema's owner)"
        )
        return report
    _adopt_direct_grantees(conn, schema_name, worker, reader, report)
    return report


_MISSING = """
SELECT relation, privilege
FROM unnest(%(relations)s::text[], %(privileges)s::text[]) AS wanted(relation, privilege)
WHERE NOT has_table_privilege(
  quote_ident(%(schema)s) || '.' || quote_ident(relation), privilege)
ORDER BY relation, privilege"""


def missing_privileges(conn: psycopg.Connection, schema_name: str) -> list[str]:
    """What the connected role lacks of the worker's privileges, as ``PRIVILEGE on schema.t``."""
    usage = conn.execute("SELECT has_schema_privilege(%s, 'USAGE')", (schema_name,)).fetchone()
    if not usage or not usage[0]:
        return [f"USAGE on schema {schema_name}"]
    relations = [r for r, privileges in WORKER_PRIVILEGES.items() for _ in privileges]
    privileges = [p for ps in WORKER_PRIVILEGES.values() for p in ps]
    rows = conn.execute(
        _MISSING, {"relations": relations, "privileges": privileges, "schema": schema_name}
    ).fetchall()
    return [f"{privilege} on {schema_name}.{relation}" for relation, privilege in rows]
