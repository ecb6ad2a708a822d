"""``launch``: start partitions of a job the way the Dagster UI's Launchpad does.

The code location is served as ``dagster dev`` serves it (same name, same origin); each
partition's run is created from the served job and submitted to the instance's run coordinator
and launcher (``$DAGSTER_HOME`` as it is, else the project's own instance). A run started so can
be re-executed from the UI, from failure or all steps, like a run launched there. With no Dagster
daemon running, the command takes its own runs off the run queue so they start at once. It
prints one line per partition and returns; ``--wait`` waits for each run and prints how it
ended. Works with the embedded database or ``IDEMPOTENT_JOBS_DATABASE_URL``.
"""

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.operator.commands.common import (
    Shared,
    code_location,
    emit,
    ensure_database_url,
)
from idempotent_jobs.operator.render import escape_controls, table

if TYPE_CHECKING:  # the CLI parses its arguments without importing Dagster
    from idempotent_jobs.dagster.job_spec import IdempotentJobSpec


def partitions_of(spec: "IdempotentJobSpec", args: argparse.Namespace) -> list[str]:
    """The partition keys asked for: given one by one, or a range of windows (``--from``,
    ``--to``, both included) for ``--subject`` (repeatable; none: every subject)."""
    from idempotent_jobs.dagster.partitions import partition_key

    keys = list(args.partitions or [])
    if args.window_from or args.window_to:
        windows = spec.window.get_partition_keys()
        first, last = args.window_from or args.window_to, args.window_to or args.window_from
        for name, key in (("--from", first), ("--to", last)):
            if key not in windows:
                raise InvalidInputError(name, f"{key!r} is not a window of {spec.name}")
        if windows.index(last) < windows.index(first):
            raise InvalidInputError("--to", f"{last!r} comes before --from {first!r}")
        unknown = sorted(set(args.subjects or ()) - set(spec.subjects))
        if unknown:
            raise InvalidInputError("--subject", f"{unknown[0]!r} is not a subject of {spec.name}")
        subjects = args.subjects or spec.subjects
        keys += [
            partition_key(subject, window)
            for window in windows[windows.index(first) : windows.index(last) + 1]
            for subject in subjects
        ]
    elif args.subjects:
        raise InvalidInputError("--subject", "names the subjects of a range: give --from too")
    if not keys:
        raise InvalidInputError("partitions", "give partition keys, or a range with --from/--to")
    for key in keys:
        if not spec.partitions_def.has_partition_key(key):
            raise InvalidInputError(
                "partitions",
                f"job {spec.name} has no partition {key!r}: a key is <subject>|<window>, with "
                f"a subject of {', '.join(map(repr, spec.subjects))} and a window the job has",
            )
    return list(dict.fromkeys(keys))


def launch(args: argparse.Namespace) -> int:
    import dagster as dg

    from idempotent_jobs.operator import ui_launch
    from idempotent_jobs.operator.dagster_home import prepare_dagster_home
    from idempotent_jobs.operator.rerun import ui_tags

    workspace = code_location(args)
    spec = workspace.find_job(args.job).spec
    keys = partitions_of(spec, args)
    target = workspace.location_of(spec).target
    ensure_database_url()  # the ledger's, and Dagster's storage URL for dagster.yaml
    prepare_dagster_home()
    if not args.verbose:  # one line per partition; Dagster's own logs with -v
        logging.getLogger("dagster").setLevel(logging.WARNING)
    with (
        _stdout_to_stderr(),  # the code server's own lines: stdout stays the command's output
        dg.DagsterInstance.get() as instance,
        ui_launch.served(target, instance) as context,
    ):
        location = target.dagster_location_name
        tags = ui_tags(workspace, spec)  # the UI's Runs and Partitions pages select by these
        launched = [ui_launch.submit(context, location, spec, key, tags) for key in keys]
        if not ui_launch.daemon_running(instance):
            ui_launch.dequeue(context, launched)
        if args.wait:
            ended = {run.run_id: run for run in ui_launch.wait_for(instance, launched)}
            launched = [ended[run.run_id] for run in launched]
        rows = [_row(instance, run, waited=args.wait) for run in launched]
    human = table(
        ["partition", "Dagster run", "status"],
        [(escape_controls(r["partition"]), r["dagster_run_id"], r["result"]) for r in rows],
    )
    emit(args, rows, human)
    if args.wait:
        return 0 if all(r["success"] for r in rows) else 1
    return 0 if all(r["status"] != "FAILURE" for r in rows) else 1


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what this process and the processes it starts meanwhile (the code server) write to
    standard output to standard error instead, at the file descriptor, so ``--json`` and the
    table are all that reach standard output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _row(instance: Any, run: Any, *, waited: bool) -> dict[str, Any]:
    import dagster as dg

    found = instance.get_run_by_id(run.run_id)
    status = found.status if found is not None else run.status
    result = status.value.lower()
    if waited and status == dg.DagsterRunStatus.FAILURE:
        failed = [
            record.event_log_entry.step_key
            for record in instance.get_records_for_run(
                run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE
            ).records
        ]
        result = f"failed in {', '.join(str(f) for f in failed) or 'the run'}"
    elif waited and status == dg.DagsterRunStatus.SUCCESS:
        result = "succeeded"
        for record in instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT
        ).records:
            event = record.event_log_entry.dagster_event
            if event is not None and event.step_key == "persist":
                found_result = event.step_output_data.metadata.get("result")
                result = str(getattr(found_result, "value", found_result) or result)
    return {
        "partition": run.partition,
        "dagster_run_id": run.run_id,
        "status": status.value,
        "success": status == dg.DagsterRunStatus.SUCCESS,
        "result": result,
    }


def add_parser(commands: Any, shared: Shared) -> None:
    parser = commands.add_parser(
        "launch",
        parents=[shared.json_flag],
        help="start partitions as the Dagster UI does (re-executable there); --wait to wait",
    )
    parser.add_argument("--job", required=True, help="Dagster job name or identity job name")
    parser.add_argument(
        "partitions", nargs="*", help="partition keys, e.g. 'emea|2026-11-02' (subject|window)"
    )
    parser.add_argument("--from", dest="window_from", help="the first window of a range")
    parser.add_argument("--to", dest="window_to", help="the last window of a range (included)")
    parser.add_argument(
        "--subject",
        dest="subjects",
        action="append",
        help="a subject of the range (repeatable; none: every subject)",
    )
    parser.add_argument("--wait", action="store_true", help="wait for each run to end")
    parser.add_argument("-v", "--verbose", action="store_true", help="Dagster's logs too")
    parser.set_defaults(handler=launch)
