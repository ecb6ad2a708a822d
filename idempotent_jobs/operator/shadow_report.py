"""A shadow's comparison as a person reads it: the summary and the differing answers side by
side, in the terminal (:func:`shown`) or as a Markdown or HTML file (:func:`render_report`).
Every text from a model or a run is escaped for where it goes."""

import html as html_text
import json
from typing import Any

from idempotent_jobs.operator.render import escape_controls, table
from idempotent_jobs.shadows.report import summary_text


def summary_lines(row: dict[str, Any]) -> list[str]:
    """The shadow's summary (:func:`summary_text`), safe for a terminal."""
    return [escape_controls(line) for line in summary_text(row)]


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
        escaped = [tuple(escape_controls(str(cell)) for cell in row) for row in rows]
        lines.append(table(["run", "verdict", "score", "accepted", "new"], escaped))
    return "\n".join(lines)


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
