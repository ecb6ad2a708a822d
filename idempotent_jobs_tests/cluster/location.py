"""The cluster's Dagster code location: the real job factory, two executors, observable steps.

``cluster_celery`` runs each op as a Celery task on the worker hosts; ``cluster_local`` runs the
ops in the run worker on its deployment host. Both compute the same logical runs (one identity
job), so a run of either may take over from the other. Partitions are hours: trial N is the
N-th hour after ``WINDOW``'s start, subject ``acme``.

What the runner scripts goes through files in ``$IJ_CLUSTER_DIR`` (the control channel, as
Jepsen's SSH: the network under test is only what the hosts use to reach each other):
``hold-model-<trial>`` makes the first model call of the trial wait for ``go-model-<trial>``
after writing ``started-model-<trial>`` (with its host), ``hold-persist-<trial>`` does the same
for the first final commit (``persisting-<trial>``, ``go-persist-<trial>``). Every paid call is
logged to ``results-<trial>.jsonl``, which the invariant checker reads.
"""

import json
import os
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_celery import celery_executor

from idempotent_jobs import RunLedger
from idempotent_jobs.core.database import DATABASE_URL_ENV
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.protocol import ModelAnswer
from idempotent_jobs.core.records import Completion, Lease, ModelUsage
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import DocumentCollector, SummaryModel, WebhookChannel
from idempotent_jobs_tests.chaos.parts import CHAOS_AUTHORIZATION

WINDOW_START = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = dg.HourlyPartitionsDefinition(start_date="2026-01-01-00:00")
LEASE_SECONDS = 4.0

HOLD_SECONDS = 240.0


def trial_of(identity: RunIdentity) -> int:
    return int((identity.scheduled_at - WINDOW_START).total_seconds() // 3600)


def partition_of(trial: int) -> str:
    hour = datetime.fromtimestamp(WINDOW_START.timestamp() + trial * 3600, UTC)
    return f"acme|{hour:%Y-%m-%d-%H:%M}"


def _control() -> Path:
    return Path(os.environ["IJ_CLUSTER_DIR"])


def _host() -> str:
    return os.environ.get("IJ_CLUSTER_HOST", socket.gethostname())


def _log(trial: int, event: dict[str, Any]) -> None:
    with (_control() / f"results-{trial}.jsonl").open("a") as handle:
        handle.write(json.dumps({"pid": os.getpid(), "host": _host(), **event}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def hold(step: str, trial: int) -> None:
    """The first caller of ``step`` in ``trial`` waits for the runner, if the runner asked."""
    folder = _control()
    if not (folder / f"hold-{step}-{trial}").exists():
        return
    try:
        os.close(os.open(folder / f"held-{step}-{trial}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return  # only the first
    _log(trial, {"event": "clock", "step": step, "time": time.time()})  # this host's clock
    (folder / f"started-{step}-{trial}").write_text(f"{_host()} {os.getpid()}")
    deadline = time.monotonic() + HOLD_SECONDS
    while not (folder / f"go-{step}-{trial}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class ClusterCollector(DocumentCollector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        trial = trial_of(identity)
        return {
            "documents": [f"collected on {_host()} by {os.getpid()} at {time.time_ns()}"],
            "trial": trial,
        }


class ClusterModel(SummaryModel):
    @property
    def model_name(self) -> str:
        return "cluster-model"

    def summarize(self, prompt: str, raw_input: dict[str, Any]) -> ModelAnswer:
        trial = int(raw_input["trial"])
        hold("model", trial)
        _log(trial, {"event": "paid_call"})  # the call is made and paid for
        return ModelAnswer(
            {
                "summary": f"answer from {_host()} {os.getpid()}",
                "input": raw_input["documents"][0],
                "trial": trial,
            },
            ModelUsage(self.model_name, 120, 30),
        )


class HoldingLedger(RunLedger):
    """The ledger, with the runner's hold before the first final commit of a trial."""

    def complete(
        self, lease: Lease, output: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Completion:
        if isinstance(output.get("trial"), int):
            hold("persist", output["trial"])
        return super().complete(lease, output, *args, **kwargs)


class ClusterLedgerResource(RunLedgerResource):
    ledger_class = HoldingLedger


def _spec(name: str) -> IdempotentJobSpec:
    return IdempotentJobSpec(
        name=name,
        identity_job_name="cluster-summary",
        version="v1",
        window=WINDOW,
        subjects=["acme"],
        prompt="Summarise.",
        channels=("hook",),
        lease_seconds=LEASE_SECONDS,
        wait_seconds=LEASE_SECONDS * 6,
        model_retry=dg.RetryPolicy(max_retries=1, delay=0.5),
    )


CELERY_SPEC = _spec("cluster_celery")
LOCAL_SPEC = _spec("cluster_local")
CELERY = celery_executor.configured(
    {
        "broker": {"env": "IJ_CLUSTER_BROKER"},
        "backend": {"env": "IJ_CLUSTER_BACKEND"},
        "include": ["idempotent_jobs_tests.cluster.location"],
    }
)
built = [build_idempotent_job(CELERY_SPEC, executor_def=CELERY), build_idempotent_job(LOCAL_SPEC)]


def resources() -> Mapping[str, Any]:
    return {
        "ledger": ClusterLedgerResource(
            database_url=dg.EnvVar(DATABASE_URL_ENV), connect_timeout_seconds=5.0
        ),
        "model": ClusterModel(),
        "collector": ClusterCollector(),
        "hook": WebhookChannel(
            url=dg.EnvVar("IJ_CLUSTER_RECEIVER"),
            authorization=CHAOS_AUTHORIZATION,
            timeout_seconds=5,
        ),
    }


defs = dg.Definitions(jobs=[job for job, _ in built], resources=resources())
