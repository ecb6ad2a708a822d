"""``prune``: what each job's retention policy lets go, a dry run unless ``--apply``."""

import argparse
from typing import TYPE_CHECKING, Any

from idempotent_jobs.operator.commands.common import (
    MAX_DAYS,
    Shared,
    code_location,
    emit,
    open_admin,
    positive,
)
from idempotent_jobs.operator.render import escape_controls, human_bytes, table

if TYPE_CHECKING:
    from idempotent_jobs.core.retention import RetentionPolicy


def retention_policies(
    args: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[list[tuple[str, "RetentionPolicy"]], list[str]]:
    """(identity job name, policy) to prune by, and what was matched: each job's spec policy in
    the code location, with the command line's overrides; ``--job`` by Dagster or identity job
    name (unknown: exit 2). Without a code location, the overrides alone, for the ``--job``
    identity names given or every job in the ledger."""
    from idempotent_jobs.core.retention import RetentionPolicy
    from idempotent_jobs.operator.location_targets import CodeLocationError

    try:
        workspace = code_location(args)
    except CodeLocationError as exc:
        if not overrides:
            raise CodeLocationError(
                f"{exc.reason}; or give the parts to prune on the command line "
                "(--raw-input-days, --output-days, --attempts-days, --outbox-days)"
            ) from None
        with open_admin(args) as admin:
            names = list(args.job or admin.job_names())
        policy = RetentionPolicy().overridden(**overrides)
        return [(name, policy) for name in dict.fromkeys(names)], [
            "no code location: the command line's retention for identity jobs "
            + (", ".join(names) or "(none in the ledger)")
        ]
    if args.job:
        matches = [workspace.find_job(name) for name in args.job]
        specs = [m.spec for m in matches]
        said = [f"job: {m.describe()}" for m in matches]
    else:
        specs, said = workspace.specs, [f"jobs of {workspace.describe()}"]
    policies = [(s.identity_job_name, s.retention.overridden(**overrides)) for s in specs]
    return list(dict(policies).items()), said


def prune(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from idempotent_jobs.core.retention import PART_TABLES, PARTS, describe_kept, prune

    days = {
        "raw_input": args.raw_input_days,
        "output": args.output_days,
        "attempts": args.attempts_days,
        "delivered_payloads": args.outbox_days,
    }
    overrides = {part: timedelta(days=d) for part, d in days.items() if d is not None}
    policies, said = retention_policies(args, overrides)
    with open_admin(args) as admin:
        reports = [
            prune(admin, name, policy, apply=args.apply, batch_size=args.batch_size)
            for name, policy in policies
            if policy.prunes_anything
        ]
    rows = [
        (
            report.job_name,
            PART_TABLES[part],
            report.parts[part].rows,
            human_bytes(report.parts[part].bytes),
            describe_kept(getattr(report.policy, part)),
        )
        for report in reports
        for part in PARTS
        if getattr(report.policy, part) is not None
    ]
    rows += [
        (report.job_name, "spend rows", report.spend_rows, "-", "this month and the one before")
        for report in reports
        if report.spend_rows
    ]
    kept_all = [name for name, policy in policies if not policy.prunes_anything]
    head = "pruned:" if args.apply else "dry run, nothing was pruned; with --apply these would go:"
    lines = [
        *map(escape_controls, said),
        head,
        table(["job", "part", "rows", "bytes", "kept for"], rows),
    ]
    lines.append(
        f"{sum(r.rows for r in reports)} rows, {human_bytes(sum(r.bytes for r in reports))} "
        f"in {sum(r.batches for r in reports)} batches of at most {args.batch_size}, "
        f"{sum(r.seconds for r in reports):.1f} s"
    )
    if kept_all:
        lines.append(
            f"kept whole (no retention policy): {escape_controls(', '.join(kept_all))}; "
            "--raw-input-days, --output-days, --attempts-days, --outbox-days set one"
        )
    emit(args, reports, "\n".join(lines))
    return 0


def add_parser(commands: Any, shared: Shared) -> None:
    pruning = commands.add_parser(
        "prune",
        parents=[shared.json_flag],
        help="drop old payloads by each job's retention policy (a dry run unless --apply)",
        description=(
            "Runs keep their rows forever (they make a rerun a no-op); their raw input, output, "
            "attempt rows and delivered notification payloads go after the job's retention "
            "policy, in batches, while the jobs run. Without --apply, only counts."
        ),
    )
    pruning.add_argument(
        "--job", action="append", help="a job (Dagster or identity name; repeatable; default all)"
    )
    pruning.add_argument("--apply", action="store_true", help="prune (default: a dry run)")
    pruning.add_argument(
        "--batch-size", type=positive(int), default=5000, help="rows per transaction"
    )
    for flag, what in (
        ("--raw-input-days", "raw inputs"),
        ("--output-days", "accepted outputs"),
        ("--attempts-days", "attempt rows"),
        ("--outbox-days", "delivered notification payloads"),
    ):
        pruning.add_argument(
            flag,
            type=positive(float, MAX_DAYS),
            help=f"keep {what} this many days (overrides the job's)",
        )
    pruning.set_defaults(handler=prune)
