"""``prices`` (what each model's tokens cost) and ``estimate`` (what a backfill would do and
cost, from the job's own history)."""

import argparse
import os
from typing import TYPE_CHECKING, Any

from idempotent_jobs.operator.commands.common import Shared, code_location, emit, open_admin
from idempotent_jobs.operator.render import escape_controls, money, table

if TYPE_CHECKING:
    from decimal import Decimal


def prices_command(args: argparse.Namespace) -> int:
    with open_admin(args) as admin:
        if args.prices_command == "set":
            price = admin.set_price(
                args.model,
                args.input,
                args.output,
                currency=args.currency,
                set_by=os.environ.get("USER"),
            )
            human = (
                f"{price.model_name}: {_plain(price.input_per_million)} {price.currency} per "
                f"million input tokens, {_plain(price.output_per_million)} per million output"
            )
            emit(args, price, escape_controls(human))
            return 0
        known = list(admin.prices().values())
    rows = [
        (
            p.model_name,
            _plain(p.input_per_million),
            _plain(p.output_per_million),
            p.currency,
            p.set_at,
            p.set_by,
        )
        for p in known
    ]
    headers = ["model", "input/M", "output/M", "currency", "set", "by"]
    emit(args, known, table(headers, rows))
    return 0


def _plain(price: "Decimal") -> str:
    """``2.5``, not ``2.500000`` (the column's scale)."""
    return f"{price.normalize():f}"


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def estimate_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.operator.estimate import estimate, partition_keys

    spec = code_location(args).find_job(args.job).spec
    keys = partition_keys(spec, args.first, args.last, args.subject or ())
    with open_admin(args) as admin:
        result = estimate(admin, spec, keys)
    h, cur = result.history, result.currency or ""
    lines = [
        f"job {result.job} (identity {result.identity_job}), windows {args.first} to "
        f"{args.last}: {result.partitions} partition(s)",
        f"  already done (no model call): {result.done}",
        f"  would be computed: {result.to_compute}"
        + (f" ({result.held} held by a worker now)" if result.held else ""),
        "",
        f"history: {h.accepted_runs} accepted run(s)"
        + (f", the latest {h.sampled_runs} sampled" if h.sampled_runs < h.accepted_runs else ""),
        f"  per accepted run: median {_tokens(h.median_tokens)} tokens "
        f"({money(h.median_cost, cur)}), p90 {_tokens(h.p90_tokens)} tokens "
        f"({money(h.p90_cost, cur)})",
        f"  failures so far: {h.failed_calls} call(s) not accepted, {h.failed_tokens:,} tokens "
        f"({money(h.failed_cost, cur)})",
        "",
    ]
    if h.accepted_runs == 0:
        lines.append(
            "expected: no accepted run of this job yet, so no figure (run a few partitions first)"
        )
    else:
        lines += [
            f"expected for the {result.to_compute} to compute: {result.expected_calls} model "
            f"call(s), {_tokens(result.expected_tokens)} tokens "
            f"({money(result.expected_cost, cur)}) at the median, "
            f"{_tokens(result.high_tokens)} ({money(result.high_cost, cur)}) at p90",
            f"  plus failures at the rate so far: {result.failure_calls or 0:,.1f} call(s), "
            f"{_tokens(result.failure_tokens)} tokens ({money(result.failure_cost, cur)})",
        ]
        if not h.priced:
            lines.append("  (a model without a price is left out of the money figures)")
    emit(args, result, "\n".join(escape_controls(line) for line in lines))
    return 0


def add_parser(commands: Any, shared: Shared) -> None:
    priced = commands.add_parser(
        "prices", help="what each model's tokens cost (kept in the ledger)"
    ).add_subparsers(dest="prices_command", required=True)
    setting = priced.add_parser(
        "set", parents=[shared.json_flag], help="set a model's price per million tokens"
    )
    setting.add_argument("model", help="the model name the model step reports")
    setting.add_argument("--input", required=True, help="price per million input tokens")
    setting.add_argument("--output", required=True, help="price per million output tokens")
    setting.add_argument("--currency", default="USD", help="3-letter code (default: USD)")
    setting.set_defaults(handler=prices_command)
    priced.add_parser("list", parents=[shared.json_flag], help="every price").set_defaults(
        handler=prices_command
    )
    guess = commands.add_parser(
        "estimate",
        parents=[shared.json_flag],
        help="before a backfill: partitions done and to compute, expected tokens and cost",
    )
    guess.add_argument("--job", required=True, help="Dagster or identity job name")
    guess.add_argument("--from", dest="first", required=True, help="first window's key")
    guess.add_argument("--to", dest="last", required=True, help="last window's key (included)")
    guess.add_argument("--subject", action="append", help="only this subject (repeat for several)")
    guess.set_defaults(handler=estimate_command)
