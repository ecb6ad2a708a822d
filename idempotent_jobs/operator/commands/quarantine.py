"""``runs quarantine``: the answers that failed validation, online or in a shadow, with their
input, the failure and what they cost; re-run them at a version with ``shadow start
--quarantined``."""

import argparse
import json
from typing import Any

from idempotent_jobs.operator.commands.common import Shared, emit, open_admin, positive


def runs_quarantine(args: argparse.Namespace) -> int:
    """``runs quarantine``: answers that failed validation, online or in a shadow."""
    from idempotent_jobs.operator.commands.runs import identity_job
    from idempotent_jobs.operator.render import table

    with open_admin(args) as admin:
        job = identity_job(args, admin)[0]
        rows = admin.quarantine(job_name=job, shadow_id=args.shadow, limit=args.limit)
    shown_rows = [
        (
            r["run_id"][:12],
            r["job_name"],
            f"{r['subject_id']} {r['scheduled_at']:%Y-%m-%d %H:%M}",
            r["source"] if r["shadow_id"] is None else f"shadow {r['shadow_id']}",
            r["version"],
            "-" if r["money"] is None else str(r["money"].normalize()),
            (r["error"] or "-")[:80],
            json.dumps(r["raw_input"], ensure_ascii=False, sort_keys=True)[:60],
        )
        for r in rows
    ]
    headers = ["run", "job", "partition", "where", "version", "money", "failure", "input"]
    human = table(headers, shown_rows)
    if rows:
        human += (
            "\nre-run them at a version: idempotent-jobs shadow start --job <job> "
            "--version <v> --quarantined"
        )
    emit(args, rows, human)
    return 0


def add_quarantine_parser(runs: Any, shared: Shared) -> None:
    quarantine = runs.add_parser(
        "quarantine",
        parents=[shared.json_flag],
        help="answers that failed validation, online or in a shadow, with input and cost",
    )
    quarantine.add_argument("--job", help="only this job's (Dagster or identity job name)")
    quarantine.add_argument("--shadow", help="only this shadow's")
    quarantine.add_argument("--limit", type=positive(int), default=100)
    quarantine.set_defaults(handler=runs_quarantine)
