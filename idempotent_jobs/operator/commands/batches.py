"""``batches``: the batch lane's batches, with their runs, provider id, state and money
(``list``, ``show``), and ``cancel`` (kept in the ledger; the lane cancels the provider batch at
its next step)."""

import argparse
from datetime import UTC
from typing import Any

from idempotent_jobs.operator.commands.common import Shared, emit, open_admin
from idempotent_jobs.operator.render import escape_controls, table


def batches_command(args: argparse.Namespace) -> int:
    from idempotent_jobs.core.errors import InvalidInputError

    with open_admin(args) as admin:
        if args.batches_command in ("cancel", "show"):
            args.batch_id = admin.batch_id_of(args.batch_id)  # a prefix, as the list shows
        if args.batches_command == "cancel":
            row = admin.cancel_batch(args.batch_id, requested_by=args.requested_by)
            emit(
                args,
                row,
                f"batch {row['batch_id']}: cancel requested ({row['state']}); its lane cancels "
                "it at the provider at its next step, accepts what was answered and releases "
                "the rest",
            )
            return 0
        if args.batches_command == "show":
            rows = admin.batches(batch_id=args.batch_id, limit=1)
            if not rows:
                raise InvalidInputError("batch_id", f"no batch {args.batch_id!r}")
            runs = admin.batch_runs(args.batch_id)
            text = _shown(rows[0], runs).split("\n")
            emit(args, {**rows[0], "runs": runs}, "\n".join(escape_controls(t) for t in text))
            return 0
        rows = admin.batches(job_name=args.job, state=args.state, limit=args.limit)
    shown = [
        (
            r["batch_id"],
            r["job_name"],
            f"{r['provider']} {r['model']}",
            r["state"] + (" (cancel requested)" if r["cancel_requested_at"] and _open(r) else ""),
            r["provider_batch_id"] or "-",
            str(r["items"]),
            _items(r["item_states"]),
            _money(r),
            r["created_at"].strftime("%Y-%m-%d %H:%M"),
        )
        for r in rows
    ]
    headers = ["batch", "job", "model", "state", "provider id", "runs", "items", "money", "made"]
    emit(args, rows, table(headers, shown))
    return 0


def _open(row: dict[str, Any]) -> bool:
    return str(row["state"]) in ("intent", "submitted")


def _items(states: dict[str, int]) -> str:
    order = ("accepted", "pending", "failed", "not_accepted", "released")
    return ", ".join(f"{states[s]} {s.replace('_', ' ')}" for s in order if states.get(s)) or "-"


def _money(row: dict[str, Any]) -> str:
    """The batch's money at the prices in force; ``unknown`` when no call is priced."""
    if not row["calls"]:
        return "-"
    if row["money"] is None:
        return "unknown"
    floor = " (+unpriced)" if row["unpriced"] else ""
    return f"{row['money']:.6f} {row['currency'] or ''}".strip() + floor


def _at(when: Any) -> str:
    """A time to the second, in UTC; ``-`` for none."""
    if when is None:
        return "-"
    return str(when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _shown(row: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    lines = [
        f"batch {row['batch_id']} of {row['job_name']}: {row['state']}",
        f"provider {row['provider']} {row['model']}, id {row['provider_batch_id'] or '-'}"
        + (f" ({row['duplicates']} duplicate(s) cancelled)" if row["duplicates"] else ""),
        f"runs {row['items']}: {_items(row['item_states'])}; money {_money(row)}",
        f"made {_at(row['created_at'])}, submitted {_at(row['submitted_at'])}, "
        f"ended {_at(row['ended_at'])}, collected {_at(row['collected_at'])}",
    ]
    if row["lease_owner"]:
        lines.append(f"advanced by {row['lease_owner']} until {_at(row['lease_expires_at'])}")
    if row["cancel_requested_at"]:
        lines.append(
            f"cancel requested {_at(row['cancel_requested_at'])} by "
            f"{row['cancel_requested_by'] or '-'}"
        )
    if row["error"]:
        lines.append(f"error: {row['error']}")
    shown = [
        (
            r["subject_id"],
            r["scheduled_at"].strftime("%Y-%m-%d %H:%M"),
            r["run_id"][:12],
            r["state"].replace("_", " "),
            r["run_status"],
            "-" if r["input_tokens"] is None else f"{r['input_tokens']}/{r['output_tokens']}",
            (r["error"] or "")[:80],
        )
        for r in runs
    ]
    headers = ["subject", "window", "run", "item", "run status", "tokens in/out", "error"]
    return "\n".join(lines) + "\n\n" + table(headers, shown)


def add_parser(commands: Any, shared: Shared) -> None:
    batches = commands.add_parser(
        "batches", help="the batch lane's batches: runs, provider id, state, money"
    ).add_subparsers(dest="batches_command", required=True)
    listing = batches.add_parser("list", parents=[shared.json_flag], help="batches, newest first")
    listing.add_argument("--job", help="only this job's batches")
    listing.add_argument(
        "--state",
        choices=["intent", "submitted", "completed", "expired", "failed", "cancelled", "collected"],
        help="only batches in this state",
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    listing.set_defaults(handler=batches_command)
    showing = batches.add_parser("show", parents=[shared.json_flag], help="one batch with its runs")
    showing.add_argument("batch_id")
    showing.set_defaults(handler=batches_command)
    cancelling = batches.add_parser(
        "cancel", parents=[shared.json_flag], help="cancel a batch (at its lane's next step)"
    )
    cancelling.add_argument("batch_id")
    cancelling.add_argument("--requested-by", help="who asks (kept with the request)")
    cancelling.set_defaults(handler=batches_command)
