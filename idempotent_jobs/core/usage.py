"""Token counts as a provider reports them, checked before they are believed.

A model call has been paid for by the time its usage arrives, so a bad count never stops the call
from being recorded: :func:`recordable_usage` keeps what is believable and drops the rest, and
:func:`check_usage` refuses the answer (:class:`UsageRejectedError`) when a count is not a
whole number from 0 to :data:`MAX_TOKENS_PER_CALL`.
"""

from dataclasses import replace

from idempotent_jobs.core.error_text import safe_text
from idempotent_jobs.core.errors import UsageRejectedError
from idempotent_jobs.core.records import ModelUsage

#: More tokens than any model reads or writes in one call (context windows are ~10^6-10^7): a
#: count above this is a provider's bug or a hostile answer, not a cost.
MAX_TOKENS_PER_CALL = 1_000_000_000
_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
)
#: Each part and the whole it is part of: a part larger than its whole is not believable.
_PARTS = (
    (("cache_read_tokens", "cache_write_tokens"), "input_tokens"),
    (("cache_write_1h_tokens",), "cache_write_tokens"),
    (("reasoning_tokens",), "output_tokens"),
)


def _problem(name: str, value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be a whole number, got {safe_text(repr(value), 80)}"
    if value < 0:
        return f"{name} must not be negative, got {value:,}"
    if value > MAX_TOKENS_PER_CALL:
        return f"{name} is {value:,}, over {MAX_TOKENS_PER_CALL:,} for one call"
    return None


def _part_problems(usage: ModelUsage) -> list[tuple[tuple[str, ...], str]]:
    """The parts (cache reads and writes, reasoning) that add up to more than their whole."""
    found: list[tuple[tuple[str, ...], str]] = []
    for parts, whole in _PARTS:
        total = getattr(usage, whole)
        counted = [getattr(usage, part) for part in parts]
        if total is not None and sum(c for c in counted if isinstance(c, int)) > total:
            found.append((parts, whole))
    return found


def recordable_usage(usage: ModelUsage | None) -> ModelUsage | None:
    """``usage`` with every count that is not believable left out (``None``): what is stored.
    Parts that add up to more than their whole are left out, the whole kept."""
    if usage is None:
        return None
    if not isinstance(usage, ModelUsage):
        return None
    kept = {name: None for name in _COUNTS if _problem(name, getattr(usage, name)) is not None}
    usage = replace(usage, **kept) if kept else usage
    dropped = {part: None for parts, _ in _part_problems(usage) for part in parts}
    return replace(usage, **dropped) if dropped else usage


def check_usage(usage: object) -> ModelUsage | None:
    """``usage`` if every count is believable; else raise :class:`UsageRejectedError` carrying
    the counts that can be recorded."""
    if usage is None:
        return None
    if not isinstance(usage, ModelUsage):
        raise UsageRejectedError(
            f"usage must be a ModelUsage, got {type(usage).__name__}", recorded=None
        )
    problems = [p for name in _COUNTS if (p := _problem(name, getattr(usage, name)))]
    if not problems:
        problems = [
            f"{' + '.join(parts)} is more than {whole}" for parts, whole in _part_problems(usage)
        ]
    if problems:
        raise UsageRejectedError(
            "the provider's usage is not believable: " + "; ".join(problems),
            recorded=recordable_usage(usage),
        )
    return usage
