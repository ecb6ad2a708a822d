"""``migrate``, ``demo`` and ``dev``: setting the ledger up, the demo, the Dagster UI."""

import argparse
import os
from typing import Any

from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import (
    Shared,
    open_admin,
    open_worker,
    positive,
)
from idempotent_jobs.operator.render import escape_controls


def migrate(args: argparse.Namespace) -> int:
    report = open_admin(args).upgrade(split_roles=args.split_roles)
    print(f"applied: {', '.join(report.applied)}" if report.applied else "schema is up to date")
    for line in report.done:
        print(f"done: {escape_controls(line)}")
    for line in report.found:
        print(f"found: {escape_controls(line)}")
    return 0


def demo(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.dagster_demo import run_dagster_demo
    from idempotent_jobs.operator.demo import run_demo

    def say(line: str) -> None:  # model answers are printed: escape what a terminal acts on
        print(escape_controls(line))

    embedded = not os.environ.get(DATABASE_URL_ENV)
    if not embedded and not args.any_database:
        raise InvalidInputError(
            "demo",
            f"{DATABASE_URL_ENV} is set: the demo runs only on the project's embedded database, "
            "so that it never reuses or delivers another deployment's runs; unset it, or pass "
            "--any-database",
        )
    admin = open_admin(args)
    admin.migrate()
    with open_worker(args) as ledger, admin:  # the demo plays a worker, then shows the ledger
        run_demo(ledger, admin, say)
        print()
        run_dagster_demo(admin, say)
    if embedded:
        from idempotent_jobs.operator.database_commands import data_directory

        print(
            f"\nthe ledger is the embedded PostgreSQL in {data_directory()}; it keeps running. "
            "`idempotent-jobs db stop` stops it, `db psql` opens psql on it, and "
            '`eval "$(idempotent-jobs db env)"` lets plain `dagster dev` use it'
        )
    return 0


def dev(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.dev import run_dev

    return run_dev(
        args.host,
        args.port,
        module=args.module_name,
        python_file=args.python_file,
        attribute=args.attribute,
        workspace=args.workspace,
    )


def add_parser(commands: Any, shared: Shared) -> None:
    migrating = commands.add_parser("migrate", help="create or upgrade the ledger schema")
    migrating.add_argument(
        "--split-roles",
        action="store_true",
        help="from now on the worker role only reads prices, budgets and limits (the operator "
        "role sets them); run once every worker runs this release",
    )
    migrating.set_defaults(handler=migrate)
    demo_parser = commands.add_parser("demo", help="run the demo and show the ledger")
    demo_parser.add_argument(
        "--any-database",
        action="store_true",
        help="run it on the configured database too (by default only on the embedded one, so "
        "it never touches another deployment's runs)",
    )
    demo_parser.set_defaults(handler=demo)

    dev_parser = commands.add_parser("dev", help="the Dagster UI and daemon wired to the ledger")
    dev_parser.add_argument("--host", default="127.0.0.1")
    dev_parser.add_argument("--port", type=positive(int, 65535), default=3000)
    dev_parser.set_defaults(handler=dev)
