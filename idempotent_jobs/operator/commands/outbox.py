"""``outbox list`` (the ledger only) and ``outbox deliver`` (through the code location's
channels)."""

import argparse
from typing import Any

from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    open_admin,
    open_worker,
    positive,
)
from idempotent_jobs.operator.render import escape_controls, table


def outbox_list(args: argparse.Namespace) -> int:
    with open_admin(args) as admin:
        run_id = admin.resolve_run_id(args.run) if args.run else None
        rows = admin.outbox(run_id, pending_only=args.pending, limit=args.limit)
    human = table(
        ["key", "queued", "delivered", "tries", "last error", "payload"],
        [
            (
                o.idempotency_key,
                o.created_at,
                o.delivered_at,
                o.delivery_attempts,
                o.last_error,
                o.payload if o.payload_pruned_at is None else f"(pruned {o.payload_pruned_at})",
            )
            for o in rows
        ],
    )
    emit(args, rows, human)
    return 0


def outbox_deliver(args: argparse.Namespace) -> int:
    """Send the pending rows of the jobs the loaded code location owns (``--job``: of that one),
    each through its own job's channel; other jobs' rows stay pending, and are counted."""
    workspace = code_location(args)
    only = workspace.find_job(args.job).spec if args.job else None
    run_id = None
    if args.run:
        with open_admin(args) as admin:
            run_id = admin.resolve_run_id(args.run)
    with workspace.delivery(only) as router, open_worker(args) as ledger:
        report = ledger.deliver_outbox(
            router.send, run_id=run_id, limit=args.limit, job_names=router.job_names
        )
    human = table(
        ["key", "result"],
        [(r.idempotency_key, "delivered") for r in report.delivered]
        + [(r.idempotency_key, f"failed: {reason}") for r, reason in report.failed],
    )
    left = [
        f"left pending: {count} row(s) of job {escape_controls(job)}, which "
        f"{'--job does not name' if only else 'no loaded code location has'}"
        for job, count in report.left_pending.items()
    ]
    emit(args, report, "\n".join([human, *left]))
    return 1 if report.failed else 0


def add_parser(commands: Any, shared: Shared) -> None:
    outbox = commands.add_parser("outbox", help="notifications").add_subparsers(
        dest="outbox_command", required=True
    )
    olist = outbox.add_parser("list", parents=[shared.json_flag], help="list outbox rows")
    olist.add_argument("--pending", action="store_true", help="only undelivered rows")
    olist.add_argument("--run", help="only this run (id or prefix)")
    olist.add_argument("--limit", type=positive(int), default=1000)
    olist.set_defaults(handler=outbox_list)
    deliver = outbox.add_parser("deliver", parents=[shared.json_flag], help="send pending rows")
    deliver.add_argument("--run", help="only this run (id or prefix)")
    deliver.add_argument(
        "--job", help="only this job's rows (Dagster job name or identity job name)"
    )
    deliver.add_argument("--limit", type=positive(int), default=100)
    deliver.set_defaults(handler=outbox_deliver)
