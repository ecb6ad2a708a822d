"""What a backfill of a job's partitions would do and cost, before it runs.

Each partition's run id is computed as the job computes it; the ledger says which are completed
(a backfill makes no model call for them) and which would be computed. The expected tokens and
money come from the job's own history (``LedgerAdmin.job_history``): p10, median and p90 per
accepted run, and what the calls that were not accepted cost so far, spread over the runs they
were made for. A partition whose input is already collected (checkpointed) is scaled by its size
against the history's tokens per input byte instead: a larger input costs more.

It is linear in partitions with bounded memory: the partitions are walked window by window,
their run ids asked of the ledger a chunk at a time, and only counts are kept (and the first
:data:`KEYS_KEPT` keys to compute).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.costs import JobHistory
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import run_ids
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import partition_key

#: Run ids asked of the ledger per statement.
CHUNK = 5000
#: The keys to compute an estimate lists (the counts cover all of them).
KEYS_KEPT = 10_000


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A backfill's partitions by what it would do, and what the computed ones should cost.

    ``expected_calls`` is one model call per partition to compute. ``low_*``, ``expected_*``
    and ``high_*`` are the p10, median and p90 per accepted run times the partitions (for a
    partition with a checkpointed input: its bytes times the history's per byte, in the same
    ratio); ``failure_*`` what the calls not accepted added per accepted run so far, times them.
    ``None`` where the history has no accepted run; money ``None`` where a price is unknown.
    ``basis`` says what each part of the figure rests on."""

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
    low_tokens: float | None
    expected_tokens: float | None
    high_tokens: float | None
    failure_tokens: float | None
    low_cost: float | None
    expected_cost: float | None
    high_cost: float | None
    failure_cost: float | None
    sized: int = 0
    basis: list[str] = field(default_factory=list)
    to_compute_keys: list[str] = field(default_factory=list)
    #: The same runs through the batch lane, at the batch tier's prices in force now (``None``
    #: where a model has no batch price).
    batch_low_cost: float | None = None
    batch_expected_cost: float | None = None
    batch_high_cost: float | None = None


def window_range(spec: IdempotentJobSpec, first: str, last: str) -> list[tuple[str, datetime]]:
    """The job's windows from ``first`` to ``last`` (both included; windows that have
    started), each with its UTC start."""
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
    chosen = windows[start : end + 1]
    if not chosen:
        return []
    return [(key, spec.window.time_window_for_partition_key(key).start) for key in chosen]


def chosen_subjects(spec: IdempotentJobSpec, subjects: Sequence[str]) -> list[str]:
    """``subjects`` (each once, in order), or all of the job's."""
    unknown = [s for s in subjects if s not in spec.subjects]
    if unknown:
        raise InvalidInputError(
            "--subject", f"{unknown[0]!r} is not a subject of job {spec.name}: {spec.subjects}"
        )
    return list(dict.fromkeys(subjects)) or list(spec.subjects)


def partition_keys(
    spec: IdempotentJobSpec, first: str, last: str, subjects: Sequence[str] = ()
) -> list[str]:
    """The job's partition keys from window ``first`` to ``last`` for ``subjects``."""
    chosen = chosen_subjects(spec, subjects)
    return [partition_key(s, w) for w, _ in window_range(spec, first, last) for s in chosen]


def _partitions(
    spec: IdempotentJobSpec, windows: list[tuple[str, datetime]], subjects: list[str]
) -> Iterator[tuple[str, str, str]]:
    """(window key, subject, run id) of every partition, one at a time."""
    keys = {start: window for window, start in windows}
    found = run_ids(spec.identity_job_name, spec.version, subjects, [s for _, s in windows])
    for start, subject, run_id in found:
        yield keys[start], subject, run_id


