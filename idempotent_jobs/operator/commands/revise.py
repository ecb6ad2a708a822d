"""``revise``: replace a run's accepted answer on purpose, kept in history."""

import argparse
import sys
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import InvalidInputError, RunNotFoundError
from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    open_admin,
)
from idempotent_jobs.operator.render import escape_controls

if TYPE_CHECKING:  # the CLI parses without importing psycopg
    from idempotent_jobs.core.admin import LedgerAdmin


def revise(args: argparse.Namespace) -> int:
    """Everything that can be checked is checked before the one write (the revise itself)."""
    with open_admin(args) as admin:
        run_id = admin.resolve_run_id(args.run_id)
        record = admin.get(run_id)
        if record is None:
            raise RunNotFoundError(f"run {run_id} is not registered")
        if record.status != "completed":
            raise InvalidInputError(
                "run_id", f"only a completed run can be revised; {run_id} is {record.status}"
            )
        partition = None
        if args.channel or args.now:
            from idempotent_jobs.operator.rerun import partition_for_run, rerun_partition

            workspace = code_location(args)
            spec = workspace.spec_for_identity(record.job_name, record.version)
            unknown = [c for c in args.channel if c not in spec.channels]
            if unknown:
                raise InvalidInputError(
                    "--channel",
                    f"{', '.join(map(repr, unknown))} is not a channel of job {spec.name}; "
                    f"its channels: {', '.join(spec.channels) or 'none'}",
                )
            if args.now:  # everything the recompute needs, checked before the revise writes
                partition = partition_for_run(workspace, record)
                workspace.check_resources(spec)
                _check_budget_room(admin, record.job_name, record.subject_id)
        record = admin.revise(
            run_id,
            args.reason,
            channels=args.channel,
            recollect=args.recollect,
            requested_by=args.requested_by,
        )
        if partition is not None:
            try:
                rerun_partition(workspace, *partition)
            except Exception as exc:  # the revision stands; say so in one line
                print(
                    f"idempotent-jobs: run {record.run_id} is revised (revision "
                    f"{record.revision} recorded), but its recompute failed: "
                    f"{escape_controls(describe_error(exc))}",
                    file=sys.stderr,
                )
                return 1
            record = admin.get(run_id) or record
    done = "recomputed" if args.now else "reopened"
    human = (
        f"run {record.run_id} {done} as revision {record.revision}: status={record.status}"
        f"\nnotify on completion: {escape_controls(', '.join(args.channel)) or 'no channel'}"
    )
    if not args.now:
        human += "\nlaunch its partition in Dagster (or pass --now) to recompute it"
    emit(args, record, human)
    return 0


def add_parser(commands: Any, shared: Shared) -> None:
    parser = commands.add_parser(
        "revise", parents=[shared.json_flag], help="recompute a completed run (kept in history)"
    )
    parser.add_argument("run_id", help="run id (or a unique prefix)")
    parser.add_argument("--reason", required=True, help="why the accepted result is replaced")
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        help="notify this channel of the new result (repeatable; default none)",
    )
    parser.add_argument("--recollect", action="store_true", help="collect the input again")
    parser.add_argument("--requested-by", default=None, help="who asks (kept in history)")
    parser.add_argument(
        "--now", action="store_true", help="recompute now, running the partition in this process"
    )
    parser.set_defaults(handler=revise)


def _check_budget_room(admin: "LedgerAdmin", job_name: str, subject_id: str) -> None:
    """Refuse ``--now`` before anything is written when a budget of the job (of its group, or
    of the run's subject) has no room left this period: its recompute would be refused, leaving
    the run reopened, not done."""
    for standing in admin.budgets(job_name, subject_id=subject_id):
        used = standing.spent + standing.reserved + standing.in_doubt
        if used >= standing.amount:
            raise InvalidInputError(
                "--now",
                f"budget {standing.budget_id} has no room left this period ({used} of "
                f"{standing.amount} {standing.unit}): its recompute would be refused; revise "
                "without --now, or raise the budget first",
            )
