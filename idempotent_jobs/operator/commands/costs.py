"""``prices`` (what each model's tokens cost, with their history), ``budgets`` (the caps every
worker enforces, kept in the ledger) and ``estimate`` (what a backfill would do and cost, from
the job's own history)."""

import argparse
import os
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from idempotent_jobs.operator.commands.common import (
    Shared,
    as_arguments,
    code_location,
    emit,
    open_admin,
)
from idempotent_jobs.operator.render import escape_controls, money, table

if TYPE_CHECKING:
    from idempotent_jobs.core.costs import ModelPrice

_PARTS = (
    ("cache_read", "cache_read_per_million", "cached input read"),
    ("cache_write", "cache_write_per_million", "cache writes (5-minute)"),
    ("cache_write_1h", "cache_write_1h_per_million", "cache writes (1-hour)"),
    ("reasoning", "reasoning_per_million", "reasoning output"),
)


#: The library's fields of a price, as ``prices set`` names them.
PRICE_ARGUMENTS = {
    "from": "--from",
    "tier": "--tier",
    "currency": "--currency",
    "input_per_million": "--input",
    "output_per_million": "--output",
    **{column: f"--{name.replace('_', '-')}" for name, column, _ in _PARTS},
}


def _when(text: str | None) -> datetime | None:
    """``--from``: an ISO date or time (UTC unless it says), or ``None`` (now)."""
    from idempotent_jobs.core.errors import InvalidInputError

    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInputError(
            "--from", f"must be an ISO date or time such as 2026-12-01, got {text!r}"
        ) from None
    from idempotent_jobs.core.costs import check_effective_from

    try:
        return check_effective_from(when if when.tzinfo is not None else when.replace(tzinfo=UTC))
    except InvalidInputError as exc:
        raise InvalidInputError("--from", exc.reason) from None


def prices_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.errors import InvalidInputError

    with open_admin(args) as admin:
        if args.prices_command == "set":
            with as_arguments(PRICE_ARGUMENTS):
                price = admin.set_price(
                    args.model,
                    args.input,
                    args.output,
                    currency=args.currency,
                    **{column: getattr(args, name) for name, column, _ in _PARTS},
                    tier=args.tier,
                    prefix=args.prefix,
                    effective_from=_when(args.effective_from),
                    set_by=os.environ.get("USER"),
                )
            parts = [
                f"{_plain(getattr(price, column))} per million {what}"
                for _, column, what in _PARTS
                if getattr(price, column) is not None
            ]
            human = (
                f"{_pattern(price.model_pattern, price.match_kind)} ({price.tier}) from "
                f"{price.effective_from:%Y-%m-%d %H:%M} UTC: {_plain(price.input_per_million)} "
                f"{price.currency} per million input tokens, {_plain(price.output_per_million)} "
                "per million output" + "".join(f", {p}" for p in parts)
            )
            emit(args, price, escape_controls(human))
            return 0
        if args.prices_command == "delete":
            gone = admin.delete_prices(args.model, prefix=args.prefix, tier=args.tier)
            if not gone:
                raise InvalidInputError("model", f"no price for {args.model!r}")
            emit(args, gone, f"removed {len(gone)} price(s) of {escape_controls(args.model)}")
            return 0
        known = admin.prices()
        matches = admin.price_matches(args.days)
        now = admin.database_now()
    if not args.history:  # what is in force now, and what is set to come
        known = _in_force(known, now)
    used = {
        (m["model_pattern"], m["match_kind"], m["tier"], m["effective_from"]): m for m in matches
    }
    rows = []
    for p in known:
        match = used.get((p.model_pattern, p.match_kind, p.tier, p.effective_from))
        rows.append(
            (
                _pattern(p.model_pattern, p.match_kind),
                p.tier,
                "always" if p.effective_from.year <= 1900 else f"{p.effective_from:%Y-%m-%d %H:%M}",
                _plain(p.input_per_million),
                _plain(p.output_per_million),
                " ".join(
                    f"{name}={_plain(getattr(p, column))}"
                    for name, column, _ in _PARTS
                    if getattr(p, column) is not None
                )
                or "-",
                p.currency,
                f"{match['calls']:,}" if match else "0",
                ", ".join(match["models"]) if match else "-",
            )
        )
    headers = ["model", "tier", "from", "input/M", "output/M", "parts/M", "cur", "calls", "as"]
    shown: list[tuple[str, ...]] = list(rows)
    if args.history:
        headers += ["set at", "set by"]
        shown = [
            (
                *row,
                f"{p.set_at:%Y-%m-%d %H:%M}" + (" (correction)" if p.correction else ""),
                p.set_by or "-",
            )
            for row, p in zip(rows, known, strict=True)
        ]
    human = table(headers, shown) + f"\n(calls: of the last {args.days} days, each priced at the "
    human += "price row in force when it was admitted"
    human += ")" if args.history else "; every row, with its history: --history)"
    unpriced = [m for m in matches if m["model_pattern"] is None]
    if unpriced:
        models = ", ".join(unpriced[0]["models"])
        human += "\n" + escape_controls(  # the line break itself is not the model's text
            f"no price for {unpriced[0]['calls']:,} call(s) of: {models} (cost unknown)"
        )
    emit(args, {"prices": known, "matches": matches}, human)  # table() escapes each cell
    return 0


