"""Human tables and ``--json`` for the command line."""

import dataclasses
import json
import unicodedata
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from idempotent_jobs.core.json_values import UnreadableValue

# Characters a terminal may act on: C0 and C1 controls (ESC, BEL, CR, LF, CSI U+009B...), line
# and paragraph separators, and the bidirectional overrides and isolates that reorder text.
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI


def escape_controls(text: str) -> str:
    """``text`` with every character a terminal would act on written as a Python escape
    (``\\x1b``, ``\\n``, ``\\x9b``, ``\\u202e``), so text from a model, a worker or an operator
    cannot move the cursor, retitle the window or rewrite what is on screen."""
    if not any(_unsafe(ch) for ch in text):
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if _unsafe(ch) else ch for ch in text
    )


def plain(value: Any) -> Any:
    """A JSON-able copy of records (dataclasses), lists, dicts and datetimes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):  # money: exact, as text
        return str(value)
    return value


def money(amount: Decimal | float | None, currency: str = "", *, priced: bool = True) -> str:
    """``0.0123 USD`` (4 decimals; 6 below a hundredth), ``-`` when nothing had a price, and a
    ``+`` when some calls had none (the figure leaves them out)."""
    if amount is None:
        return "-"
    places = 6 if abs(float(amount)) < 0.01 else 4
    text = f"{float(amount):,.{places}f}"
    return f"{text}{'' if priced else '+'}{f' {currency}' if currency else ''}"


def human_bytes(size: int) -> str:
    """``512 B``, ``1.5 kB``, ``12.3 MB``, ``4.0 GB`` (powers of 1000)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def to_json(value: Any) -> str:
    return json.dumps(plain(value), indent=2, sort_keys=True, ensure_ascii=False)


def cell(value: Any, width: int = 80) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, UnreadableValue):
        text = f"(unreadable: {value.reason}; {value['bytes']} bytes stored)"
    elif isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    text = escape_controls(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned text table; an empty one says so."""
    if not rows:
        return "(none)"
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)