def _chunks(items: Iterator[tuple[str, str, str]]) -> Iterator[list[tuple[str, str, str]]]:
    chunk: list[tuple[str, str, str]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _scaled(
    per_run: float | None, median: float | None, per_byte: float | None, runs: int, size: int
) -> float | None:
    """``runs`` partitions at ``per_run``, plus ``size`` input bytes at ``per_byte`` in the
    ratio of ``per_run`` to the median (the p10 or p90 of a sized partition)."""
    if per_run is None:
        return None
    total = float(per_run) * runs
    if size:
        if per_byte is None or not median:
            return None
        total += per_byte * size * float(per_run) / float(median)
    return total


def estimate(
    admin: LedgerAdmin,
    spec: IdempotentJobSpec,
    first: str,
    last: str,
    subjects: Sequence[str] = (),
) -> Estimate:
    """What a backfill of ``spec``'s job from window ``first`` to ``last`` (for ``subjects``,
    default all) would do and cost."""
    windows = window_range(spec, first, last)
    chosen = chosen_subjects(spec, subjects)
    partitions = done = held = unsized = sized = size = 0
    keys: list[str] = []
    for chunk in _chunks(_partitions(spec, windows, chosen)):
        found = admin.run_sizes([run_id for _, _, run_id in chunk])
        for window, subject, run_id in chunk:
            partitions += 1
            status, input_bytes = found.get(run_id, (None, None))
            if status == "completed":
                done += 1
                continue
            held += status == "running"
            if input_bytes:
                sized += 1
                size += input_bytes
            else:
                unsized += 1
            if len(keys) < KEYS_KEPT:
                keys.append(partition_key(subject, window))
    history = admin.job_history(spec.identity_job_name)
    n = unsized + sized
    accepted = history.accepted_runs
    per_byte_tokens = history.tokens_per_input_byte
    per_byte_cost = history.cost_per_input_byte
    if not sized or per_byte_tokens is None:  # no size to scale by: every partition per run
        unsized, sized, size = n, 0, 0
    basis = []
    if unsized:
        basis.append(f"{unsized:,} partition(s) at the history's tokens per accepted run")
    if sized:
        basis.append(
            f"{sized:,} partition(s) with their input collected ({size:,} bytes), at the "
            f"history's {per_byte_tokens:.4f} tokens per input byte"
        )
    h = history
    money_known = h.priced

    def cost(per_run: float | None) -> float | None:
        if not money_known:
            return None
        return _scaled(per_run, h.median_cost, per_byte_cost, unsized, size)

    def batch_cost(per_run: float | None) -> float | None:
        if not h.batch_priced or not h.median_cost or h.batch_median_cost is None:
            return None
        ratio = h.batch_median_cost / h.median_cost
        per_byte = per_byte_cost * ratio if per_byte_cost is not None else None
        return _scaled(per_run, h.batch_median_cost, per_byte, unsized, size)

    return Estimate(
        job=spec.name,
        identity_job=spec.identity_job_name,
        partitions=partitions,
        done=done,
        to_compute=n,
        held=held,
        history=history,
        currency=admin.currency(),
        expected_calls=n,
        failure_calls=h.failed_calls / accepted * n if accepted else None,
        low_tokens=_scaled(h.p10_tokens, h.median_tokens, per_byte_tokens, unsized, size),
        expected_tokens=_scaled(h.median_tokens, h.median_tokens, per_byte_tokens, unsized, size),
        high_tokens=_scaled(h.p90_tokens, h.median_tokens, per_byte_tokens, unsized, size),
        failure_tokens=h.failed_tokens / accepted * n if accepted else None,
        low_cost=cost(h.p10_cost),
        expected_cost=cost(h.median_cost),
        high_cost=cost(h.p90_cost),
        failure_cost=float(h.failed_cost) / accepted * n
        if accepted and h.failed_cost is not None
        else None,
        sized=sized,
        basis=basis,
        to_compute_keys=keys,
        batch_low_cost=batch_cost(h.batch_p10_cost),
        batch_expected_cost=batch_cost(h.batch_median_cost),
        batch_high_cost=batch_cost(h.batch_p90_cost),
    )


__all__ = ["Estimate", "estimate", "partition_keys"]
