"""Run the Dagster partition of a ledger run in this process (``revise --now``), from the loaded
code location's definitions."""

from zoneinfo import ZoneInfo

import dagster as dg

from idempotent_jobs.core.errors import LedgerError
from idempotent_jobs.core.identity import normalize_text
from idempotent_jobs.core.records import RunRecord
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import partition_key
from idempotent_jobs.operator.code_location import Workspace


def partition_key_for(spec: IdempotentJobSpec, record: RunRecord) -> str:
    """The partition key of ``record``: its subject as the job's subjects spell it (a subjects
    file may spell it in NFD; the ledger stores NFC), and its window in the job's zone."""
    zone = ZoneInfo(spec.window.timezone or "UTC")
    window_key = record.scheduled_at.astimezone(zone).strftime(spec.window.fmt)
    subject = next(
        (s for s in spec.subjects if normalize_text(s) == record.subject_id), record.subject_id
    )
    return partition_key(subject, window_key)


def partition_for_run(workspace: Workspace, record: RunRecord) -> tuple[IdempotentJobSpec, str]:
    """The job and partition key of the workspace that compute ``record``; raise
    :class:`LedgerError` if there is none (checked before ``revise --now`` writes anything)."""
    spec = workspace.spec_for_identity(record.job_name, record.version)
    key = partition_key_for(spec, record)
    try:
        found = spec.identity_for(key)
        # Fields, not ids: a run an earlier release stored in NFD keeps its old id.
        maps_back = (found.job_name, found.subject_id, found.scheduled_at, found.version) == (
            record.job_name,
            record.subject_id,
            record.scheduled_at,
            record.version,
        )
    except LedgerError:
        maps_back = False
    if not maps_back:
        raise LedgerError(
            f"run {record.run_id} maps to no partition of job {spec.name} "
            f"(subject {record.subject_id!r} at {record.scheduled_at.isoformat()})"
        )
    return spec, key


def rerun_partition(
    workspace: Workspace, spec: IdempotentJobSpec, key: str
) -> dg.ExecuteInProcessResult:
    """Execute the job's partition ``key`` once, in process; raise if the run fails."""
    defs = workspace.location_of(spec).defs
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    return defs.resolve_job_def(spec.name).execute_in_process(partition_key=key, run_config=quiet)


#: Run tags the Dagster UI selects a job's runs and partition statuses by (the repository label,
#: ``<repository>@<code location>``, and the job's partition set).
REPOSITORY_LABEL_TAG = ".dagster/repository"
PARTITION_SET_TAG = "dagster/partition_set"


def ui_tags(workspace: Workspace, spec: IdempotentJobSpec) -> dict[str, str]:
    """The tags that make a run launched from here show on the job's Runs and Partitions pages
    of ``dagster dev`` serving the same code location, as a launch from its UI does."""
    location = workspace.location_of(spec)
    repository = location.defs.get_repository_def().name
    return {
        REPOSITORY_LABEL_TAG: f"{repository}@{location.target.dagster_location_name}",
        PARTITION_SET_TAG: f"{spec.name}_partition_set",
    }


def launch_partitions(
    workspace: Workspace, spec: IdempotentJobSpec, keys: list[str], instance: dg.DagsterInstance
) -> list[tuple[str, dg.ExecuteInProcessResult]]:
    """Run each partition of ``keys`` in this process, recorded in ``instance`` (the project's
    Dagster instance) like a launch from the UI; a key the job does not have raises before any
    runs."""
    job = workspace.location_of(spec).defs.resolve_job_def(spec.name)
    for key in keys:
        if not spec.partitions_def.has_partition_key(key):
            raise LedgerError(
                f"job {spec.name} has no partition {key!r}: a key is <subject>|<window>, with "
                f"a subject of {', '.join(map(repr, spec.subjects))} and a window the job has"
            )
    tags = ui_tags(workspace, spec)
    return [
        (
            key,
            job.execute_in_process(
                partition_key=key, instance=instance, tags=tags, raise_on_error=False
            ),
        )
        for key in keys
    ]
