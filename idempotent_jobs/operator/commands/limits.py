"""``limits``: the provider rate limits every worker of every deployment keeps (kept in the
ledger; see :mod:`idempotent_jobs.core.rate_limits`)."""

import argparse
from typing import Any

from idempotent_jobs.operator.commands.common import Shared, as_arguments, emit, open_admin
from idempotent_jobs.operator.render import escape_controls, table

#: A rate limit's fields, as ``limits set`` names them.
LIMIT_ARGUMENTS = {
    "requests_per_minute": "--requests-per-minute",
    "tokens_per_minute": "--tokens-per-minute",
    "key_name": "--key-name",
    "window_seconds": "--window-seconds",
}


def limits_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.errors import InvalidInputError
    from idempotent_jobs.core.rate_limits import RateLimit

    with open_admin(args) as admin:
        if args.limits_command == "set":
            with as_arguments(LIMIT_ARGUMENTS):
                limit = RateLimit(
                    args.provider,
                    args.model,
                    args.requests_per_minute,
                    args.tokens_per_minute,
                    args.key_name,
                    args.window_seconds,
                )
                row = admin.set_rate_limit(limit)
            emit(args, row, escape_controls(_described(row)))
            return 0
        if args.limits_command == "delete":
            if not admin.delete_rate_limit(args.provider, args.model, args.key_name):
                raise InvalidInputError(
                    "limit", f"no rate limit for {args.provider} {args.model} {args.key_name!r}"
                )
            emit(args, {"deleted": True}, "deleted")
            return 0
        rows = admin.rate_limits()
    shown = [
        (
            r["provider"],
            r["model"],
            r["key_name"] or "-",
            _count(r["requests_per_window"]),
            _count(r["tokens_per_window"]),
            f"{r['window_seconds']}s",
            r["declared_by"],
        )
        for r in rows
    ]
    headers = ["provider", "model", "key", "requests", "tokens", "per", "declared by"]
    emit(args, rows, table(headers, shown))
    return 0


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _described(row: dict[str, Any]) -> str:
    parts = []
    if row["requests_per_window"] is not None:
        parts.append(f"{row['requests_per_window']:,} requests")
    if row["tokens_per_window"] is not None:
        parts.append(f"{row['tokens_per_window']:,} tokens")
    key = f" (key {row['key_name']})" if row["key_name"] else ""
    return (
        f"{row['provider']} {row['model']}{key}: at most {' and '.join(parts)} per "
        f"{row['window_seconds']}s, for every worker of every deployment on this ledger"
    )


def add_parser(commands: Any, shared: Shared) -> None:
    limits = commands.add_parser(
        "limits", help="provider rate limits every worker keeps (kept in the ledger)"
    ).add_subparsers(dest="limits_command", required=True)
    setting = limits.add_parser(
        "set", parents=[shared.json_flag], help="set a provider's limit for one model"
    )
    deleting = limits.add_parser("delete", parents=[shared.json_flag], help="remove a limit")
    for parser in (setting, deleting):
        parser.add_argument("provider", help="openai, anthropic (the model step's provider)")
        parser.add_argument("model", help="the model asked for (as the model step names it)")
        parser.add_argument("--key-name", default="", help="the API key's name (a label)")
    setting.add_argument("--requests-per-minute", type=int, help="requests per window")
    setting.add_argument("--tokens-per-minute", type=int, help="tokens per window")
    setting.add_argument(
        "--window-seconds", type=int, default=60, help="the window the limits count over (60)"
    )
    setting.set_defaults(handler=limits_command)
    deleting.set_defaults(handler=limits_command)
    limits.add_parser("list", parents=[shared.json_flag], help="every limit").set_defaults(
        handler=limits_command
    )
