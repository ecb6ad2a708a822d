"""``runs show``: one run, as the ledger holds it (its record, attempts, model calls and their
money, outbox and revisions); no code is loaded unless asked for a partition."""

import argparse
import sys
from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import (
    code_location,
    emit,
    open_admin,
)
from idempotent_jobs.operator.render import money, table

if TYPE_CHECKING:
    pass


def _sum(amounts: Iterable[Decimal | None]) -> Decimal | None:
    """The sum of the amounts that have one (``None`` when none has)."""
    known = [a for a in amounts if a is not None]
    return sum(known, Decimal(0)) if known else None


def _money_line(figures: dict[str, Any], currency: str) -> str:
    doubt = figures["in_doubt_calls"]
    apart = f"; {doubt} call(s) in doubt (idempotent-jobs costs settle)" if doubt else ""
    if all(m is None for m in figures["calls"]):
        if doubt == len(figures["calls"]):
            return f"unknown{apart}"
        return (
            "unknown: no price in force for these calls' models (idempotent-jobs prices set)"
            + apart
        )
    priced = None not in figures["calls"]
    return (
        f"{money(figures['accepted'], currency, priced=priced)} accepted, "
        f"{money(figures['not_accepted'], currency, priced=priced)} not accepted"
        + ("" if priced else " (+: a call with no price or no usage is left out)")
        + apart
    )


def _model_of(requested: str | None, answered: str | None, provider: str | None) -> str:
    """The model a call asked for (and the one that answered, when another), and where."""
    name = requested or answered or "-"
    if answered and requested and answered != requested:
        name = f"{requested} ({answered})"
    return f"{provider}/{name}" if provider else name


def _call_money(billing: str | None, cost: Decimal | None, currency: str) -> str:
    """A call's money as recorded: in doubt until settled, 0 for what was never billed."""
    if billing == "in_doubt":
        return "in doubt"
    if cost is None:
        return "unknown"
    shown = money(cost, currency)
    return f"{shown} (not billed)" if billing == "unbilled" else shown


def _run_id_asked(args: argparse.Namespace) -> str:
    """The run ``runs show`` is asked for: an id (or a unique prefix), or a partition of a job
    (``--partition KEY --job J``, the job found in the code location)."""

    if args.partition is None:
        if args.run_id is None:
            raise InvalidInputError("run_id", "give a run id, or --partition KEY --job J")
        return str(args.run_id)
    if args.run_id is not None:
        raise InvalidInputError("--partition", "give a run id or a partition, not both")
    if not args.job:
        raise InvalidInputError("--job", "--partition needs the job (--job J)")
    spec = code_location(args).find_job(args.job).spec
    return spec.identity_for(args.partition).run_id


def runs_show(args: argparse.Namespace) -> int:
    asked = _run_id_asked(args)
    with open_admin(args) as admin:
        run_id = admin.resolve_run_id(asked)
        record = admin.get(run_id)
        if record is None:
            print(f"idempotent-jobs: no run {run_id}", file=sys.stderr)
            return 1
        attempts = admin.attempts(run_id)
        calls = admin.model_calls(run_id)
        outbox = admin.outbox(run_id)
        revisions = admin.revisions(run_id)
        currency = admin.currency() or ""
    from idempotent_jobs.core.records import CallCosts

    costs = CallCosts.of(calls)
    call_money = [c.money for c in calls]  # as each call was recorded: every report's figure
    paid = list(zip(call_money, calls, strict=True))
    figures: dict[str, Any] = {
        "currency": currency or None,
        "calls": call_money,
        "accepted": _sum(m for m, c in paid if c.outcome == "accepted"),
        "not_accepted": _sum(m for m, c in paid if c.outcome != "accepted"),
        "in_doubt_calls": sum(c.billing == "in_doubt" for c in calls),
    }
    data = {
        "run": record,
        "attempts": attempts,
        "model_calls": calls,
        "costs": costs,
        "money": figures,
        "outbox": outbox,
        "revisions": revisions,
    }
    identity = [
        ("run id", record.run_id),
        ("job", record.job_name),
        ("subject", record.subject_id),
        ("window start", record.scheduled_at),
        ("version", record.version),
        ("status", record.status),
        ("epoch", record.lease_epoch),
        ("attempts", record.attempts),
        ("revision", record.revision),
        ("lease owner", record.lease_owner),
        ("lease expires", record.lease_expires_at),
        ("completed at", record.completed_at),
        ("input fingerprint", record.input_fingerprint),
        ("config fingerprint", record.config_fingerprint),
        ("config", record.config_parts),
        ("last error", record.last_error),
        ("output", record.output),
        ("raw input pruned", record.raw_input_pruned_at),
        ("output pruned", record.output_pruned_at),
        ("ended attempts pruned", record.attempts_pruned_at),
    ]
    attempt_rows = [
        (
            a.lease_epoch,
            a.worker_id,
            a.caller_run_id,
            a.caller_step,
            a.outcome,
            a.error,
            a.model_name,
            a.input_tokens,
            a.output_tokens,
            f"{(a.ended_at - a.started_at).total_seconds():.3f}s" if a.ended_at else "-",
        )
        for a in attempts
    ]
    call_rows = [
        (
            c.call_id,
            c.called_at,
            c.revision,
            c.lease_epoch,
            c.caller_step,
            c.caller_run_id,
            c.retry_number,
            _model_of(c.requested_model, c.model_name, c.provider_name),
            c.input_tokens,
            c.output_tokens,
            c.cache_read_tokens,
            c.cache_write_tokens
            if not c.cache_write_1h_tokens
            else f"{c.cache_write_tokens} ({c.cache_write_1h_tokens} 1h)",
            c.reasoning_tokens,
            _call_money(c.billing, cost, currency),
            c.outcome,
            c.error,
        )
        for c, cost in zip(calls, call_money, strict=True)
    ]
    outbox_rows = [
        (
            o.idempotency_key,
            o.created_at,
            o.delivered_at,
            o.delivery_attempts,
            o.last_error,
            o.payload_pruned_at,
        )
        for o in outbox
    ]
    revision_rows = [
        (v.revision, v.requested_at, v.reason, ",".join(v.channels) or "-", v.previous_output)
        for v in revisions
    ]
    human = "\n".join(
        [
            table(["field", "value"], identity),
            "",
            "attempts:",
            table(
                [
                    "epoch",
                    "worker",
                    "dagster run",
                    "step",
                    "outcome",
                    "error",
                    "model",
                    "in tokens",
                    "out tokens",
                    "duration",
                ],
                attempt_rows,
            ),
            "",
            "model calls:",
            table(
                [
                    "call",
                    "called",
                    "revision",
                    "epoch",
                    "step",
                    "dagster run",
                    "retry",
                    "model",
                    "in tokens",
                    "out tokens",
                    "cache read",
                    "cache write",
                    "reasoning",
                    "cost",
                    "outcome",
                    "error",
                ],
                call_rows,
            ),
            f"cost: {costs.summary()}",
            f"money: {_money_line(figures, currency)}",
            "",
            "outbox:",
            table(
                ["key", "queued", "delivered", "tries", "last error", "payload pruned"],
                outbox_rows,
            ),
            "",
            "revisions:",
            table(
                ["revision", "requested", "reason", "channels", "previous output"], revision_rows
            ),
        ]
    )
    emit(args, data, human)
    return 0
