"""Who may do what in a ledger schema: three group roles, granted by every ``migrate``.

``<schema>_worker`` (``idempotent_jobs_worker`` for the default schema) holds what workers,
deliverers and the retention job need: it reads the migration history but cannot write it, and
deletes only the attempt rows retention prunes. ``<schema>_operator`` holds the worker's
privileges and what only operators do: set prices, budgets and limits, cancel batches, settle
calls in doubt. ``<schema>_reader`` may read everything. Deployments grant these to their login
roles (``GRANT idempotent_jobs_worker TO app``), so a later migration's new table reaches every
member with no grant of their own: ``migrate`` makes the group roles' privileges exactly the
maps below each time.

**Splitting the roles.** Workers admit, settle and prune calls through functions that run as
the ledger's owner (migration 0021), so a worker needs no write on prices, budgets, budget
counters, holds or limits. Releases before 0021 wrote those tables directly, so the worker role
keeps today's privileges (:data:`WORKER_PRIVILEGES`) until an operator splits the roles, once
every worker runs this release (``idempotent-jobs migrate --split-roles``, recorded in
``ledger_options``); from then on the worker role has ``worker_privileges(split=True)``.
"""

from dataclasses import dataclass, field

import psycopg
from psycopg import sql

#: Every relation of the ledger schema and what the worker role may do on it (the roles not
#: split: as releases before 0021 needed).
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
    "ledger_options": ("SELECT",),  # what an operator chose (the roles split)
    "step_outputs": ("SELECT", "INSERT", "UPDATE", "DELETE"),  # the ledger IO manager's
    # Workers declare limits and reserve places; operators set and delete them.
    "rate_limits": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "rate_subjects": ("SELECT", "INSERT", "UPDATE"),  # each subject's latest reservation
    # The batch lane: a worker opens, submits, polls and collects batches; operators cancel.
    "batches": ("SELECT", "INSERT", "UPDATE"),
    "batch_items": ("SELECT", "INSERT", "UPDATE"),
    "batch_submissions": ("SELECT", "INSERT", "UPDATE"),
    # Shadow runs: the process advancing a shadow writes it and its items; operators start it.
    "shadows": ("SELECT", "INSERT", "UPDATE"),
    "shadow_items": ("SELECT", "INSERT", "UPDATE"),
    "attempts": ("SELECT",),
    "schema_migrations": ("SELECT",),
}
# What a worker keeps once the roles are split: reads of prices, budgets and limits (counters,
# holds and doubts change through the ledger's functions); the rate-limit buckets' times (taking
# a place moves them); a batch's every column but the operator's cancel request; a model call's
# outcome, not what it cost.
_BATCH_WORKER_COLUMNS = (
    "job_name, provider, model, state, provider_batch_id, items, lease_owner, lease_epoch, "
    "lease_expires_at, lease_seconds, created_at, submit_started_at, submitted_at, ended_at, "
    "collected_at, checked_at, provider_status, error, cancel_sent_at, caller_run_id"
)
SPLIT_WORKER_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "budgets": ("SELECT",),
    "model_prices": ("SELECT",),
    "price_history": ("SELECT",),
    "ledger_currency": ("SELECT",),
    "spend_budgets": ("SELECT",),
    "budget_counters": ("SELECT",),
    "budget_holds": ("SELECT",),
    "budget_doubts": ("SELECT",),
    "rate_limits": ("SELECT", "UPDATE (requests_tat, tokens_tat)"),
    "batches": ("SELECT", "INSERT", f"UPDATE ({_BATCH_WORKER_COLUMNS})"),
    # A recorded call's price, money and counts are decided as it is recorded (the ledger's
    # trigger): a worker's commit or failure changes only its outcome, error and answer.
    "model_calls": ("SELECT", "INSERT", "UPDATE (outcome, error, answer)"),
}
#: What the operator role holds beyond today's worker map.
OPERATOR_EXTRA: dict[str, tuple[str, ...]] = {
    "ledger_currency": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "budget_doubts": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "batches": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "ledger_options": ("SELECT", "INSERT", "UPDATE"),
}
#: The statements only the operator role may run once the roles are split, and what each does:
#: a worker's role refused one is told it needs the operator's, not the worker's it has.
OPERATOR_STATEMENTS: dict[str, str] = {
    "set_price": "setting a price",
    "delete_prices": "deleting prices",
    "set_budget": "setting a budget",
    "clear_budget": "clearing a budget",
    "set_rate_limit": "setting a rate limit",
    "delete_rate_limit": "deleting a rate limit",
    "request_batch_cancel": "cancelling a batch",
    "settle_doubt": "settling a call in doubt",
}
#: The option ``migrate --split-roles`` records.
SPLIT_OPTION = "split_roles"
_WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
_ROLE_NAME_MAX = 63


def worker_privileges(split: bool) -> dict[str, tuple[str, ...]]:
    """The worker role's privileges: today's map, or once the roles are split, only reads of
    what operators set (workers change counters through the ledger's functions)."""
    return {**WORKER_PRIVILEGES, **SPLIT_WORKER_PRIVILEGES} if split else dict(WORKER_PRIVILEGES)


