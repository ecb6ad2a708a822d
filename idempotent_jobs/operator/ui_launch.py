"""Launch partitions of a job the way the Dagster UI's Launchpad does: the code location loaded
as ``dagster dev`` serves it (its name, its origin), each run created from the location's job
with its execution plan and submitted to the instance's run coordinator, which hands it to the
run launcher. A run started so is a run of that code location like any other: the UI shows it
on the job's Runs and Partitions pages and can re-execute it, from failure or all steps.
"""

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import (
    AutoloadDefsModuleTarget,
    ModuleTarget,
    PythonFileTarget,
    WorkspaceLoadTarget,
)

from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.operator.location_targets import Target

#: Run statuses a run ends in.
FINISHED = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)


@dataclass(frozen=True)
class Launched:
    """One partition's run, as submitted (and, with ``wait``, as it ended)."""

    partition: str
    run_id: str
    status: dg.DagsterRunStatus


def load_target(target: Target) -> WorkspaceLoadTarget:
    """The workspace target ``dagster dev`` would load for ``target``, under the same name."""
    directory = str(target.working_directory) if target.working_directory else None
    name = target.dagster_location_name
    if target.autoload_defs and target.module:
        return AutoloadDefsModuleTarget(
            autoload_defs_module_name=target.module, working_directory=directory, location_name=name
        )
    if target.module:
        return ModuleTarget(
            module_name=target.module,
            attribute=target.attribute,
            working_directory=directory,
            location_name=name,
        )
    assert target.python_file is not None
    return PythonFileTarget(
        python_file=str(target.python_file),
        attribute=target.attribute,
        working_directory=directory,
        location_name=name,
    )


@contextmanager
def served(target: Target, instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    """The code location served as the UI serves it (a code server process of its own)."""
    with WorkspaceProcessContext(instance, load_target(target)) as context:
        errors = [
            entry.load_error
            for entry in context.create_request_context().get_code_location_entries().values()
            if entry.load_error is not None
        ]
        if errors:
            raise LedgerError(f"the code location did not load: {errors[0].message.strip()}")
        yield context


def submit(
    context: WorkspaceProcessContext,
    location: str,
    spec: IdempotentJobSpec,
    partition: str,
    tags: Mapping[str, str],
) -> Launched:
    """Create the run of ``partition`` from the served job (its snapshot, execution plan and
    origins, with the partition's tags) and submit it to the instance's run coordinator."""
    instance = context.instance
    request = context.create_request_context()
    code_location = request.get_code_location(location)
    [repository] = code_location.get_repositories().values()
    remote_job = repository.get_full_job(spec.name)
    plan = code_location.get_execution_plan(
        remote_job, {}, step_keys_to_execute=None, known_state=None, instance=instance
    )
    snapshot = plan.execution_plan_snapshot
    run = instance.create_run(
        job_name=spec.name,
        run_id=None,
        run_config={},
        resolved_op_selection=None,
        step_keys_to_execute=snapshot.step_keys_to_execute,
        op_selection=None,
        status=None,
        root_run_id=None,
        parent_run_id=None,
        tags={**spec.partitions_def.get_tags_for_partition_key(partition), **tags},
        job_snapshot=remote_job.job_snapshot,
        execution_plan_snapshot=snapshot,
        parent_job_snapshot=remote_job.parent_job_snapshot,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_selection=None,
        asset_check_selection=None,
        asset_graph=repository.asset_graph,
    )
    submitted = instance.submit_run(run.run_id, request)
    return Launched(partition, submitted.run_id, submitted.status)


def dequeue(context: WorkspaceProcessContext, launched: list[Launched]) -> None:
    """With no Dagster daemon running, take this launch's runs off the instance's run queue as
    the daemon's queue loop would (its limits and tag rules apply), so they start now.

    Only this launch's runs: the queue loop takes every queued run, and two ``launch`` commands
    at once on one instance (no daemon to share) would each start the other's runs too. Both
    would see a run queued and launch it, and the run's second worker, finding it started,
    marks it failed while the first completes it."""
    instance = context.instance
    mine = frozenset(run.run_id for run in launched)
    daemon = _queue_loop_of(mine)
    for _ in range(600):
        queued = [r for r in mine if _status(instance, r) == dg.DagsterRunStatus.QUEUED]
        if not queued:
            return
        list(daemon.run_iteration(context))
        time.sleep(0.1)


class _OwnQueuedRuns:
    """An instance whose run queue holds only the runs ``mine``; every other read (the runs in
    progress, the limits) is the instance's own."""

    def __init__(self, instance: dg.DagsterInstance, mine: frozenset[str]) -> None:
        self._instance, self._mine = instance, mine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._instance, name)

    def get_runs(self, filters: dg.RunsFilter | None = None, *args: Any, **kwargs: Any) -> Any:
        if filters is not None and list(filters.statuses) == [dg.DagsterRunStatus.QUEUED]:
            filters = dg.RunsFilter(run_ids=sorted(self._mine), statuses=filters.statuses)
        return self._instance.get_runs(filters, *args, **kwargs)


def _queue_loop_of(mine: frozenset[str]) -> Any:
    """Dagster's run queue loop, choosing among the runs ``mine`` only: its limits still count
    every run in progress, and another launch's runs queued ahead of them neither start nor
    take the places the limits leave (a launch that died leaves its runs queued)."""
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    class OwnRunsQueueLoop(QueuedRunCoordinatorDaemon):
        def _get_runs_to_dequeue(
            self, instance: dg.DagsterInstance, *args: Any, **kwargs: Any
        ) -> list[dg.DagsterRun]:
            own = _OwnQueuedRuns(instance, mine)
            return super()._get_runs_to_dequeue(own, *args, **kwargs)  # type: ignore[arg-type]

    return OwnRunsQueueLoop(interval_seconds=1)


def daemon_running(instance: dg.DagsterInstance) -> bool:
    """Whether a Dagster daemon's run queue loop has sent a heartbeat lately."""
    from dagster._daemon.controller import get_daemon_statuses
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    kind = QueuedRunCoordinatorDaemon.daemon_type()
    try:
        status = get_daemon_statuses(instance, [kind], ignore_errors=True).get(kind)
    except Exception:  # noqa: BLE001 - no heartbeats stored: no daemon known
        return False
    return bool(status is not None and status.healthy)


def wait_for(
    instance: dg.DagsterInstance,
    launched: list[Launched],
    *,
    poll_seconds: float = 0.5,
    on_queued: float = 30.0,
) -> Iterator[Launched]:
    """Each run as it ends (polled in the instance's run storage). A run still queued after
    ``on_queued`` seconds is said once: the queue needs the daemon (``idempotent-jobs dev``)."""
    waiting = {run.run_id: run for run in launched}
    started = time.monotonic()
    warned = False
    while waiting:
        for run_id in list(waiting):
            found = instance.get_run_by_id(run_id)
            if found is not None and found.status in FINISHED:
                yield Launched(waiting.pop(run_id).partition, run_id, found.status)
        queued = [r for r in waiting if _status(instance, r) == dg.DagsterRunStatus.QUEUED]
        if queued and not warned and time.monotonic() - started > on_queued:
            logging.getLogger("idempotent_jobs").warning(
                "%d run(s) still queued: the run queue needs the Dagster daemon "
                "(idempotent-jobs dev, or dagster-daemon run)",
                len(queued),
            )
            warned = True
        if waiting:
            time.sleep(poll_seconds)


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus | None:
    found = instance.get_run_by_id(run_id)
    return found.status if found is not None else None
