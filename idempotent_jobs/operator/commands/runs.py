"""``runs list``, ``runs stats`` and ``runs spend`` (and the parser of ``runs show``): what the
ledger holds; no code is loaded."""

import argparse
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.budgets import figure
from idempotent_jobs.core.constants import RUN_STATUSES
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    open_admin,
    positive,
    when,
)
from idempotent_jobs.operator.commands.run_show import runs_show
from idempotent_jobs.operator.render import escape_controls, human_bytes, money, table

if TYPE_CHECKING:
    from idempotent_jobs.core.admin import LedgerAdmin
    from idempotent_jobs.core.budgets import BudgetStanding
    from idempotent_jobs.core.costs import JobSpend


def identity_job(args: argparse.Namespace, admin: "LedgerAdmin") -> tuple[str | None, str]:
    """``--job`` as the identity job name the ledger keys runs by. An identity name the ledger
    holds is used as it is (no code is loaded); another name is looked up in the code location
    (a Dagster job name); a name neither knows exits 2, listing the ledger's jobs."""

    if args.job is None:
        return None, ""
    from idempotent_jobs.core.identity import normalize_text

    held = admin.job_names()
    name = normalize_text(str(args.job))  # as identities store it: stripped, NFC
    if name in held:
        return name, f"identity job {name}"
    try:
        match = code_location(args).find_job(name)
    except InvalidInputError as exc:  # a CodeLocationError too: no code location here
        raise InvalidInputError(
            "--job",
            f"no runs of a job named {args.job!r}: the ledger's jobs are "
            f"{', '.join(held) or 'none yet'}; as a Dagster job name: {exc.reason}",
        ) from None
    return match.spec.identity_job_name, match.describe()


def runs_list(args: argparse.Namespace) -> int:
    with open_admin(args) as admin:
        job_name, matched = identity_job(args, admin)
        runs = admin.list_runs(
            job_name=job_name,
            subject_id=args.subject,
            status=args.status,
            since=args.since,
            until=args.until,
            limit=args.limit,
            after=args.after,
        )
    rows = [
        (
            r.run_id[:12],
            r.job_name,
            r.subject_id,
            r.scheduled_at,
            r.version,
            r.status,
            r.lease_epoch,
            r.attempts,
            r.revision,
            r.lease_owner,
            r.last_error,
        )
        for r in runs
    ]
    headers = [
        "run",
        "job",
        "subject",
        "window",
        "version",
        "status",
        "epoch",
        "attempts",
        "revision",
        "lease owner",
        "last error",
    ]
    human = table(headers, rows)
    if matched:
        human = f"job: {escape_controls(matched)}\n{human}"
    if len(runs) == args.limit:
        human += f"\nnext page: --after {runs[-1].run_id[:12]}"
    emit(args, runs, human)
    return 0


def _spend_rows(spend: "list[JobSpend]", currency: str) -> list[tuple[Any, ...]]:
    return [
        (
            s.job_name,
            f"{s.calls:,}",
            f"{s.tokens:,}",
            f"{s.wasted_tokens:,}",
            money(s.cost, currency, priced=s.priced),
            f"{s.unknown_calls:,}",
        )
        for s in spend
    ]


SPEND_HEADERS = ["job", "calls", "tokens", "not accepted", "cost", "in doubt"]
BUDGET_HEADERS = ["budget", "jobs", "since", "spent", "held", "in doubt", "cap", "left", "refusing"]


def budget_rows(budgets: "list[BudgetStanding]") -> list[tuple[Any, ...]]:
    """Each budget the ledger enforces, where its current period stands."""
    return [
        (
            b.budget_id + (f" ({b.subject_id})" if b.subject_id else ""),
            ", ".join(b.jobs),
            f"{b.period_start:%Y-%m-%d}",
            figure(b.spent, b.unit, b.currency),
            figure(b.reserved, b.unit, b.currency),
            figure(b.in_doubt, b.unit, b.currency),
            figure(b.amount, b.unit, b.currency),
            figure(b.left, b.unit, b.currency),
            "yes" if b.refusing else "no",
        )
        for b in budgets
    ]


def runs_stats(args: argparse.Namespace) -> int:
    with open_admin(args) as admin:
        tables, parts = admin.storage()
        spend = admin.spend_by_job(args.day)
        budgets = admin.budgets()
        currency = admin.currency() or ""
    approx = any(p.estimated for p in parts)
    rows = [
        (
            p.job_name,
            p.part,
            f"{'~' if p.estimated else ''}{p.rows:,}",
            f"{'~' if p.estimated else ''}{human_bytes(p.bytes)}",
        )
        for p in parts
    ]
    disk = [
        (
            t.table_name,
            None if t.estimated_rows is None else f"~{t.estimated_rows:,}",
            human_bytes(t.total_bytes),
        )
        for t in tables
    ]
    day = f"{spend[0].day_start:%Y-%m-%d}" if spend else "today"
    human = "\n".join(
        [
            f"model calls on {day} (UTC), each at the price row fixed when it was admitted:",
            table(SPEND_HEADERS, _spend_rows(spend, currency)),
            "",
            "budgets in the ledger (what every worker enforces), this period:",
            table(BUDGET_HEADERS, budget_rows(budgets)) if budgets else "(none)",
            "",
            table(["job", "part", "rows", "stored bytes"], rows),
            "",
            "on disk (indexes and TOAST included):",
            table(["table", "rows", "bytes"], disk),
        ]
        + (["", "~: estimated from a sample of the table's pages"] if approx else [])
    )
    data = {
        "spend": spend,
        "budgets": budgets,
        "currency": currency or None,
        "tables": tables,
        "parts": parts,
    }
    emit(args, data, human)
    return 0


