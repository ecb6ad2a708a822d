"""What an operator should look at beyond the ledger's own health (``core.health``): results
computed under another configuration, and ledger-vs-Dagster reconciliation (``reconcile``, and the
``ledger_reconciliation`` job in the UI)."""

from collections import defaultdict
from collections.abc import Mapping, Sequence

import dagster as dg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.health import Finding, Severity, ledger_findings
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec

__all__ = ["Finding", "Severity", "ledger_findings", "drift_findings", "dagster_findings"]

MAX_DRIFT_FINDINGS = 50


def drift_findings(
    admin: LedgerAdmin, specs: Sequence[IdempotentJobSpec], configs: Mapping[str, JobConfig]
) -> list[Finding]:
    """Completed runs whose result was computed under another prompt, model or validator than
    the job has now (``configs``: each spec's current configuration, by spec name) (info):
    reused as they are until revised or the version is bumped. A spec without a configuration
    in ``configs`` (its model step is not known here) is not compared."""
    findings: list[Finding] = []
    for spec in specs:
        config = configs.get(spec.name)
        if config is None:
            continue
        # One more than are listed, to know whether there are more; rows carry their payloads.
        drifted = admin.drifted(
            spec.identity_job_name, spec.version, config, limit=MAX_DRIFT_FINDINGS + 1
        )
        for record in drifted[:MAX_DRIFT_FINDINGS]:
            changed = ", ".join(config.changed_since(record.config_parts))
            findings.append(
                Finding(
                    "config_drift",
                    "info",
                    f"{spec.name} {record.subject_id}@{record.scheduled_at.isoformat()}: "
                    f"computed under another {changed}; reused as it is. To recompute: "
                    f"`idempotent-jobs revise {record.run_id[:12]} --reason ...`, or bump "
                    f"version {spec.version!r} of {spec.name}",
                    record.run_id,
                )
            )
        if len(drifted) > MAX_DRIFT_FINDINGS:
            findings.append(
                Finding(
                    "config_drift",
                    "info",
                    f"{spec.name}: more than {MAX_DRIFT_FINDINGS} runs were computed under "
                    "another configuration; the others are left out here (`runs list --json` "
                    "shows each run's config_parts)",
                )
            )
    return findings


def _partition_runs(instance: dg.DagsterInstance, job_name: str) -> dict[str, list[dg.DagsterRun]]:
    runs: dict[str, list[dg.DagsterRun]] = defaultdict(list)
    for record in instance.get_run_records(filters=dg.RunsFilter(job_name=job_name)):
        partition = record.dagster_run.tags.get("dagster/partition")
        if partition:
            runs[partition].append(record.dagster_run)
    return runs


def dagster_findings(
    admin: LedgerAdmin, instance: dg.DagsterInstance, specs: Sequence[IdempotentJobSpec]
) -> list[Finding]:
    """Partitions run by several Dagster runs (info), and Dagster runs that succeeded while the
    ledger holds no accepted result for their partition (problem)."""
    findings: list[Finding] = []
    for spec in specs:
        # One read of the job's ledger runs, not one per partition.
        records = {
            r.run_id: r for r in admin.list_runs(job_name=spec.identity_job_name, limit=None)
        }
        for partition, runs in sorted(_partition_runs(instance, spec.name).items()):
            try:
                run_id = spec.identity_for(partition).run_id
            except InvalidInputError as exc:
                findings.append(Finding("unknown_partition", "problem", str(exc), None, partition))
                continue
            ids = sorted(r.run_id for r in runs)
            if len(runs) > 1:
                findings.append(
                    Finding(
                        "several_dagster_runs",
                        "info",
                        f"{spec.name} {partition}: {len(runs)} Dagster runs, one logical run",
                        run_id,
                        partition,
                        ids,
                    )
                )
            succeeded = sorted(r.run_id for r in runs if r.status == dg.DagsterRunStatus.SUCCESS)
            record = records.get(run_id)
            if succeeded and (record is None or record.status != "completed"):
                state = record.status if record else "missing"
                findings.append(
                    Finding(
                        "success_without_result",
                        "problem",
                        f"{spec.name} {partition}: Dagster run succeeded, ledger run is {state}",
                        run_id,
                        partition,
                        succeeded,
                    )
                )
    return findings
