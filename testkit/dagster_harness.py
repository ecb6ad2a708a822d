"""Helpers for tests that need a real Dagster instance (PostgreSQL storage, the project's
dagster.yaml) and the test code location in ``dagster_defs``."""

import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCATION = "idempotent_jobs_tests"
SYNC_LAUNCHER = {
    "module": "dagster._core.launcher.sync_in_memory_run_launcher",
    "class": "SyncInMemoryRunLauncher",
}


@dataclass
class DagsterTestEnv:
    database: str
    tmp_path: Path

    @property
    def calls_dir(self) -> Path:
        path = self.tmp_path / "calls"
        path.mkdir(exist_ok=True)
        return path

    @property
    def notifications(self) -> Path:
        return self.tmp_path / "notifications.jsonl"

    def model_calls(self) -> int:
        return _lines(self.calls_dir / "model_calls.log")

    def collect_calls(self) -> int:
        return _lines(self.calls_dir / "collect_calls.log")

    def delivered(self) -> list[dict[str, Any]]:
        if not self.notifications.exists():
            return []
        return [json.loads(line) for line in self.notifications.read_text().splitlines()]

    def script(self, name: str) -> None:
        (self.calls_dir / name).touch()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@contextmanager
def dagster_instance(
    env: DagsterTestEnv, *, sync_launcher: bool = True, **settings: Any
) -> Iterator[dg.DagsterInstance]:
    """An instance configured by the project's dagster.yaml (storage on PostgreSQL, run retries),
    with runs launched in this process when ``sync_launcher``, and any other top-level
    ``settings`` of dagster.yaml (such as ``run_queue``) as given."""
    home = env.tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    config = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
    if sync_launcher:
        config["run_launcher"] = SYNC_LAUNCHER
    config.update(settings)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance


@contextmanager
def workspace(
    instance: dg.DagsterInstance, module: str = "idempotent_jobs_tests.dagster_defs"
) -> Iterator[WorkspaceProcessContext]:
    """The code location ``module`` (its ``defs``), named ``LOCATION`` for the helpers below."""
    target = ModuleTarget(
        module_name=module,
        attribute="defs",
        working_directory=str(PROJECT_ROOT),
        location_name=LOCATION,
    )
    with _process_logging_kept(), create_test_daemon_workspace_context(target, instance) as context:
        yield context


#: The loggers Dagster's ``configure_loggers`` sets up (for its daemon, webserver and CLIs).
_DAGSTER_LOGGERS = ("dagster", "dagit", "dagster-webserver")


