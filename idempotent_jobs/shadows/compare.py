"""Comparing a shadow's answer with the accepted one: the job's own scorer, or field by field."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """``agree`` or ``differ``, a score from 0 to 1 when there is one, and what differs."""

    verdict: str
    score: float | None = None
    detail: dict[str, Any] | None = None


def compare_fields(accepted: Mapping[str, Any], new: Mapping[str, Any]) -> Verdict:
    """The default comparison of structured answers: equal field by field (text compared with
    its surrounding spaces stripped). The score is the share of fields that agree; the detail
    names the fields that differ, with both values."""
    fields = sorted(set(accepted) | set(new))
    differ = {
        name: {"accepted": accepted.get(name), "new": new.get(name)}
        for name in fields
        if _norm(accepted.get(name)) != _norm(new.get(name))
    }
    score = 1.0 - len(differ) / len(fields) if fields else 1.0
    return Verdict("differ" if differ else "agree", score, {"fields": differ} if differ else None)


def _norm(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def judge(
    compare: Callable[[JSONDict, JSONDict], object] | None,
    accepted: JSONDict,
    new: JSONDict,
    agree_score: float = 1.0,
) -> Verdict:
    """The verdict of ``compare(accepted, new)`` (the default field-by-field comparison when
    ``None``): a bool, a score from 0 to 1 (agreeing from ``agree_score``), ``"agree"`` or
    ``"differ"``, a dict with ``verdict`` and/or ``score`` (and ``detail``), or a
    :class:`Verdict`. Anything else is refused, naming the scorer."""
    if compare is None:
        found = compare_fields(accepted, new)
        if found.verdict == "differ" and found.score is not None and found.score >= agree_score:
            return Verdict("agree", found.score, found.detail)
        return found
    said = compare(accepted, new)
    if isinstance(said, Verdict):
        return said
    if isinstance(said, bool):
        return Verdict("agree" if said else "differ", 1.0 if said else 0.0)
    if isinstance(said, int | float):
        score = float(said)
        if not 0.0 <= score <= 1.0:
            raise InvalidInputError("compare", f"a score must be from 0 to 1, got {said!r}")
        return Verdict("agree" if score >= agree_score else "differ", score)
    if isinstance(said, str) and said in ("agree", "differ"):
        return Verdict(said)
    if isinstance(said, Mapping):
        given = said.get("score")
        verdict = said.get("verdict")
        if verdict is None and isinstance(given, int | float):
            verdict = "agree" if float(given) >= agree_score else "differ"
        if verdict in ("agree", "differ"):
            detail = said.get("detail")
            return Verdict(
                str(verdict),
                float(given) if isinstance(given, int | float) else None,
                dict(detail) if isinstance(detail, Mapping) else None,
            )
    raise InvalidInputError(
        "compare",
        f"must return a bool, a score from 0 to 1, 'agree'/'differ' or a dict with them; "
        f"got {type(said).__name__}",
    )
