"""The code location for Kubernetes: the same jobs and resources, each op in a pod of its own.

Served by the user-code deployment of deploy/kubernetes/values.yaml (``-m
idempotent_jobs.location.kubernetes``); needs the ``k8s`` extra. dagster-k8s's
``k8s_job_executor`` starts a Kubernetes Job per step, with the run launcher's secrets and
environment (the ledger's URL among them): between the pods only the small ``Ticket`` travels,
kept in the ledger by the ledger IO manager (the pods share no filesystem), and the lease is
handed from op to op by owner and epoch, as between the processes of the multiprocess and
Celery executors.
"""

import dagster as dg
from dagster_k8s import k8s_job_executor

from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.ledger_io import ledger_io_manager
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.retention_job import build_retention_job
from idempotent_jobs.location.definitions import defs as in_process
from idempotent_jobs.location.jobs import JOB_SPECS

built = [build_idempotent_job(spec, executor_def=k8s_job_executor) for spec in JOB_SPECS]
built.append(build_reconciliation_job(JOB_SPECS))
built.append(build_retention_job(JOB_SPECS))

defs = dg.Definitions(
    jobs=[job for job, _ in built],
    schedules=[schedule for _, schedule in built],
    resources={**(in_process.resources or {}), "io_manager": ledger_io_manager},
)
