"""A shadow's comparison as a person reads it: the summary and the differing answers side by
side, in the terminal (:func:`shown`) or as a Markdown or HTML file (:func:`render_report`).
Every text from a model or a run is escaped for where it goes."""

import html as html_text
import json
from typing import Any

from idempotent_jobs.operator.render import escape_controls, table

_VERDICTS = ("agree", "differ", "invalid", "failed", "missing")


def _money(value: Any, currency: str | None) -> str:
    return "-" if value is None else f"{value} {currency or ''}".strip()


def summary_lines(row: dict[str, Any]) -> list[str]:
    """The shadow's summary: versions, state, counts by verdict, agreement, cost per run."""
    summary = row.get("summary") or {}
    currency = row.get("currency")
    lines = [
        f"shadow {row['shadow_id']}: job {row['job_name']}, version {row['version']} on "
        f"{row.get('items', 0)} run(s) at {row['baseline_version']}, {row['lane']} lane, "
        f"{row['state']}",
    ]
    if summary:
        counts = ", ".join(f"{summary.get(v, 0)} {v}" for v in _VERDICTS)
        lines.append(
            f"compared {summary.get('compared', 0)}: {counts}; agreement "
            f"{float(summary.get('agreement') or 0):.1%}"
        )
        lines.append(
            f"cost per run: old {_money(summary.get('money_per_run_old'), currency)} "
            f"({summary.get('tokens_per_run_old') or '-'} tokens), new "
            f"{_money(summary.get('money_per_run_new'), currency)} "
            f"({summary.get('tokens_per_run_new') or '-'} tokens)"
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
    return [escape_controls(line) for line in lines]


def _brief(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if value is not None else "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _key(item: dict[str, Any]) -> str:
    when = item["scheduled_at"]
    return f"{item['subject_id']} {when:%Y-%m-%d %H:%M}"


def shown(row: dict[str, Any], items: list[dict[str, Any]], limit: int) -> str:
    """The summary, then up to ``limit`` items that did not agree, their answers side by side."""
    lines = summary_lines(row)
    odd = [i for i in items if i["verdict"] not in (None, "agree")][:limit]
    if odd:
        rows = [
            (
                _key(i),
                i["verdict"],
                "-" if i["score"] is None else f"{i['score']:.2f}",
                _brief(i["accepted"]),
                _brief(i["answer"]) if i["answer"] is not None else (i["error"] or "-")[:60],
            )
            for i in odd
        ]
        lines.append(table(["run", "verdict", "score", "accepted", "new"], rows))
    return "\n".join(escape_controls(line) for line in lines)


def render_report(row: dict[str, Any], items: list[dict[str, Any]], *, html: bool) -> str:
    """The whole comparison as a file: the summary, then every item that did not agree, with
    the accepted and the new answer side by side (and the fields that differ)."""
    odd = [i for i in items if i["verdict"] not in (None, "agree")]
    if html:
        return _html(row, odd)
    out = [f"# Shadow {row['shadow_id']}", ""]
    out += [f"- {line}" for line in summary_lines(row)]
    out += ["", f"## Answers that did not agree ({len(odd)})", ""]
    if odd:
        out += ["| run | verdict | score | accepted | new |", "|---|---|---|---|---|"]
        for i in odd:
            new = _cell(i["answer"]) if i["answer"] is not None else _md(i["error"] or "-")
            score = "-" if i["score"] is None else f"{i['score']:.2f}"
            out.append(
                f"| {_md(_key(i))} | {i['verdict']} | {score} | {_cell(i['accepted'])} | {new} |"
            )
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return escape_controls(text).replace("|", "\\|").replace("\n", " ")


def _cell(value: Any) -> str:
    return _md(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _html(row: dict[str, Any], odd: list[dict[str, Any]]) -> str:
    esc = html_text.escape
    rows = []
    for i in odd:
        new = i["answer"] if i["answer"] is not None else i["error"]
        rows.append(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td><td><pre>{}</pre></td>"
            "</tr>".format(
                esc(_key(i)),
                esc(str(i["verdict"])),
                "-" if i["score"] is None else f"{i['score']:.2f}",
                esc(json.dumps(i["accepted"], ensure_ascii=False, indent=2, sort_keys=True)),
                esc(json.dumps(new, ensure_ascii=False, indent=2, sort_keys=True)),
            )
        )
    summary = "".join(f"<li>{esc(line)}</li>" for line in summary_lines(row))
    return (
        "<!doctype html><meta charset='utf-8'>"
        f"<title>Shadow {esc(row['shadow_id'])}</title>"
        "<style>body{font-family:sans-serif}td{vertical-align:top;border-top:1px solid #ccc}"
        "pre{white-space:pre-wrap;margin:0}</style>"
        f"<h1>Shadow {esc(row['shadow_id'])}</h1><ul>{summary}</ul>"
        f"<h2>Answers that did not agree ({len(odd)})</h2>"
        "<table><tr><th>run</th><th>verdict</th><th>score</th><th>accepted</th><th>new</th></tr>"
        + "".join(rows)
        + "</table>\n"
    )
