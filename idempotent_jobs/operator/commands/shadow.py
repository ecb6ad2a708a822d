"""``shadow``: try a new version of a job on stored runs before it delivers (``start``,
``advance``, ``show``, ``list``, ``promote``, ``drop``). See ``docs/shadow.md``."""

import argparse
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import (
    Shared,
    emit,
    open_admin,
    positive,
    when,
)
from idempotent_jobs.operator.render import escape_controls
from idempotent_jobs.operator.shadow_engine import Overrides, engine, run_on, worker_id

if TYPE_CHECKING:  # the CLI parses without importing psycopg
    from idempotent_jobs.core.admin import LedgerAdmin


def shadow_start(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.shadow_report import shown
    from idempotent_jobs.shadows import start

    budget = None
    if args.budget is not None:
        try:
            budget = Decimal(args.budget)
        except InvalidOperation:
            raise InvalidInputError("--budget", f"is not an amount: {args.budget!r}") from None
    subjects = [s.strip() for s in args.subjects.split(",") if s.strip()] if args.subjects else None
    overrides = Overrides(model=args.model, prompt=args.prompt)
    with engine(args, args.job, args.version, args.lane, overrides, explicit=True) as (
        spec,
        steps,
        provider,
        admin,
        ledger,
    ):
        shadow_id, count = start(
            admin,
            steps,
            lane=args.lane,
            baseline_version=args.baseline,
            window_from=args.window_from,
            window_to=args.window_to,
            subjects=subjects,
            sample=args.sample,
            budget=budget,
            provider=provider.name if provider is not None else None,
            model=provider.model if provider is not None else steps.config.parts.get("model"),
            requested_by=args.requested_by,
            quarantined=args.quarantined,
        )
        found = run_on(args, ledger, steps, provider, shadow_id)
        row = admin.shadow(shadow_id)
    human = shown(row, [], 0)
    if count == 0:
        human += "\nno completed run with its raw input kept matches: nothing to compare"
    elif not found.compared:
        human += f"\nadvance it with: idempotent-jobs shadow advance {shadow_id} --wait"
    emit(args, row, human)
    return 0


def shadow_advance(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.shadow_report import shown

    with open_admin(args) as admin:
        row = _shadow_row(admin, args.shadow_id)
    with engine(args, row["job_name"], row["version"], row["lane"], Overrides.of_row(row)) as (
        _spec,
        steps,
        provider,
        admin,
        ledger,
    ):
        run_on(args, ledger, steps, provider, row["shadow_id"])
        row = admin.shadow(row["shadow_id"])
    emit(args, row, shown(row, [], 0))
    return 0


def _shadow_row(admin: "LedgerAdmin", shadow_id: str) -> dict[str, Any]:
    row: dict[str, Any] | None = admin.shadow(shadow_id)
    if row is None:
        raise InvalidInputError("shadow_id", f"no shadow {shadow_id!r}")
    return row


def shadow_show(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.shadow_report import render_report, shown

    with open_admin(args) as admin:
        row = _shadow_row(admin, args.shadow_id)
        items = admin.shadow_items(args.shadow_id)
    if args.report:
        path = Path(args.report)
        path.write_text(render_report(row, items, html=path.suffix.lower() in (".html", ".htm")))
    data = {**row, "items": [_item_json(i) for i in items]}
    text = shown(row, items, args.limit)
    if args.report:
        text += f"\nreport written to {args.report}"
    emit(args, data, text)
    return 0


def _item_json(item: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "run_id",
        "subject_id",
        "scheduled_at",
        "state",
        "verdict",
        "score",
        "valid",
        "error",
        "accepted",
        "answer",
        "detail",
        "money",
        "run_money",
        "input_tokens",
        "output_tokens",
        "promoted_revision",
    )
    return {k: item.get(k) for k in keep}


def shadow_list(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.render import table

    with open_admin(args) as admin:
        rows = admin.shadows(args.job)
    shown_rows = [
        (
            r["shadow_id"],
            r["job_name"],
            f"{r['baseline_version']} -> {r['version']}",
            r["lane"],
            r["state"],
            _agreement(r.get("summary")),
            r["created_at"].strftime("%Y-%m-%d %H:%M"),
        )
        for r in rows
    ]
    headers = ["shadow", "job", "versions", "lane", "state", "agree", "made"]
    emit(args, rows, table(headers, shown_rows))
    return 0


def _agreement(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("agreement") is None:
        return "-"
    return f"{float(summary['agreement']):.1%} of {summary.get('compared', 0)}"


def shadow_promote(args: argparse.Namespace) -> int:
    from idempotent_jobs.shadows import promote

    with open_admin(args) as admin:
        row = _shadow_row(admin, args.shadow_id)
    with engine(args, row["job_name"], row["version"], "online", Overrides.of_row(row)) as (
        spec,
        steps,
        _provider,
        admin,
        ledger,
    ):
        unknown = [c for c in args.channel if c not in spec.channels]
        if unknown:
            raise InvalidInputError(
                "--channel",
                f"{', '.join(map(repr, unknown))} is not a channel of job {spec.name}; its "
                f"channels: {', '.join(spec.channels) or 'none'}",
            )
        done = promote(
            ledger,
            admin,
            steps,
            row["shadow_id"],
            worker_id=worker_id(),
            revise=args.revise,
            channels=args.channel or list(spec.channels),
            force=args.force,
        )
    human = escape_controls(
        f"shadow {row['shadow_id']} promoted: version {row['version']} of job "
        f"{row['job_name']} delivers for new windows"
    )
    if args.revise:
        human += (
            f"\nrevised {done['revised']} changed run(s) with the shadow's answers "
            f"({done['already']} before, {done['stale']} moved on since, "
            f"{done['failed']} whose commit failed, "
            f"{done['unchanged']} unchanged or invalid: not revised); deliver the outbox to "
            "send them"
        )
    emit(args, {k: v for k, v in done.items() if k != "shadow"}, human)
    return 0


def shadow_drop(args: argparse.Namespace) -> int:
    from idempotent_jobs.shadows import drop

    with open_admin(args) as admin:
        row = _shadow_row(admin, args.shadow_id)
    with engine(args, row["job_name"], row["version"], row["lane"], Overrides.of_row(row)) as (
        _spec,
        _steps,
        provider,
        _admin,
        ledger,
    ):
        found = drop(ledger, provider, row["shadow_id"], worker_id=worker_id())
    emit(
        args,
        {"shadow_id": found.shadow_id, "state": found.state},
        f"shadow {found.shadow_id}: {found.state}",
    )
    return 0


def add_parser(commands: Any, shared: Shared) -> None:
    shadow = commands.add_parser(
        "shadow", help="try a new version on stored runs before it delivers"
    ).add_subparsers(dest="shadow_command", required=True)
    start = shadow.add_parser(
        "start", parents=[shared.json_flag], help="compute a new version's answers for stored runs"
    )
    start.add_argument("--job", required=True, help="the job (Dagster or identity job name)")
    start.add_argument("--version", required=True, help="the new version (a spec defines it)")
    start.add_argument("--baseline", help="the stored runs' version (default: the latest other)")
    start.add_argument("--from", dest="window_from", type=when, help="windows from (included)")
    start.add_argument("--to", dest="window_to", type=when, help="windows before (excluded)")
    start.add_argument("--subjects", help="only these subjects (comma separated)")
    start.add_argument("--sample", type=positive(int, 10**7), help="at most this many runs")
    start.add_argument("--lane", choices=("batch", "online"), default="batch")
    start.add_argument("--budget", help="the most this shadow may spend (ledger currency)")
    start.add_argument(
        "--model", help="the model to try, when no spec defines --version (default: the job's)"
    )
    start.add_argument(
        "--prompt", help="the prompt to try, when no spec defines --version (default: the job's)"
    )
    start.add_argument("--requested-by", default=None, help="who asks (kept with it)")
    start.add_argument(
        "--quarantined",
        action="store_true",
        help="only runs with an answer that failed validation (runs quarantine)",
    )
    for parser in (
        start,
        advance := shadow.add_parser(
            "advance",
            parents=[shared.json_flag],
            help="move a shadow on (submit, collect, compare)",
        ),
    ):
        parser.add_argument("--wait", action="store_true", help="until it is compared")
        parser.add_argument("--poll-seconds", type=positive(float, 3600.0), default=30.0)
    start.set_defaults(handler=shadow_start)
    advance.add_argument("shadow_id")
    advance.set_defaults(handler=shadow_advance)
    show = shadow.add_parser("show", parents=[shared.json_flag], help="a shadow's comparison")
    show.add_argument("shadow_id")
    show.add_argument("--report", help="write a report (.md, or .html) with the answers")
    show.add_argument(
        "--limit",
        type=positive(int, zero=True),
        default=20,
        help="differing answers shown (0: none)",
    )
    show.set_defaults(handler=shadow_show)
    listing = shadow.add_parser("list", parents=[shared.json_flag], help="shadows, newest first")
    listing.add_argument("--job", help="only this identity job's")
    listing.set_defaults(handler=shadow_list)
    promote = shadow.add_parser(
        "promote", parents=[shared.json_flag], help="make the shadow's version deliver"
    )
    promote.add_argument("shadow_id")
    promote.add_argument(
        "--revise",
        action="store_true",
        help="re-deliver the changed answers of past windows as revisions",
    )
    promote.add_argument(
        "--channel",
        action="append",
        default=[],
        help="notify only this channel (repeatable; default: the job's)",
    )
    promote.add_argument("--force", action="store_true", help="even if it misses the job's rule")
    promote.set_defaults(handler=shadow_promote)
    dropping = shadow.add_parser("drop", parents=[shared.json_flag], help="end a shadow")
    dropping.add_argument("shadow_id")
    dropping.set_defaults(handler=shadow_drop)
