"""``db``: the parser of the embedded-PostgreSQL commands (``operator/database_commands.py``)."""

import argparse
from typing import Any

from idempotent_jobs.operator.commands.common import (
    Shared,
)


def db_handler(name: str) -> Any:
    """The handler ``name`` of ``operator/database_commands.py``, imported when it runs."""

    def handler(args: argparse.Namespace) -> int:
        from idempotent_jobs.operator import database_commands

        code: int = getattr(database_commands, name)(args)
        return code

    return handler


def add_parser(commands: Any, shared: Shared) -> None:
    db = commands.add_parser(
        "db", help="the project's embedded PostgreSQL: url, env, status, stop, psql"
    ).add_subparsers(dest="db_command", required=True)
    db.add_parser("url", help="its URL (starts it if needed)").set_defaults(
        handler=db_handler("db_url")
    )
    db.add_parser(
        "env", help='export lines for plain `dagster dev`: eval "$(idempotent-jobs db env)"'
    ).set_defaults(handler=db_handler("db_env"))
    db.add_parser("status", help="running or not, and where").set_defaults(
        handler=db_handler("db_status")
    )
    db.add_parser("stop", help="stop it (the data stays)").set_defaults(
        handler=db_handler("db_stop")
    )
    psql = db.add_parser("psql", help="psql on the ledger database")
    psql.add_argument("psql_args", nargs=argparse.REMAINDER, help="passed on to psql")
    psql.set_defaults(handler=db_handler("db_psql"))
