"""The ``idempotent-jobs`` command line: tables by default, ``--json`` for scripts.

Each command lives in a module of ``operator/commands/`` with its handler and its parser; this
module adds the global options (the ledger's schema, the connection timeout, where the code
location is) and turns every error into one line and exit 2. Building the parser imports nothing
heavy: psycopg is imported by the commands that talk to the ledger, and Dagster only by those
that need it (``dev``, ``reconcile``, ``revise --now``, ``outbox deliver``, the demo), so
``--help`` and ``runs list`` start in a fraction of a second.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from idempotent_jobs import __version__
from idempotent_jobs.core.constants import DATABASE_URL_ENV, DEFAULT_SCHEMA
from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.operator.commands import (
    batches,
    costs,
    db,
    doubts,
    drill,
    health,
    launch,
    limits,
    outbox,
    prune,
    revise,
    runs,
    setup,
    shadow,
)
from idempotent_jobs.operator.commands.common import Shared, positive
from idempotent_jobs.operator.render import escape_controls

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (
    setup,
    db,
    launch,
    runs,
    outbox,
    health,
    revise,
    prune,
    drill,
    costs,
    doubts,
    limits,
    batches,
    shadow,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotent-jobs",
        description="Scheduled AI jobs that are safe to run more than once. The database is "
        f"{DATABASE_URL_ENV}, or the project's embedded PostgreSQL when it is unset.",
    )
    parser.add_argument("--version", action="version", version=f"idempotent-jobs {__version__}")
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help="ledger schema name")
    where = parser.add_argument_group(
        "code location (for reconcile, revise --channel/--now, outbox deliver, prune, drill "
        "--job, estimate, dev; default: $IDEMPOTENT_JOBS_CODE_LOCATION=module[:attribute], "
        "else the project's [tool.dagster] or workspace.yaml, as dagster dev finds them)"
    )
    where.add_argument("-m", "--module-name", help="module holding your Dagster Definitions")
    where.add_argument("-f", "--python-file", help="Python file holding your Definitions")
    where.add_argument("-a", "--attribute", help="the Definitions' name in that module or file")
    where.add_argument("-w", "--workspace", help="a Dagster workspace.yaml")
    parser.add_argument(
        "--connect-timeout",
        type=positive(float, 3600.0),
        default=10.0,
        help="seconds to wait for the database (libpq counts whole seconds: rounded up)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    shared = Shared.build()
    for command in COMMANDS:
        command.add_parser(commands, shared)
    return parser


def fail(exc: BaseException) -> int:
    """One line on stderr, exit 2: the error's type and text, controls escaped, no password."""
    from idempotent_jobs.core.database import redact

    text = redact(str(exc), os.environ.get(DATABASE_URL_ENV))
    print(f"idempotent-jobs: {type(exc).__name__}: {escape_controls(text)}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import psycopg

    try:
        code: int = args.handler(args)
        sys.stdout.flush()
    except (LedgerError, psycopg.Error) as exc:
        return fail(exc)
    except BrokenPipeError:  # `| head` closed the pipe: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit raises nothing either
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
