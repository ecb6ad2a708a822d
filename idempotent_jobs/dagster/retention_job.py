"""``ledger_retention``: prune payloads by each job's retention policy, daily, visible in the UI.

The op runs :func:`idempotent_jobs.core.retention.prune` (the code behind `idempotent-jobs prune
--apply`) for every job spec whose policy prunes anything, and reports the rows and bytes pruned
per job and part as metadata. It runs while the jobs run: it touches only completed runs and
delivered notifications, in short batches.
"""

from collections.abc import Sequence

import dagster as dg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.core.retention import (
    DEFAULT_BATCH_SIZE,
    PART_TABLES,
    PARTS,
    describe_kept,
    prune,
)
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec


class RetentionConfig(dg.Config):
    batch_size: int = DEFAULT_BATCH_SIZE


def build_retention_job(
    specs: Sequence[IdempotentJobSpec],
    *,
    name: str = "ledger_retention",
    cron_schedule: str = "30 3 * * *",
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The retention job of ``specs`` (``name``) and its schedule (``<name>_schedule``, on
    ``cron_schedule``)."""

    @dg.op(name="prune_ledger", required_resource_keys={"ledger"})
    def prune_ledger(context: dg.OpExecutionContext, config: RetentionConfig) -> None:
        ledger: LedgerFace = context.resources.ledger  # the run's worker face
        with LedgerAdmin.beside(ledger) as admin:  # the operator face of the run's ledger
            lines, total_rows, total_bytes = _prune_every_job(context, admin, specs, config)
        context.add_output_metadata(
            {
                "rows_pruned": dg.MetadataValue.int(total_rows),
                "bytes_pruned": dg.MetadataValue.int(total_bytes),
                "pruned": dg.MetadataValue.md("\n".join(lines)),
            }
        )

    @dg.job(name=name, description=__doc__)
    def ledger_retention() -> None:
        prune_ledger()

    schedule = dg.ScheduleDefinition(
        name=f"{name}_schedule",
        job=ledger_retention,
        cron_schedule=cron_schedule,
        default_status=default_status,
    )
    return ledger_retention, schedule


def _prune_every_job(
    context: dg.OpExecutionContext,
    admin: LedgerAdmin,
    specs: Sequence[IdempotentJobSpec],
    config: RetentionConfig,
) -> tuple[list[str], int, int]:
    """Prune each job by its spec's policy: the report's table lines, rows and bytes."""
    lines = ["| job | part | rows | bytes | kept |", "| --- | --- | --- | ---: | --- |"]
    total_rows = total_bytes = 0
    for spec in specs:
        if not spec.retention.prunes_anything:
            continue
        report = prune(
            admin,
            spec.identity_job_name,
            spec.retention,
            apply=True,
            batch_size=config.batch_size,
        )
        for part in PARTS:
            kept = getattr(spec.retention, part)
            if kept is None:
                continue
            count = report.parts[part]
            lines.append(
                f"| {spec.name} | {PART_TABLES[part]} | {count.rows} | {count.bytes} "
                f"| {describe_kept(kept)} |"
            )
        total_rows += report.rows
        total_bytes += report.bytes
        context.log.info(
            f"{spec.name}: pruned {report.rows} rows, {report.bytes} bytes "
            f"in {report.batches} batches ({spec.retention.describe()})"
        )
    return lines, total_rows, total_bytes
