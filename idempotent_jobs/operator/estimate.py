"""What a backfill of a job's partitions would do and cost, before it runs.

Each partition's run id is computed as the job computes it; the ledger says which are completed
(a backfill makes no model call for them) and which would be computed. The expected tokens and
money come from the job's own history (``LedgerAdmin.job_history``): the median and p90 per
accepted run, and what the calls that were not accepted cost so far, spread
over the runs they were made for.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.costs import JobHistory
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import partition_key


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A backfill's partitions by what it would do, and what the computed ones should cost.

    ``expected_calls`` is one model call per partition to compute; ``expected_tokens`` and
    ``expected_cost`` the median per accepted run times them, ``high_*`` the p90 times them;
    ``failure_*`` what the calls not accepted added per accepted run so far, times them
    (``None`` where the history has no accepted run, or no price)."""

    job: str
    identity_job: str
    partitions: int
    done: int
    to_compute: int
    held: int
    history: JobHistory
    currency: str | None
    expected_calls: int
    failure_calls: float | None
    expected_tokens: float | None
    high_tokens: float | None
    failure_tokens: float | None
    expected_cost: float | None
    high_cost: float | None
    failure_cost: float | None
    to_compute_keys: list[str] = field(default_factory=list)


def partition_keys(
    spec: IdempotentJobSpec, first: str, last: str, subjects: Sequence[str] = ()
) -> list[str]:
    """The job's partition keys from window ``first`` to ``last`` (both included; windows that
    have started), for ``subjects`` (default: all of the job's)."""
    windows = spec.window.get_partition_keys()
    for option, key in (("--from", first), ("--to", last)):
        if key not in windows:
            span = f"{windows[0]} to {windows[-1]}" if windows else "none yet"
            raise InvalidInputError(
                option,
                f"{key!r} is not a window of job {spec.name} (format {spec.window.fmt!r}; "
                f"windows so far: {span})",
            )
    start, end = windows.index(first), windows.index(last)
    if start > end:
        raise InvalidInputError("--to", f"{last!r} is before --from {first!r}")
    unknown = [s for s in subjects if s not in spec.subjects]
    if unknown:
        raise InvalidInputError(
            "--subject", f"{unknown[0]!r} is not a subject of job {spec.name}: {spec.subjects}"
        )
    chosen = list(subjects) or list(spec.subjects)
    return [
        partition_key(subject, window) for window in windows[start : end + 1] for subject in chosen
    ]


def _times(per_run: float | None, runs: int) -> float | None:
    return None if per_run is None else float(per_run) * runs


def estimate(admin: LedgerAdmin, spec: IdempotentJobSpec, keys: Sequence[str]) -> Estimate:
    """What a backfill of ``keys`` (partition keys of ``spec``'s job) would do and cost."""
    run_ids = {key: spec.identity_for(key).run_id for key in keys}
    statuses = admin.run_statuses(list(run_ids.values()))
    done = [k for k, r in run_ids.items() if statuses.get(r) == "completed"]
    held = [k for k, r in run_ids.items() if statuses.get(r) == "running"]
    to_compute = [k for k in keys if k not in done]
    history = admin.job_history(spec.identity_job_name)
    n = len(to_compute)
    accepted = history.accepted_runs
    failed_per_run = history.failed_calls / accepted if accepted else None
    currency = next(iter({p.currency for p in admin.prices().values()}), None)
    failure_cost = (
        float(history.failed_cost) / accepted * n
        if accepted and history.failed_cost is not None
        else None
    )
    return Estimate(
        job=spec.name,
        identity_job=spec.identity_job_name,
        partitions=len(keys),
        done=len(done),
        to_compute=n,
        held=len(held),
        history=history,
        currency=currency,
        expected_calls=n,
        failure_calls=None if failed_per_run is None else n * failed_per_run,
        expected_tokens=_times(history.median_tokens, n),
        high_tokens=_times(history.p90_tokens, n),
        failure_tokens=history.failed_tokens / accepted * n if accepted else None,
        expected_cost=_times(history.median_cost, n),
        high_cost=_times(history.p90_cost, n),
        failure_cost=failure_cost,
        to_compute_keys=to_compute,
    )
