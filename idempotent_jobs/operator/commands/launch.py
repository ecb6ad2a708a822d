"""``launch``: run partitions of a job now, in this process, on the project's Dagster instance.

The runs are recorded in the Dagster instance ``dagster dev`` uses (``$DAGSTER_HOME`` as it is,
else the project's own), with the tags its UI selects a job's runs and partition statuses by, so
they show on the job's Runs and Partitions pages like a launch from the Launchpad. Works with
the embedded database or ``IDEMPOTENT_JOBS_DATABASE_URL``, with nothing exported beforehand.
"""

import argparse
from typing import Any

from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    ensure_database_url,
)
from idempotent_jobs.operator.render import escape_controls, table


def launch(args: argparse.Namespace) -> int:
    import dagster as dg

    from idempotent_jobs.operator.dagster_home import prepare_dagster_home
    from idempotent_jobs.operator.rerun import launch_partitions

    workspace = code_location(args)
    spec = workspace.find_job(args.job).spec
    ensure_database_url()  # the ledger's, and Dagster's storage URL for dagster.yaml
    prepare_dagster_home()
    with dg.DagsterInstance.get() as instance:
        results = launch_partitions(workspace, spec, list(args.partitions), instance)
    rows = [
        {
            "partition": key,
            "dagster_run_id": result.run_id,
            "success": result.success,
            "result": _result_of(result),
        }
        for key, result in results
    ]
    human = table(
        ["partition", "Dagster run", "result"],
        [(escape_controls(str(r["partition"])), r["dagster_run_id"], r["result"]) for r in rows],
    )
    emit(args, rows, human)
    return 0 if all(r["success"] for r in rows) else 1


def _result_of(result: Any) -> str:
    """What the run did, from its steps' ``result`` metadata (``new``, ``reused``, ...), or
    the failed step."""
    import dagster as dg

    if not result.success:
        failed = [
            e.step_key
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.STEP_FAILURE
        ]
        return f"failed in {', '.join(str(f) for f in failed) or 'the run'}"
    for event in result.all_events:
        if event.step_key == "persist" and event.event_type == dg.DagsterEventType.STEP_OUTPUT:
            value = event.step_output_data.metadata.get("result")
            return str(getattr(value, "value", value) or "succeeded")
    return "succeeded"


def add_parser(commands: Any, shared: Shared) -> None:
    parser = commands.add_parser(
        "launch",
        parents=[shared.json_flag],
        help="run partitions now, in this process, recorded on the project's Dagster instance",
    )
    parser.add_argument("--job", required=True, help="Dagster job name or identity job name")
    parser.add_argument(
        "partitions", nargs="+", help="partition keys, e.g. 'emea|2026-11-02' (subject|window)"
    )
    parser.set_defaults(handler=launch)
