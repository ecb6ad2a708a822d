"""``costs``: the model calls whose outcome is in doubt (``doubts``) and their settlement
(``settle``).

A request that timed out after it was sent, or whose connection was cut mid-answer, may or
may not have been billed: the ledger records it ``in doubt``, its budget hold stays charged
apart from spend, and every report shows it apart. The operator looks the request up at the
provider (its usage page or export) and settles it with the tokens billed, or as not billed.
"""

import argparse
import os
from typing import Any

from idempotent_jobs.operator.commands.common import Shared, emit, open_admin
from idempotent_jobs.operator.render import money, table


def costs_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.errors import InvalidInputError

    if args.costs_command == "settle":  # every argument checked before any statement
        args.call_id = _number("call_id", args.call_id, 1)
        for name in ("input_tokens", "output_tokens"):
            value = getattr(args, name)
            if value is not None:
                setattr(args, name, _number(f"--{name.replace('_', '-')}", value, 0))
    elif not 1 <= args.limit <= 10_000:
        raise InvalidInputError("--limit", f"must be 1 to 10,000, got {args.limit}")
    with open_admin(args) as admin:
        if args.costs_command == "settle":
            if args.not_billed == (args.input_tokens is not None or args.output_tokens is not None):
                raise InvalidInputError(
                    "--not-billed",
                    "give the provider's --input-tokens and --output-tokens, or "
                    "--not-billed, one of them",
                )
            if not args.not_billed and (args.input_tokens is None or args.output_tokens is None):
                raise InvalidInputError(
                    "--input-tokens" if args.input_tokens is None else "--output-tokens",
                    "the provider's figure needs both --input-tokens and --output-tokens",
                )
            row = admin.settle_call(
                args.call_id,
                input_tokens=0 if args.not_billed else args.input_tokens,
                output_tokens=0 if args.not_billed else args.output_tokens,
                settled_by=os.environ.get("USER"),
            )
            currency = admin.currency() or ""
            figure = "unknown (no price)" if row["money"] is None else money(row["money"], currency)
            emit(args, row, f"call {args.call_id} settled: {figure}")
            return 0
        rows = admin.calls_in_doubt(args.job, args.limit)
        currency = admin.currency() or ""
    shown = [
        (
            r["call_id"],
            r["job_name"],
            r["subject_id"],
            f"{r['called_at']:%Y-%m-%d %H:%M:%S}",
            f"{r['provider_name'] or '-'}/{r['requested_model'] or r['model_name'] or '-'}",
            _held(r["held"], currency),
            r["error"] or "-",
        )
        for r in rows
    ]
    headers = ["call", "job", "subject", "called (UTC)", "model", "held in doubt", "error"]
    human = table(headers, shown) if rows else "no call is in doubt"
    emit(args, rows, human)
    return 0


def _held(held: dict[str, Any], currency: str) -> str:
    parts = []
    for budget_id, amount in sorted(held.items()):
        unit = budget_id.split(":", 1)[1].split("/", 1)[0]
        shown = f"{int(amount):,} tokens" if unit == "tokens" else money(amount, currency)
        parts.append(f"{budget_id}: {shown}")
    return "; ".join(parts) or "-"


def _number(name: str, text: str, least: int) -> int:
    """A whole number from ``least`` to 10^12, or a one-line error naming the argument."""
    from idempotent_jobs.core.errors import InvalidInputError

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not least <= value <= 10**12:
        what = "a call id (a number)" if name == "call_id" else "a whole number of tokens"
        raise InvalidInputError(name, f"must be {what} from {least}, got {text!r}")
    return value


def add_parser(commands: Any, shared: Shared) -> None:
    group = commands.add_parser(
        "costs", help="model calls in doubt (no usage known) and their settlement"
    ).add_subparsers(dest="costs_command", required=True)
    listing = group.add_parser(
        "doubts", parents=[shared.json_flag], help="the calls in doubt, oldest first"
    )
    listing.add_argument("--job", help="only this job's (identity job name)")
    listing.add_argument("--limit", type=int, default=100)
    listing.set_defaults(handler=costs_command)
    settle = group.add_parser(
        "settle",
        parents=[shared.json_flag],
        help="settle a call in doubt with the provider's figure, or as not billed",
    )
    settle.add_argument("call_id", help="as `costs doubts` or `runs show` shows it")
    settle.add_argument("--input-tokens", help="input tokens the provider billed")
    settle.add_argument("--output-tokens", help="output tokens the provider billed")
    settle.add_argument(
        "--not-billed", action="store_true", help="the provider billed nothing for it"
    )
    settle.set_defaults(handler=costs_command)
