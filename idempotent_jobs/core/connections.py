"""What every ledger connection is checked and set up with: JSON read safely, the zone in UTC
behind a pooler, whether a pooler stands in between, and PostgreSQL's refusals as typed
errors. The executor (:mod:`idempotent_jobs.core.executor`) applies them to each connection."""

import psycopg
from psycopg.types.json import set_json_loads

from idempotent_jobs.core.errors import (
    LedgerPermissionError,
)
from idempotent_jobs.core.grants import (
    OPERATOR_STATEMENTS,
    operator_role,
    reader_role,
    worker_role,
)
from idempotent_jobs.core.json_values import read_json


def permission_error(
    exc: psycopg.errors.InsufficientPrivilege, schema_name: str, statement: str | None = None
) -> LedgerPermissionError:
    """The typed error for a privilege PostgreSQL refused. Refused one of the operator's
    statements (``statement``: its name), the role needs the operator's group role; else what
    every worker needs."""
    worker, reader = worker_role(schema_name), reader_role(schema_name)
    doing = OPERATOR_STATEMENTS.get(statement or "")
    if doing is not None:
        operator = operator_role(schema_name)
        return LedgerPermissionError(
            f"{doing} is the operator role's, and this database role may not: "
            f"{exc.diag.message_primary or exc}. Grant it the group role {operator} "
            f"(`GRANT {operator} TO <role>`), or run the command with an operator's URL; "
            "`idempotent-jobs doctor` says what a role may do"
        )
    return LedgerPermissionError(
        f"the database role lacks a privilege: {exc.diag.message_primary or exc}. Workers need "
        f"USAGE on schema {schema_name} and the table privileges of the group role {worker} "
        f"(read-only tools: {reader}), which every migrate grants: `GRANT {worker} TO <role>`. "
        "A role granted table by table, as release 0.1 advised, lacks the tables added since "
        "until migrate runs; `idempotent-jobs doctor` names what is missing. Migrate itself "
        "needs CREATE on the database, or the schema's owner"
    )


def stale_plan(exc: psycopg.Error) -> bool:
    """Whether PostgreSQL refused a prepared statement whose tables a migration changed."""
    return "cached plan must not change result type" in str(exc)


def configure_connection(conn: psycopg.Connection) -> None:
    """What every ledger connection needs: JSON read through :func:`read_json`, so a value an
    earlier release stored too deep is shown as unreadable instead of breaking the read."""
    set_json_loads(read_json, conn)


def configure_pooled_connection(conn: psycopg.Connection) -> None:
    """:func:`configure_connection`, and the session's zone set to UTC by a ``SET``: PgBouncer
    drops the startup ``options`` that carry it on a direct connection when its
    ``ignore_startup_parameters`` lists them (1.18 refuses the client otherwise), but it tracks
    ``TimeZone`` and sets it again on every server connection it hands this client."""
    configure_connection(conn)
    conn.execute("SET TimeZone TO 'UTC'", prepare=False)


def behind_pooler(conn: psycopg.Connection) -> bool:
    """Whether ``conn`` reaches PostgreSQL through a connection pooler such as PgBouncer.

    A pooler hands the client a backend key of its own (it must route cancel requests), so the
    process id the server reports differs from the one the connection was given at startup;
    on a direct connection, or through a plain TCP proxy, they are the same.

    Never prepared, whatever the connection's ``prepare_threshold``: this check is what
    decides whether preparing is safe, and a pool opened on a direct host runs it on every new
    connection, which after a failover is PgBouncer's. There a prepared check (``_pg3_0``)
    lands on a server connection PgBouncer shares between clients and collides with another
    client's, and the pool cannot make a connection until its timeout.
    """
    row = conn.execute("SELECT pg_backend_pid()", prepare=False).fetchone()
    return row is None or int(row[0]) != conn.info.backend_pid