def _in_force(prices: "list[ModelPrice]", now: datetime) -> "list[ModelPrice]":
    """Of each model (or prefix) and tier, the price in force at ``now`` and those set to
    apply later: what a call admitted now or later is priced at."""
    latest: dict[tuple[str, str, str], datetime] = {}
    for p in prices:
        key = (p.model_pattern, p.match_kind, p.tier)
        if p.effective_from <= now and p.effective_from > latest.get(
            key, datetime.min.replace(tzinfo=UTC)
        ):
            latest[key] = p.effective_from
    return [
        p
        for p in prices
        if p.effective_from > now
        or p.effective_from == latest.get((p.model_pattern, p.match_kind, p.tier))
    ]


def _pattern(model: str, match_kind: str) -> str:
    return f"{model}*" if match_kind == "prefix" else model


def _plain(price: "Decimal | None") -> str:
    """``2.5``, not ``2.500000``; ``-`` for none."""
    return "-" if price is None else f"{price.normalize():f}"


def budgets_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.budgets import Budget, Scope, Unit, budget_id
    from idempotent_jobs.core.errors import InvalidInputError
    from idempotent_jobs.operator.commands.runs import BUDGET_HEADERS, budget_rows

    with open_admin(args) as admin:
        if args.budgets_command == "set":
            unit: Unit = "money" if args.money is not None else "tokens"
            if (args.money is None) == (args.tokens is None):
                raise InvalidInputError("budget", "give --tokens N or --money AMOUNT (one)")
            scope: Scope = "group" if args.group else ("subject" if args.per_subject else "job")
            with as_arguments({"amount": f"--{unit}", "group": "--group", "period": "--per"}):
                budget = Budget(
                    amount=args.money if unit == "money" else args.tokens,
                    unit=unit,
                    period=args.per,
                    scope=scope,
                    group=args.group,
                )
            if scope == "group" and not args.job:
                raise InvalidInputError("--job", "a group budget needs its jobs (--job, repeated)")
            if scope != "group" and len(args.job or ()) != 1:
                raise InvalidInputError("--job", "name the one job (or --group for several)")
            with as_arguments({"job_name": "--job", "jobs": "--job", "group": "--group"}):
                standing = admin.set_budget(
                    budget, job_name=(args.job or [None])[0], jobs=args.job or ()
                )
            emit(args, standing, table(BUDGET_HEADERS, budget_rows([standing])))
            return 0
        if args.budgets_command == "clear":
            key = args.budget_id
            if args.job or args.group:
                scope = "group" if args.group else ("subject" if args.per_subject else "job")
                key = budget_id(scope, args.unit, args.per, args.group or args.job)
            if not key or not admin.clear_budget(key):
                raise InvalidInputError("budget", f"no budget {key!r} (see budgets list)")
            emit(args, {"cleared": key}, f"cleared {escape_controls(key)}")
            return 0
        standings = admin.budgets(args.job)
    human = table(BUDGET_HEADERS, budget_rows(standings)) if standings else "no budgets"
    emit(args, standings, human)
    return 0


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def estimate_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.estimate import estimate

    spec = code_location(args).find_job(args.job).spec
    with open_admin(args) as admin:
        result = estimate(admin, spec, args.first, args.last, args.subject or ())
    h, cur = result.history, result.currency or ""
    lines = [
        f"job {result.job} (identity {result.identity_job}), windows {args.first} to "
        f"{args.last}: {result.partitions:,} partition(s)",
        f"  already done (no model call): {result.done:,}",
        f"  would be computed: {result.to_compute:,}"
        + (f" ({result.held:,} held by a worker now)" if result.held else ""),
        "",
        f"history: {h.accepted_runs} accepted run(s)"
        + (f", the latest {h.sampled_runs} sampled" if h.sampled_runs < h.accepted_runs else ""),
        f"  per accepted run: p10 {_tokens(h.p10_tokens)}, median {_tokens(h.median_tokens)}, "
        f"p90 {_tokens(h.p90_tokens)} tokens ({_money(h.p10_cost, cur, h.priced)} / "
        f"{_money(h.median_cost, cur, h.priced)} / {_money(h.p90_cost, cur, h.priced)})",
        f"  failures so far: {h.failed_calls} call(s) not accepted, {h.failed_tokens:,} tokens "
        f"({money(h.failed_cost, cur)})",
        "",
    ]
    if h.accepted_runs == 0:
        lines.append(
            "expected: no accepted run of this job yet, so no figure (run a few partitions first)"
        )
    else:
        r = result
        lines += [
            f"for the {r.to_compute:,} to compute: {r.expected_calls:,} model call(s);",
            f"  low (p10) {_tokens(r.low_tokens)} tokens ({_money(r.low_cost, cur, h.priced)}), "
            f"expected (median) {_tokens(r.expected_tokens)} "
            f"({_money(r.expected_cost, cur, h.priced)}), high (p90) {_tokens(r.high_tokens)} "
            f"({_money(r.high_cost, cur, h.priced)})",
            f"  plus failures at the rate so far: {r.failure_calls or 0:,.1f} call(s), "
            f"{_tokens(r.failure_tokens)} tokens ({money(r.failure_cost, cur)})",
            "  basis: " + ("; ".join(r.basis) or "-"),
        ]
        if args.batch:
            lines += [
                "",
                "side by side, money for the partitions to compute (failures left out):",
                f"  online:     low {_money(r.low_cost, cur, h.priced)}, expected "
                f"{_money(r.expected_cost, cur, h.priced)}, high "
                f"{_money(r.high_cost, cur, h.priced)}",
                f"  batch lane: low {_money(r.batch_low_cost, cur, h.batch_priced)}, expected "
                f"{_money(r.batch_expected_cost, cur, h.batch_priced)}, high "
                f"{_money(r.batch_high_cost, cur, h.batch_priced)} (at the batch tier's "
                "prices in force now"
                + ("" if h.batch_priced else "; set one with `prices set MODEL --tier batch`")
                + ")",
            ]
    emit(args, result, "\n".join(escape_controls(line) for line in lines))
    return 0


