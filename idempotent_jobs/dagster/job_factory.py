"""Build a partitioned, scheduled Dagster job of ops collect -> transform -> persist -> deliver.

The ops are thin: the ledger decides. Each op execution claims or takes over the run's lease
(owner + epoch, handed from step to step within one Dagster run), so schedules, backfills,
retries, re-execution from failure and overlapping launches all address the same ledger row.
"""

import dagster as dg

from idempotent_jobs.dagster.failure_hook import build_failure_hook
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.ops import build_ops

#: The attribute of a built job's collect op that holds the job's spec. The op definition
#: object stays the same when ``Definitions`` binds resources to the job (the job itself is
#: copied), so tools that load a code location find the spec of every job the factory built,
#: on the job itself: no registry, nothing looked up by module.
SPEC_ATTRIBUTE = "idempotent_job_spec"


def spec_of_job(job: dg.JobDefinition) -> IdempotentJobSpec | None:
    """The spec :func:`build_idempotent_job` built ``job`` from, or ``None`` for another job."""
    for node in job.graph.node_defs:
        spec = vars(node).get(SPEC_ATTRIBUTE)
        if isinstance(spec, IdempotentJobSpec):
            return spec
    return None


def build_idempotent_job(
    spec: IdempotentJobSpec,
    executor_def: dg.ExecutorDefinition | None = None,
    *,
    io_manager_key: str = "io_manager",
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The partitioned job and its schedule (one run request per subject for the last window,
    run key = partition key).

    ``executor_def`` defaults to Dagster's in-process executor: the four ops run one after the
    other anyway, and the multiprocess executor would start a Python process that imports
    Dagster for each of them (about 10 s per op on a 2-core machine). Pass
    ``dg.multiprocess_executor`` (each op in its own process) or a Celery executor (each op a
    task) to spread steps out: the lease is handed on between them by owner and epoch.

    ``io_manager_key``: the IO manager the ops hand their tickets through. Where steps share no
    storage (a pod per step), give that key
    :data:`~idempotent_jobs.dagster.ledger_io.ledger_io_manager`, which keeps them in the ledger.
    """
    collect, transform, persist, deliver = build_ops(spec, io_manager_key)

    @dg.job(
        name=spec.name,
        partitions_def=spec.partitions_def,
        description=spec.description or None,
        tags=spec.tags(),
        executor_def=executor_def or dg.in_process_executor,
        hooks={build_failure_hook(spec)},
    )
    def idempotent_job() -> None:
        collected = collect.alias("collect")()
        deliver.alias("deliver")(persist.alias("persist")(transform.alias("transform")(collected)))

    vars(collect)[SPEC_ATTRIBUTE] = spec  # this build's own op: see SPEC_ATTRIBUTE
    if spec.gated:
        from idempotent_jobs.dagster.shadow_lane import gated_schedule

        return idempotent_job, gated_schedule(spec, idempotent_job)
    schedule = dg.build_schedule_from_partitioned_job(idempotent_job, name=f"{spec.name}_schedule")
    assert isinstance(schedule, dg.ScheduleDefinition)
    return idempotent_job, schedule
