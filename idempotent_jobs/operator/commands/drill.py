"""``drill``: failure drills kept in the ledger, seen by every worker."""

import argparse
import os
import sys
from typing import Any

from idempotent_jobs.operator.commands.common import (
    MAX_SECONDS,
    Shared,
    code_location,
    emit,
    open_admin,
    positive,
)
from idempotent_jobs.operator.render import escape_controls, table


def drill(args: argparse.Namespace) -> int:
    """Arm, end or list the ledger's failure drills; ``--job`` by Dagster or identity name."""
    job = "*"
    said = "every job"
    job_option = getattr(args, "job", None)
    if job_option:
        from idempotent_jobs.core.errors import InvalidInputError
        from idempotent_jobs.core.identity import normalize_text
        from idempotent_jobs.operator.location_targets import CodeLocationError

        job, said = normalize_text(job_option), f"identity job {normalize_text(job_option)}"
        try:
            match = code_location(args).find_job(job_option)
            job, said = match.spec.identity_job_name, match.describe()
        except CodeLocationError as exc:  # no code location here: the name is taken as it is
            if args.drill_command == "fail-model-calls":
                print(
                    f"idempotent-jobs: warning: no code location to check --job against "
                    f"({escape_controls(exc.reason)}); arming the drill for identity job "
                    f"{escape_controls(job)}, which fires only if a job has that identity name",
                    file=sys.stderr,
                )
        except InvalidInputError:  # a code location without that job: a typo, unless meant
            if args.drill_command == "fail-model-calls" and not args.any_job:
                raise
    with open_admin(args) as admin:
        if args.drill_command == "fail-model-calls":
            drill = admin.arm_drill(
                job, args.calls, args.expires_in, armed_by=os.environ.get("USER")
            )
            human = (
                f"the next {drill.remaining} model call(s) of {said} will fail, on every worker, "
                f"until {drill.expires_at:%Y-%m-%d %H:%M:%S %Z} (drill off ends it)"
            )
            emit(args, drill, escape_controls(human))
            return 0
        if args.drill_command == "off":
            ended = admin.disarm_drills(job if job_option else None)
            human = f"drill off for {said}" if ended else f"no drill was armed for {said}"
            emit(args, ended, escape_controls(human))
            return 0
        drills = admin.drills()
    rows = [(d.job_name, d.remaining, d.expires_at, d.armed_by) for d in drills]
    emit(args, drills, table(["job", "calls left", "expires", "armed by"], rows))
    return 0


def add_parser(commands: Any, shared: Shared) -> None:
    drills = commands.add_parser(
        "drill", help="failure drills that need no code change (kept in the ledger)"
    ).add_subparsers(dest="drill_command", required=True)
    drill_job = argparse.ArgumentParser(add_help=False)
    drill_job.add_argument("--job", help="Dagster or identity job name (default: every job)")
    fail = drills.add_parser(
        "fail-model-calls",
        parents=[shared.json_flag, drill_job],
        help="make the next N model calls fail before the call, on every worker",
    )
    fail.add_argument("calls", type=positive(int), help="how many model calls fail")
    fail.add_argument(
        "--any-job",
        action="store_true",
        help="arm it for --job even if the loaded code location has no job of that name",
    )
    fail.add_argument(
        "--expires-in",
        type=positive(float, MAX_SECONDS),
        default=3600.0,
        help="seconds after which the drill ends by itself (default: 3600)",
    )
    fail.set_defaults(handler=drill)
    drills.add_parser("list", parents=[shared.json_flag], help="the drills armed now").set_defaults(
        handler=drill
    )
    drills.add_parser(
        "off", parents=[shared.json_flag, drill_job], help="end the drill"
    ).set_defaults(handler=drill)
