"""The ``idempotent-jobs`` command line."""

import argparse
import sys
from collections.abc import Sequence

from idempotent_jobs.database import ensure_database_url
from idempotent_jobs.errors import LedgerError
from idempotent_jobs.ledger import RunLedger


def _ledger(args: argparse.Namespace) -> RunLedger:
    return RunLedger(database_url=ensure_database_url(), schema_name=args.schema)


def _migrate(args: argparse.Namespace) -> int:
    applied = _ledger(args).migrate()
    print(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from idempotent_jobs.dagster_demo import run_dagster_demo
    from idempotent_jobs.demo import run_demo

    ledger = _ledger(args)
    ledger.migrate()
    with ledger:
        run_demo(ledger)
        print()
        run_dagster_demo(ledger)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotent-jobs",
        description="Scheduled AI jobs that are safe to run more than once. The database is "
        "IDEMPOTENT_JOBS_DATABASE_URL, or an embedded PostgreSQL when it is unset.",
    )
    parser.add_argument("--schema", default="idempotent_jobs", help="ledger schema name")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="create or upgrade the ledger schema").set_defaults(
        handler=_migrate
    )
    commands.add_parser("demo", help="run one logical run twice and show the ledger").set_defaults(
        handler=_demo
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except LedgerError as exc:
        print(f"idempotent-jobs: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
