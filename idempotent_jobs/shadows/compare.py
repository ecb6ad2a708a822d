"""Comparing a shadow's answers with the accepted ones (the job's own scorer, or field by
field), item by item under the shadow's lease, and the summary of the comparison."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import ShadowLease
from idempotent_jobs.shadows.job import ShadowSteps

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


#: Renew the shadow's lease every this many items judged.
_RENEW_EVERY = 100


def compare(ledger: RunLedger, steps: ShadowSteps, lease: ShadowLease, row: dict[str, Any]) -> None:
    """Judge every item not judged yet, then mark the shadow compared with its summary."""
    items = ledger.shadow_items(lease.shadow_id)
    for n, item in enumerate(items, 1):
        if n % _RENEW_EVERY == 0:
            ledger.renew_shadow(lease)
        if item["verdict"] is not None:
            continue
        verdict, score, detail = _verdict(steps, item)
        ledger.judge_shadow_item(lease, item["run_id"], verdict, score, detail)
    summary = summarise(ledger.shadow_items(lease.shadow_id))
    ledger.shadow_to(lease, "compared", ["collected"], summary=summary)


def _verdict(
    steps: ShadowSteps, item: dict[str, Any]
) -> tuple[str, float | None, dict[str, Any] | None]:
    if item["state"] in ("missing", "failed"):
        return str(item["state"]), None, None
    if not item["valid"] or item["answer"] is None:
        return "invalid", None, {"error": item["error"]}
    if item["accepted"] is None:  # a run with no accepted answer (it failed): nothing to compare
        return "new", None, None
    try:
        found = judge(
            steps.compare,
            dict(item["accepted"] or {}),
            dict(item["answer"]),
            steps.rule.agree_score,
        )
    except Exception as exc:  # noqa: BLE001 - a scorer that raises: that item differs
        return "differ", None, {"scorer_error": describe_error(exc)[:500]}
    return found.verdict, found.score, found.detail


def summarise(items: list[dict[str, Any]]) -> dict[str, Any]:
    """How many agree, differ, are new (no accepted answer to compare), invalid, failed or
    missing; the agreement among answered runs that had an accepted answer; and the cost per
    run, old (each run's accepted answer's calls) and new (the shadow's calls), in money and
    tokens."""
    counts = {v: 0 for v in ("agree", "differ", "new", "invalid", "failed", "missing")}
    for item in items:
        counts[str(item["verdict"] or "missing")] += 1
    judged = counts["agree"] + counts["differ"] + counts["invalid"]  # against an answer
    new_money = [item["money"] for item in items if item["money"] is not None]
    old_money = [item["run_money"] for item in items if item["run_money"] is not None]
    new_tokens = [
        (item["input_tokens"] or 0) + (item["output_tokens"] or 0)
        for item in items
        if item["call_id"] is not None
    ]
    old_tokens = [int(item["run_tokens"]) for item in items if item["run_tokens"] is not None]
    return {
        **counts,
        "runs": len(items),
        "compared": judged + counts["new"],
        # None: no run had an accepted answer to agree with (a re-run of failed runs).
        "agreement": round(counts["agree"] / judged, 6) if judged else None,
        "money_per_run_old": _mean(old_money),
        "money_per_run_new": _mean(new_money),
        "tokens_per_run_old": _mean(old_tokens),
        "tokens_per_run_new": _mean(new_tokens),
        "money_new": str(sum(new_money, Decimal(0))),
    }


def _mean(values: list[Any]) -> str | None:
    if not values:
        return None
    total = sum((Decimal(str(v)) for v in values), Decimal(0))
    return str(round(total / len(values), 8))
