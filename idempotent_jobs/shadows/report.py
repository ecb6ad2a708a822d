"""A shadow's summary in a few lines (versions, state, counts by verdict, agreement, cost per
run old and new, what it paid), as ``shadow show`` prints it and the shadow sensor's tick says
it in the Dagster UI."""

from decimal import Decimal
from typing import Any

_VERDICTS = ("agree", "differ", "new", "invalid", "failed", "missing")


def _money(value: Any, currency: str | None) -> str:
    if value is None:
        return "-"
    amount = Decimal(str(value)).normalize()
    return f"{amount:f} {currency or ''}".strip()


def _share(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1%}"


def _tokens(value: Any) -> str:
    return "-" if value is None else f"{Decimal(str(value)):.0f}"


def summary_text(row: dict[str, Any]) -> list[str]:
    """The shadow's summary: versions, state, counts by verdict, agreement, cost per run."""
    summary = row.get("summary") or {}
    currency = row.get("currency")
    lines = [
        f"shadow {row['shadow_id']}: job {row['job_name']}, version {row['version']} on "
        f"{row.get('items', 0)} run(s) at {row['baseline_version']}, {row['lane']} lane, "
        f"{row['state']}",
    ]
    if summary:
        counts = ", ".join(
            f"{summary.get(v, 0)} {v}" for v in _VERDICTS if v != "new" or summary.get(v)
        )
        lines.append(
            f"compared {summary.get('compared', 0)}: {counts}; agreement "
            f"{_share(summary.get('agreement'))}"
        )
        lines.append(
            f"cost per run: old {_money(summary.get('money_per_run_old'), currency)} "
            f"({_tokens(summary.get('tokens_per_run_old'))} tokens), new "
            f"{_money(summary.get('money_per_run_new'), currency)} "
            f"({_tokens(summary.get('tokens_per_run_new'))} tokens)"
        )
    else:
        states = ", ".join(f"{n} {s}" for s, n in sorted((row.get("item_states") or {}).items()))
        lines.append(f"items: {states or 'none'}")
    unpriced = int(row.get("unpriced") or 0)
    lines.append(
        f"paid: {row.get('calls', 0)} call(s), {_money(row.get('money'), currency)}"
        + (f" + {unpriced} unpriced" if unpriced else "")
        + (f" (budget {row['budget']})" if row.get("budget") is not None else "")
    )
    if row.get("error"):
        lines.append(f"error: {row['error']}")
    if row.get("promoted_at"):
        lines.append(f"promoted {row['promoted_at']:%Y-%m-%d %H:%M:%S} UTC")
    return lines