def _money(amount: float | None, currency: str, priced: bool) -> str:
    """Money, or ``unknown`` when a price (or a call's usage) was not known."""
    return money(amount, currency) if priced and amount is not None else "unknown"


def add_parser(commands: Any, shared: Shared) -> None:
    priced = commands.add_parser(
        "prices", help="what each model's tokens cost, with their history (kept in the ledger)"
    ).add_subparsers(dest="prices_command", required=True)
    setting = priced.add_parser(
        "set",
        parents=[shared.json_flag],
        help="set a model's price per million tokens, from a time on",
    )
    setting.add_argument("model", help="the model name asked for (or a prefix, with --prefix)")
    setting.add_argument("--input", required=True, help="price per million input tokens")
    setting.add_argument("--output", required=True, help="price per million output tokens")
    for name, _, what in _PARTS:
        setting.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            help=f"price per million tokens of {what} (default: the "
            + ("output" if name == "reasoning" else "input")
            + " price)",
        )
    setting.add_argument(
        "--from",
        dest="effective_from",
        help="when it applies from: an ISO date or time, UTC (default: now)",
    )
    setting.add_argument("--tier", default="standard", help="service tier (standard, batch)")
    setting.add_argument(
        "--prefix", action="store_true", help="for every model whose name starts with MODEL"
    )
    setting.add_argument("--currency", default="USD", help="3-letter code (default: USD)")
    setting.set_defaults(handler=prices_command)
    listing = priced.add_parser(
        "list", parents=[shared.json_flag], help="every price, and the calls each priced"
    )
    listing.add_argument("--days", type=int, default=30, help="calls of the last N days (30)")
    listing.add_argument(
        "--history",
        action="store_true",
        help="every price row ever set, with when and by whom (default: those in force now "
        "and those set to come)",
    )
    listing.set_defaults(handler=prices_command)
    deleting = priced.add_parser(
        "delete",
        parents=[shared.json_flag],
        help="remove a model's prices that never priced a call (a mistyped price)",
    )
    deleting.add_argument("model")
    deleting.add_argument("--prefix", action="store_true")
    deleting.add_argument("--tier", help="only this tier's (default: every tier's)")
    deleting.set_defaults(handler=prices_command)

    budgets = commands.add_parser(
        "budgets", help="caps in tokens or money every worker enforces (kept in the ledger)"
    ).add_subparsers(dest="budgets_command", required=True)
    setting = budgets.add_parser(
        "set", parents=[shared.json_flag], help="set a budget (stands over a spec's)"
    )
    setting.add_argument("--job", action="append", help="the job (repeat for a group's jobs)")
    setting.add_argument("--group", help="a group budget's name (a team's, over its --job s)")
    setting.add_argument("--per-subject", action="store_true", help="for each subject alone")
    setting.add_argument("--tokens", help="a cap in tokens")
    setting.add_argument("--money", help="a cap in the ledger's currency (prices set)")
    setting.add_argument("--per", choices=["day", "month"], default="day", help="UTC period")
    setting.set_defaults(handler=budgets_command)
    listing = budgets.add_parser(
        "list", parents=[shared.json_flag], help="every budget and its period's spend"
    )
    listing.add_argument("--job", help="only the budgets covering this job")
    listing.set_defaults(handler=budgets_command)
    clearing = budgets.add_parser("clear", parents=[shared.json_flag], help="remove a budget")
    clearing.add_argument("budget_id", nargs="?", help="as budgets list shows it")
    clearing.add_argument("--job", help="the job's budget (with --unit and --per)")
    clearing.add_argument("--group", help="the group's budget (with --unit and --per)")
    clearing.add_argument("--per-subject", action="store_true")
    clearing.add_argument("--unit", choices=["tokens", "money"], default="tokens")
    clearing.add_argument("--per", choices=["day", "month"], default="day")
    clearing.set_defaults(handler=budgets_command)

    guess = commands.add_parser(
        "estimate",
        parents=[shared.json_flag],
        help="before a backfill: partitions done and to compute, expected tokens and cost",
    )
    guess.add_argument("--job", required=True, help="Dagster or identity job name")
    guess.add_argument("--from", dest="first", required=True, help="first window's key")
    guess.add_argument("--to", dest="last", required=True, help="last window's key (included)")
    guess.add_argument("--subject", action="append", help="only this subject (repeat for several)")
    guess.add_argument(
        "--batch",
        action="store_true",
        help="also the money through the batch lane (the batch tier's prices), side by side",
    )
    guess.set_defaults(handler=estimate_command)
