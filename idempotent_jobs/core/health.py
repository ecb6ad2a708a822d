"""Ledger health, as ``doctor`` reports it: what an operator should look at, from the ledger
alone (no Dagster, so ``doctor`` starts as fast as the other ledger commands)."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.budgets import BudgetStanding, figure
from idempotent_jobs.core.schema import code_version

Severity = Literal["info", "problem"]


@dataclass(frozen=True)
class Finding:
    """One thing found: ``problem`` findings make ``doctor``/``reconcile`` exit non-zero."""

    kind: str
    severity: Severity
    detail: str
    run_id: str | None = None
    partition: str | None = None
    dagster_run_ids: list[str] = field(default_factory=list)


#: Findings listed per check; past that, one more finding says how to see the rest.
MAX_FINDINGS_PER_CHECK = 100


def _bounded(kind: str, found: list[Finding], more: str) -> list[Finding]:
    if len(found) <= MAX_FINDINGS_PER_CHECK:
        return found
    left_out = Finding(
        kind,
        "problem",
        f"more than {MAX_FINDINGS_PER_CHECK} of these; the others are left out here ({more})",
    )
    return [*found[:MAX_FINDINGS_PER_CHECK], left_out]


def budget_findings(budgets: list[BudgetStanding]) -> list[Finding]:
    """Each budget in the ledger (what every worker enforces) and where its current period
    stands: ``budget_spent`` (a problem: no call fits until the period turns or the budget is
    raised) or ``budget`` (informational); ``usage_unknown`` when calls of the period reported
    no usage (each in doubt: its reservation stays charged apart until ``costs settle``)."""
    found = []
    for b in budgets:
        whose = f" (subject {b.subject_id}, the one that spent most)" if b.subject_id else ""
        detail = (
            f"budget {b.budget_id}{whose}: {figure(b.spent, b.unit, b.currency)} spent and "
            f"{figure(b.reserved, b.unit, b.currency)} held by calls in flight, "
            f"{figure(b.in_doubt, b.unit, b.currency)} in doubt, of "
            f"{figure(b.amount, b.unit, b.currency)} since {b.period_start:%Y-%m-%d} (UTC); "
            f"set by {b.declared_by}"
        )
        if b.refusing:
            detail += f": model calls of {', '.join(b.jobs)} are refused until the {b.period} turns"
        found.append(
            Finding(
                "budget_spent" if b.refusing else "budget",
                "problem" if b.refusing else "info",
                detail,
            )
        )
        if b.unknown_calls:
            found.append(
                Finding(
                    "usage_unknown",
                    "info",
                    f"budget {b.budget_id}: {b.unknown_calls:,} call(s) this {b.period} reported "
                    f"no usage; {figure(b.in_doubt, b.unit, b.currency)} stays charged in doubt "
                    "until `idempotent-jobs costs settle` (or the period's end)",
                )
            )
    return found


def _holder(lease_owner: str | None) -> str:
    """Who holds a lease, as the operator reads it: a batch of the batch lane says so."""
    if lease_owner is not None and lease_owner.startswith("batch:"):
        return f"batch {lease_owner.removeprefix('batch:')} (the batch lane)"
    return str(lease_owner)


#: A batch whose last this many steps failed one after another is a problem.
BATCH_FAILING_STEPS = 3


def batch_findings(batches: list[dict[str, Any]], now: datetime) -> list[Finding]:
    """Each open batch of the batch lane (info: the runs it holds, where it stands), and a
    problem for one that nothing advances (its lease lapsed, so its runs' leases lapse too and
    an online run may compute them while the provider still does) or whose last
    :data:`BATCH_FAILING_STEPS` steps failed."""
    found = []
    for b in batches:
        if b["state"] == "collected":
            continue
        pending = dict(b["item_states"] or {}).get("pending", 0)
        what = (
            f"batch {b['batch_id']} of {b['job_name']} ({b['provider']} {b['model']}, "
            f"{b['provider_batch_id'] or 'not submitted'}): {b['state']}, holding {pending} "
            "run(s)"
        )
        # Handed back (no owner): lapsed once a lease's time has passed since its last step.
        last = b["checked_at"] or b["submitted_at"] or b["created_at"]
        lapsed = (
            b["lease_expires_at"] < now
            if b["lease_owner"] is not None
            else last + timedelta(seconds=b["lease_seconds"]) < now
        )
        failing = int(b.get("failed_steps") or 0)
        if failing >= BATCH_FAILING_STEPS:
            found.append(
                Finding(
                    "batch_failing",
                    "problem",
                    f"{what}; its last {failing} steps failed, the last with: "
                    f"{(b.get('last_step_error') or '')[:500]}",
                )
            )
        if lapsed:
            found.append(
                Finding(
                    "batch_not_advanced",
                    "problem",
                    f"{what}; nothing has advanced it for longer than its lease "
                    f"({b['lease_seconds']:g} s), so its runs may be taken online while the "
                    "provider computes them: is its sensor (<job>_batches) running?",
                )
            )
        else:
            found.append(Finding("batch_open", "info", what))
    return found


def ledger_findings(
    admin: LedgerAdmin, *, outbox_older_than_seconds: float, max_attempts: int
) -> list[Finding]:
    """Budgets spent, expired leases, notifications undelivered too long, runs failed past
    their retries:
    the oldest :data:`MAX_FINDINGS_PER_CHECK` of each, so that a ledger with thousands of
    problems still answers at once (one row past the bound tells that there are more)."""
    limit = MAX_FINDINGS_PER_CHECK + 1
    expired = [
        Finding(
            "expired_lease",
            "problem",
            f"{r.job_name}/{r.subject_id}@{r.scheduled_at.isoformat()} held by "
            f"{_holder(r.lease_owner)}, lease expired at {r.lease_expires_at}",
            r.run_id,
        )
        for r in admin.expired_leases(limit)
    ]
    undelivered = [
        Finding(
            "undelivered_outbox",
            "problem",
            f"{row.idempotency_key} queued {row.created_at}, {row.delivery_attempts} attempts"
            + (f", last error: {row.last_error}" if row.last_error else ""),
            row.run_id,
        )
        for row in admin.stale_outbox(outbox_older_than_seconds, limit)
    ]
    failed = [
        Finding(
            "failed_past_retries",
            "problem",
            f"{r.job_name}/{r.subject_id}@{r.scheduled_at.isoformat()} failed after "
            f"{r.attempts} attempts: {r.last_error}",
            r.run_id,
        )
        for r in admin.failed_past_retries(max_attempts, limit)
    ]
    drills = [
        Finding(
            "drill_armed",
            "info",
            f"failure drill armed for {'every job' if d.job_name == '*' else d.job_name}: the "
            f"next {d.remaining} model call(s) fail, until {d.expires_at} "
            "(`idempotent-jobs drill off` ends it)",
        )
        for d in admin.drills()
    ]
    ahead = [
        Finding(
            "schema_ahead",
            "info",
            f"migration {m.label} ({m.change}) is applied and this code ({code_version()}) does "
            "not ship it: a later release migrated the ledger, and workers of this one run on "
            "it meanwhile; the mixed window is over when every worker runs that release",
        )
        for m in admin.migrations_ahead()
    ]
    return [
        *ahead,
        *drills,
        *batch_findings(admin.batches(limit=limit), admin.database_now()),
        *budget_findings(admin.budgets()),
        *_bounded("expired_lease", expired, "`runs list --status running`"),
        *_bounded("undelivered_outbox", undelivered, "`outbox list --pending`"),
        *_bounded("failed_past_retries", failed, "`runs list --status failed`"),
    ]
