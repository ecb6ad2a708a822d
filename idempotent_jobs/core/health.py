"""Ledger health, as ``doctor`` reports it: what an operator should look at, from the ledger
alone (no Dagster, so ``doctor`` starts as fast as the other ledger commands)."""

from dataclasses import dataclass, field
from typing import Literal

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.costs import JobSpend
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


def budget_findings(spend: list[JobSpend]) -> list[Finding]:
    """Each budgeted job's spend today against its budget: ``budget_spent`` (a problem: its
    model calls are refused until the UTC day turns) or ``budget`` (informational)."""
    found = []
    for s in spend:
        limits = [
            ("per day", s.tokens, s.tokens_per_day),
            ("per subject (the top subject)", s.top_subject_tokens, s.tokens_per_subject_per_day),
        ]
        set_limits = [(what, used, limit) for what, used, limit in limits if limit is not None]
        if not set_limits:
            continue
        spent = [f"{used:,} of {limit:,} tokens {what}" for what, used, limit in set_limits]
        over = any(used >= limit for _, used, limit in set_limits)
        found.append(
            Finding(
                "budget_spent" if over else "budget",
                "problem" if over else "info",
                f"{s.job_name} spent {'; '.join(spent)} on {s.day_start:%Y-%m-%d} (UTC)"
                + (": its model calls are refused until the day turns" if over else ""),
            )
        )
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
            f"{r.job_name}/{r.subject_id}@{r.scheduled_at.isoformat()} held by {r.lease_owner}, "
            f"lease expired at {r.lease_expires_at}",
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
        *budget_findings(admin.spend_by_job()),
        *_bounded("expired_lease", expired, "`runs list --status running`"),
        *_bounded("undelivered_outbox", undelivered, "`outbox list --pending`"),
        *_bounded("failed_past_retries", failed, "`runs list --status failed`"),
    ]