def operator_privileges() -> dict[str, tuple[str, ...]]:
    """The operator role's privileges: a worker's (not split) and what only operators do."""
    return {**WORKER_PRIVILEGES, **OPERATOR_EXTRA}


def worker_role(schema_name: str) -> str:
    return f"{schema_name}_worker"


def reader_role(schema_name: str) -> str:
    return f"{schema_name}_reader"


def operator_role(schema_name: str) -> str:
    return f"{schema_name}_operator"


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


def settle_function(schema_name: str) -> sql.Composed:
    return sql.SQL("{}.settle_doubt(bigint, bigint, bigint, text)").format(
        sql.Identifier(schema_name)
    )


def _grant_exactly(
    conn: psycopg.Connection, schema_name: str, roles: dict[str, dict[str, tuple[str, ...]]]
) -> None:
    """Each group role's privileges made exactly its map's (``roles``: role to map; an empty
    map: reads only), in one transaction; settling calls in doubt is the operator's alone."""
    schema = sql.Identifier(schema_name)
    names = sql.SQL(", ").join(sql.Identifier(r) for r in roles)
    relations = list(WORKER_PRIVILEGES)
    with conn.transaction():
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, names))
        for relation in relations:
            target = sql.Identifier(schema_name, relation)
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(target, names))
            for role, privileges in roles.items():
                wanted = privileges.get(relation, ("SELECT",)) if privileges else ("SELECT",)
                conn.execute(
                    sql.SQL("GRANT {} ON {} TO {}").format(
                        sql.SQL(", ").join(sql.SQL(p) for p in wanted),
                        target,
                        sql.Identifier(role),
                    )
                )
        settle = settle_function(schema_name)
        found = conn.execute(
            "SELECT to_regprocedure(%s) IS NOT NULL", (settle.as_string(conn),)
        ).fetchone()
        if found and found[0]:
            conn.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM {}").format(settle, names))
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                    settle, sql.Identifier(operator_role(schema_name))
                )
            )


def roles_split(conn: psycopg.Connection, schema_name: str) -> bool:
    """Whether an operator split the roles (``migrate --split-roles``) on this ledger."""
    table = sql.Identifier(schema_name, "ledger_options")
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(conn),)).fetchone()
    if not found or not found[0]:
        return False
    row = conn.execute(
        sql.SQL("SELECT value FROM {} WHERE name = %s").format(table), (SPLIT_OPTION,)
    ).fetchone()
    return row is not None and row[0] == "true"


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
    groups = [worker, reader, operator_role(schema_name)]
    rows = conn.execute(_DIRECT_GRANTEES, (schema_name, groups)).fetchall()
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


def ensure_grants(
    conn: psycopg.Connection, schema_name: str, split_roles: bool = False, *, upgraded: bool = True
) -> GrantReport:
    """Create the group roles if missing, make their privileges the maps', and turn roles
    granted table by table into members. ``split_roles``: record that the roles are split from
    now on (the worker role then only reads prices, budgets and limits). Needs the schema's
    owner (the role that migrates), and CREATEROLE the first time; what cannot be done is said
    in ``found``, never raised. ``upgraded``: migrations were applied now, so a ledger whose
    roles are not split hears how to split them (``doctor`` says it every time)."""
    report = GrantReport()
    worker, reader = worker_role(schema_name), reader_role(schema_name)
    operator = operator_role(schema_name)
    if len(operator) > _ROLE_NAME_MAX:
        report.found.append(
            f"no group roles for schema {schema_name}: {operator} would be longer than "
            f"{_ROLE_NAME_MAX} characters; grant the privileges of core/grants.py by hand"
        )
        return report
    if not all(_ensure_role(conn, r, report) for r in (worker, reader, operator)):
        return report
    if split_roles:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (name, value, set_by) VALUES (%s, 'true', current_user)"
                " ON CONFLICT (name) DO UPDATE SET value = 'true', set_at = now(),"
                " set_by = current_user"
            ).format(sql.Identifier(schema_name, "ledger_options")),
            (SPLIT_OPTION,),
        )
    split = roles_split(conn, schema_name)
    try:
        _grant_exactly(
            conn,
            schema_name,
            {worker: worker_privileges(split), operator: operator_privileges(), reader: {}},
        )
    except psycopg.errors.InsufficientPrivilege as exc:
        report.found.append(
            f"could not grant the ledger's tables to {worker}, {operator} and {reader}: "
            f"{exc.diag.message_primary} (migrate as the schema's owner)"
        )
        return report
    if split_roles:
        report.done.append(
            f"split the roles: {worker} only reads prices, budgets and limits now; "
            f"{operator} sets them, cancels batches and settles calls in doubt"
        )
    elif not split and upgraded:
        report.found.append(
            f"{worker} may still set prices, budgets and limits and cancel batches (as releases "
            "before 0021 needed): once every worker runs this release, run `idempotent-jobs "
            f"migrate --split-roles` to leave that to {operator}"
        )
    _adopt_direct_grantees(conn, schema_name, worker, reader, report)
    return report