@contextmanager
def _process_logging_kept() -> Iterator[None]:
    """Leave the process's logging and warnings as they were: the daemon's workspace context
    runs Dagster's ``configure_loggers``, which binds the ``dagster`` logger to the
    ``sys.stdout`` of that moment (a test's capture, closed when the test ends) and replaces
    ``warnings.showwarning``. Left so, a later test in this process that logs through Dagster
    prints ``--- Logging error ---`` with a traceback to its stderr."""
    loggers = [logging.getLogger(name) for name in _DAGSTER_LOGGERS]
    saved = [(lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    showwarning = warnings.showwarning
    try:
        yield
    finally:
        warnings.showwarning = showwarning
        for logger, (handlers, level, propagate, disabled) in zip(loggers, saved, strict=True):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled


def graphql(context: WorkspaceProcessContext, query: str, variables: dict[str, Any]) -> Any:
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(context.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return result.data


def step_metadata(instance: dg.DagsterInstance, run_id: str, step: str) -> dict[str, Any]:
    """The output metadata an op reported in a run (as plain values)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_OUTPUT).records
    for record in records:
        event = record.event_log_entry.dagster_event
        if event is not None and event.step_key == step:
            data = event.event_specific_data
            return {k: v.value for k, v in data.metadata.items()}  # type: ignore[union-attr]
    raise AssertionError(f"no output of {step} in run {run_id}")


def daemon_logger() -> logging.Logger:
    return logging.getLogger("idempotent_jobs_tests.daemon")


REPOSITORY = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}


def launch_partition(context: WorkspaceProcessContext, job: str, partition_key: str | None) -> str:
    """Launch one partition (``None``: an unpartitioned job) as the UI's Launchpad does; return
    the Dagster run id."""
    from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION

    data = graphql(
        context,
        LAUNCH_PIPELINE_EXECUTION_MUTATION,
        {
            "executionParams": {
                "selector": {**REPOSITORY, "jobName": job},
                "executionMetadata": {
                    "tags": []
                    if partition_key is None
                    else [{"key": "dagster/partition", "value": partition_key}]
                },
                "runConfigData": {},
            }
        },
    )
    launched = data["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_queue_daemon(context)
    return str(launched["run"]["runId"])


def reexecute(context: WorkspaceProcessContext, parent_run_id: str, strategy: str) -> str:
    """Re-execute a run as the UI's "Re-execute" menu does (FROM_FAILURE or ALL_STEPS)."""
    from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION

    data = graphql(
        context,
        LAUNCH_PIPELINE_REEXECUTION_MUTATION,
        {"reexecutionParams": {"parentRunId": parent_run_id, "strategy": strategy}},
    )
    launched = data["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_queue_daemon(context)
    return str(launched["run"]["runId"])


def reexecute_steps(context: WorkspaceProcessContext, parent_run_id: str, steps: list[str]) -> str:
    """Re-execute only ``steps`` of a run, as the UI's "Re-execute selected steps" does."""
    from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION

    parent = context.instance.get_run_by_id(parent_run_id)
    assert parent is not None
    data = graphql(
        context,
        LAUNCH_PIPELINE_REEXECUTION_MUTATION,
        {
            "executionParams": {
                "selector": {**REPOSITORY, "jobName": parent.job_name},
                "executionMetadata": {
                    "parentRunId": parent_run_id,
                    "rootRunId": parent.root_run_id or parent_run_id,
                    "tags": [{"key": k, "value": v} for k, v in parent.tags.items()],
                },
                "stepKeys": steps,
                "runConfigData": {},
            }
        },
    )
    launched = data["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_queue_daemon(context)
    return str(launched["run"]["runId"])


def launch_backfill(context: WorkspaceProcessContext, job: str, partitions: list[str]) -> str:
    """Submit a partition backfill as the UI's backfill dialog does; return its id."""
    from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

    data = graphql(
        context,
        LAUNCH_PARTITION_BACKFILL_MUTATION,
        {
            "backfillParams": {
                "selector": {
                    "partitionSetName": f"{job}_partition_set",
                    "repositorySelector": REPOSITORY,
                },
                "partitionNames": partitions,
            }
        },
    )
    launched = data["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return str(launched["backfillId"])


def run_queue_daemon(context: WorkspaceProcessContext) -> None:
    """The run queue daemon: dequeue and launch (here: execute) every queued run."""
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
        QueuedRunCoordinatorDaemon,
    )

    daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
    queued = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])
    for _ in range(500):
        if not context.instance.get_run_records(filters=queued):
            return
        list(daemon.run_iteration(context))
    raise AssertionError("queued runs were never launched")


def run_backfill_daemon(context: WorkspaceProcessContext, backfill_id: str) -> None:
    """Run the backfill and run-queue daemons until the backfill has finished all its runs."""
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._daemon.backfill import execute_backfill_iteration

    instance = context.instance
    for _ in range(500):
        errors = [e for e in execute_backfill_iteration(context, daemon_logger()) if e]
        assert not errors, errors
        run_queue_daemon(context)
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None
        if backfill.status != BulkActionStatus.REQUESTED:
            assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status
            return
    raise AssertionError("the backfill did not finish")


def run_retry_daemon(context: WorkspaceProcessContext) -> None:
    """One pass of the daemon that retries failed runs (``run_retries`` in dagster.yaml)."""
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (
        consume_new_runs_for_automatic_reexecution,
    )

    failed = context.instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])
    )
    list(consume_new_runs_for_automatic_reexecution(context, failed, daemon_logger()))
    run_queue_daemon(context)
