"""A code location for the Dagster tests: the real job factory with observable resources.

The model and collector write one line per call under ``$IJ_TEST_DIR``, so calls are counted
across processes and Dagster runs; files there script failures and slowness:
``fail_next`` (the next model call raises TimeoutError, once), ``slow`` (the model writes
``started`` and waits for ``go``), ``delay`` (every call takes that many seconds).
"""

import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_celery import celery_executor

from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.protocol import ModelAnswer
from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.ledger_io import LedgerIOManager, ledger_io_manager
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import (
    DocumentCollector,
    JsonLinesChannel,
    SampleDocumentsCollector,
    SummaryModel,
)
from idempotent_jobs.dagster.ticket import Ticket

SUBJECTS = ["workspace-acme", "workspace-globex", "workspace-initech"]
WINDOW = dg.DailyPartitionsDefinition(start_date="2026-08-01")


def _append(path: Path, line: str) -> int:
    """Append a line; return how many lines the file has now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.seek(0)
        return sum(1 for _ in handle)


class RecordingModel(SummaryModel):
    """Answers differently on every call (the call number is in the answer) and logs calls."""

    calls_dir: str

    @property
    def model_name(self) -> str:
        return "recording-model"

    def summarize(self, prompt: str, raw_input: dict[str, Any]) -> ModelAnswer:
        folder = Path(self.calls_dir)
        number = _append(folder / "model_calls.log", f"{os.getpid()} {raw_input.get('subject')}")
        fail = folder / "fail_next"
        if fail.exists():
            fail.unlink()
            raise TimeoutError(f"scripted model timeout on call {number}")
        delay = folder / "delay"
        if delay.exists():  # a slow model: concurrent deployments overlap on every partition
            time.sleep(float(delay.read_text()))
        if (folder / "slow").exists():
            (folder / "started").touch()
            deadline = time.monotonic() + 60
            while not (folder / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return ModelAnswer(
            {"summary": f"answer #{number} for {raw_input.get('subject')}"},
            ModelUsage(self.model_name, 100 + number, 10),
        )


class RecordingCollector(DocumentCollector):
    calls_dir: str

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        _append(Path(self.calls_dir) / "collect_calls.log", identity.subject_id)
        return SampleDocumentsCollector().collect(identity)


class FlakyLedgerIO(LedgerIOManager):
    """The ledger IO manager, failing once to load ``persist``'s input when the test scripts
    ``fail_load_once`` under ``$IJ_TEST_DIR`` (as an object store times out)."""

    def load_input(self, context: dg.InputContext) -> Ticket:
        marker = Path(os.environ["IJ_TEST_DIR"]) / "fail_load_once"
        upstream = context.upstream_output
        if upstream is not None and upstream.step_key == "transform" and marker.exists():
            marker.unlink()
            raise ConnectionError("scripted: the object store timed out loading the ticket")
        return super().load_input(context)


@dg.io_manager(required_resource_keys={"ledger"})
def flaky_ledger_io(init_context: dg.InitResourceContext) -> FlakyLedgerIO:
    return FlakyLedgerIO()


def _spec(name: str, identity_job_name: str, retries: int) -> IdempotentJobSpec:
    return IdempotentJobSpec(
        name=name,
        identity_job_name=identity_job_name,
        version="v1",
        window=WINDOW,
        subjects=SUBJECTS,
        prompt="Summarise.",
        lease_seconds=5.0,
        wait_seconds=30.0,
        model_retry=dg.RetryPolicy(max_retries=retries, delay=0.1),
    )


SUMMARY_SPEC = _spec("competitor_summary", "competitor-summary", retries=2)
NO_RETRY_SPEC = _spec("summary_without_op_retries", "summary-without-op-retries", retries=0)
CELERY_SPEC = _spec("celery_summary", "celery-summary", retries=0)
MULTIPROCESS_SPEC = _spec("summary_multiprocess", "summary-multiprocess", retries=0)
LEDGER_IO_SPEC = _spec("summary_ledger_io", "summary-ledger-io", retries=0)
FLAKY_IO_SPEC = _spec("summary_flaky_storage", "summary-flaky-storage", retries=0)

# Steps as Celery tasks on real workers; the broker comes from the environment of the test.
CELERY_EXECUTOR = celery_executor.configured(
    {
        "broker": {"env": "IJ_TEST_CELERY_BROKER"},
        "backend": {"env": "IJ_TEST_CELERY_BACKEND"},
        "include": ["idempotent_jobs_tests.dagster_defs"],
    }
)
# The factory's default executor runs the ops in the run's process; summary_multiprocess runs
# each op in a process of its own and celery_summary each as a Celery task, so their ops hand
# the lease over between processes.
built = [
    build_idempotent_job(SUMMARY_SPEC),
    build_idempotent_job(NO_RETRY_SPEC),
    build_idempotent_job(MULTIPROCESS_SPEC, executor_def=dg.multiprocess_executor),
    # Each op in a process of its own, the tickets kept in the ledger: no shared storage.
    build_idempotent_job(
        LEDGER_IO_SPEC, executor_def=dg.multiprocess_executor, io_manager_key="ledger_io"
    ),
    build_idempotent_job(FLAKY_IO_SPEC, io_manager_key="flaky_ledger_io"),
    build_idempotent_job(CELERY_SPEC, executor_def=CELERY_EXECUTOR),
    build_reconciliation_job([SUMMARY_SPEC]),
]

defs = dg.Definitions(
    jobs=[job for job, _ in built],
    schedules=[schedule for _, schedule in built],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "model": RecordingModel(calls_dir=dg.EnvVar("IJ_TEST_DIR")),
        "collector": RecordingCollector(calls_dir=dg.EnvVar("IJ_TEST_DIR")),
        "report_file": JsonLinesChannel(path=dg.EnvVar("IJ_TEST_NOTIFICATIONS")),
        "ledger_io": ledger_io_manager,
        "flaky_ledger_io": flaky_ledger_io,
    },
)