def _month(text: str) -> tuple[datetime, datetime]:
    """``2026-12``: that calendar month's start and the next one's, UTC."""
    from idempotent_jobs.core.errors import InvalidInputError

    try:
        start = datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC)
        following = (start + timedelta(days=32)).replace(day=1)
    except (ValueError, OverflowError):
        raise InvalidInputError(
            "--month", f"must be a month from 0001-01 to 9999-11, such as 2026-12, got {text!r}"
        ) from None
    return start, following


def runs_spend(args: argparse.Namespace) -> int:
    if args.month is not None:
        _month(args.month)  # checked before any statement
    with open_admin(args) as admin:
        if args.month is None:
            now = admin.database_now()
            args.month = f"{now:%Y-%m}"
        start, end = _month(args.month)
        rows = admin.spend_by_kind(start, end, args.job)
        totals = admin.spend_totals(start, end, args.job)
        currency = admin.currency() or ""
    shown = [
        (
            r["job_name"],
            r["model"],
            "-" if r["price_from"] is None else _price_from(r["price_from"]),
            r["kind"],
            f"{r['tokens']:,}",
            money(r["money"], currency) if r["priced"] else "unknown",
        )
        for r in rows
    ]
    total, priced = totals["money"], bool(totals["priced"])
    doubt, unbilled = int(totals["in_doubt_calls"]), int(totals["unbilled_calls"])
    lines = [
        f"model calls from {start:%Y-%m-%d} to {end:%Y-%m-%d} (UTC), each at the price row "
        "fixed when it was admitted:",
        table(["job", "model", "price from", "kind", "tokens", "money"], shown),
        f"total: {money(total, currency, priced=priced)}"
        + ("" if priced else " (+: calls with no price are left out)"),
    ]
    if doubt:
        lines.append(
            f"in doubt: {doubt:,} call(s) with no usage known, not in the total "
            "(idempotent-jobs costs settle)"
        )
    if unbilled:
        lines.append(f"not billed: {unbilled:,} call(s) the provider answered with an error (0)")
    payload = {
        "rows": rows,
        "currency": currency or None,
        "total": total,
        "priced": priced,
        "in_doubt_calls": doubt,
        "unbilled_calls": unbilled,
    }
    emit(args, payload, "\n".join(lines))
    return 0


def _price_from(when: datetime) -> str:
    return "always" if when.year <= 1900 else f"{when:%Y-%m-%d %H:%M}"


def add_parser(commands: Any, shared: Shared) -> None:
    runs = commands.add_parser("runs", help="logical runs in the ledger").add_subparsers(
        dest="runs_command", required=True
    )
    listing = runs.add_parser("list", parents=[shared.json_flag], help="list runs")
    listing.add_argument(
        "--job", help="identity job name (e.g. competitor-summary) or Dagster job name"
    )
    listing.add_argument("--subject")
    listing.add_argument("--status", choices=RUN_STATUSES)
    listing.add_argument(
        "--since", type=when, help="window start >= this (a date, UTC, or a time with its zone)"
    )
    listing.add_argument("--until", type=when, help="window start < this (ISO, with zone)")
    listing.add_argument("--limit", type=positive(int), default=100)
    listing.add_argument(
        "--after", help="continue after this run (id or prefix): the previous page's last run"
    )
    listing.set_defaults(handler=runs_list)
    show = runs.add_parser("show", parents=[shared.json_flag], help="one run: attempts, outbox")
    show.add_argument("run_id", nargs="?", help="run id (or a unique prefix)")
    show.add_argument("--partition", help="the run of this partition of --job (subject|window)")
    show.add_argument("--job", help="the Dagster or identity job name of --partition")
    stats = runs.add_parser(
        "stats",
        parents=[shared.json_flag],
        help="a day's spend per job against its budget; rows and bytes per job and table",
    )
    stats.add_argument(
        "--day", type=when, help="the UTC day holding this time (ISO; default: today)"
    )
    stats.set_defaults(handler=runs_stats)
    spend = runs.add_parser(
        "spend",
        parents=[shared.json_flag],
        help="a month's spend by job, model, price and kind of token",
    )
    spend.add_argument("--month", help="YYYY-MM (default: this month, UTC)")
    spend.add_argument("--job", help="only this identity job")
    spend.set_defaults(handler=runs_spend)
    show.set_defaults(handler=runs_show)
    from idempotent_jobs.operator.commands.quarantine import add_quarantine_parser

    add_quarantine_parser(runs, shared)
