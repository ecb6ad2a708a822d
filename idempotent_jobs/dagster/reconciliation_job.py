"""``ledger_reconciliation``: the ledger compared with Dagster's runs, visible in the UI.

Scheduled every 15 minutes (and launchable by hand): the op's metadata lists every finding; the
run fails when one is a problem, so it shows red on the overview and in the run list. It is never
retried (``dagster/max_retries`` 0): the next tick checks again.
"""

from collections.abc import Sequence

import dagster as dg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.budgets import figure
from idempotent_jobs.core.constants import DEFAULT_MAX_ATTEMPTS, DEFAULT_OUTBOX_AGE_SECONDS
from idempotent_jobs.core.face import LedgerFace
from idempotent_jobs.dagster.health import dagster_findings, drift_findings, ledger_findings
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec


class ReconcileConfig(dg.Config):
    outbox_age_seconds: float = DEFAULT_OUTBOX_AGE_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


def spend_table(admin: LedgerAdmin) -> str:
    """Each job's spend today (UTC), and each budget in force against its period's spend, as
    Markdown tables (money at the price in force when each call was made; ``unknown`` where a
    call had no price or no usage)."""
    currency = admin.currency() or ""
    lines = [
        "| job | calls | tokens | not accepted | cost | usage unknown |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in admin.spend_by_job():
        cost = "unknown" if s.cost is None else f"{s.cost:.6f}{'' if s.priced else '+'}"
        lines.append(
            f"| {s.job_name} | {s.calls:,} | {s.tokens:,} | {s.wasted_tokens:,} "
            f"| {cost} {currency} | {s.unknown_calls:,} |"
        )
    lines += [
        "",
        "| budget | jobs | since | spent | held | cap | left | refusing |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in admin.budgets():
        lines.append(
            f"| {b.budget_id} | {', '.join(b.jobs)} | {b.period_start:%Y-%m-%d} "
            f"| {figure(b.spent, b.unit, b.currency)} | {figure(b.reserved, b.unit, b.currency)} "
            f"| {figure(b.amount, b.unit, b.currency)} | {figure(b.left, b.unit, b.currency)} "
            f"| {'yes' if b.refusing else 'no'} |"
        )
    return "\n".join(lines)


def build_reconciliation_job(
    specs: Sequence[IdempotentJobSpec],
    *,
    name: str = "ledger_reconciliation",
    cron_schedule: str = "*/15 * * * *",
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The reconciliation job of ``specs`` (``name``) and its schedule (``<name>_schedule``,
    on ``cron_schedule``)."""

    @dg.op(name="reconcile_ledger", required_resource_keys={"ledger", *(s.model for s in specs)})
    def reconcile_ledger(context: dg.OpExecutionContext, config: ReconcileConfig) -> None:
        ledger: LedgerFace = context.resources.ledger  # the run's worker face
        configs = {s.name: s.config_of(getattr(context.resources, s.model)) for s in specs}
        with LedgerAdmin.beside(ledger) as admin:  # the operator face of the run's ledger
            findings = (
                dagster_findings(admin, context.instance, specs)
                + ledger_findings(
                    admin,
                    outbox_older_than_seconds=config.outbox_age_seconds,
                    max_attempts=config.max_attempts,
                )
                + drift_findings(admin, specs, configs)
            )
            spend = spend_table(admin)
        problems = [f for f in findings if f.severity == "problem"]
        lines = ["| severity | kind | ledger run | detail |", "| --- | --- | --- | --- |"]
        lines += [
            f"| {f.severity} | {f.kind} | {(f.run_id or '-')[:12]} | {f.detail} |" for f in findings
        ]
        metadata: dict[str, dg.MetadataValue] = {
            "problems": dg.MetadataValue.int(len(problems)),
            "informational": dg.MetadataValue.int(len(findings) - len(problems)),
            "findings": dg.MetadataValue.md("\n".join(lines)),
            "spend_today": dg.MetadataValue.md(spend),
        }
        for finding in findings:
            log = context.log.warning if finding.severity == "problem" else context.log.info
            log(f"{finding.kind}: {finding.detail}")
        if problems:
            raise dg.Failure(description=f"{len(problems)} ledger problem(s)", metadata=metadata)
        context.add_output_metadata(metadata)

    # One check, one run, one verdict: dagster.yaml's run retries would otherwise turn every
    # standing problem into three red runs per tick.
    @dg.job(name=name, description=__doc__, tags={"dagster/max_retries": "0"})
    def ledger_reconciliation() -> None:
        reconcile_ledger()

    schedule = dg.ScheduleDefinition(
        name=f"{name}_schedule",
        job=ledger_reconciliation,
        cron_schedule=cron_schedule,
        default_status=default_status,
    )
    return ledger_reconciliation, schedule
