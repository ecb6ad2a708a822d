"""A shadow of a new version, end to end, as docs/shadow.md shows it.

    python docs/examples/shadow_session.py     # needs IDEMPOTENT_JOBS_DATABASE_URL (a ledger)

A job labels support tickets per team and day. 40 runs were computed and delivered at v1.
v2 changes the prompt; it is defined beside v1 (same identity job name), ``gated``, so its
schedule delivers nothing until a shadow of it meets the job's rule or is promoted. The
session: ``shadow start`` (through the batch lane), ``shadow show`` with a Markdown report,
``shadow promote --revise`` and ``outbox deliver``. The provider is a local fake of OpenAI's
Batch API (the tests'), so nothing is paid; point the model step's ``base_url`` at OpenAI to
run it for real.
"""

import io
import json
import os
import sys
from contextlib import redirect_stdout
from functools import partial
from pathlib import Path
from typing import Any

import dagster as dg

from idempotent_jobs import (
    LedgerAdmin,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    RunLedger,
    run_idempotent,
)
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import (
    IdempotentJobSpec,
    OpenAICompatibleModel,
    RunLedgerResource,
    ShadowRule,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs.operator.cli import main as cli

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["bug", "billing", "question"]}},
    "required": ["label"],
}
WINDOW = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-12-01")
TEAMS = ["emea", "amer", "apac", "nordics", "iberia"]


class Tickets(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        day = identity.scheduled_at.day
        text = "the invoice is wrong" if day % 4 else "the export crashes on the invoice page"
        return {"tickets": [f"{identity.subject_id} ticket of day {day}: {text}"]}


def has_label(output: dict[str, Any]) -> bool:
    return output.get("label") in ("bug", "billing", "question")


def same_label(accepted: dict[str, Any], new: dict[str, Any]) -> bool:
    """The job's scorer: a shadow's answer agrees when it gives the same label."""
    return accepted.get("label") == new.get("label")


V1 = IdempotentJobSpec(
    name="ticket_labels",
    identity_job_name="ticket-labels",
    version="v1",
    window=WINDOW,
    subjects=TEAMS,
    prompt="Label the tickets: bug, billing or question.",
    validate=has_label,
)
V2 = IdempotentJobSpec(
    name="ticket_labels_v2",
    identity_job_name="ticket-labels",  # the same job: its runs are shadowed
    version="v2",
    window=WINDOW,
    subjects=TEAMS,
    prompt="Label the tickets: bug, billing or question. A crash is a bug.",
    model="model_v2",
    validate=has_label,
    compare=same_label,
    shadow_rule=ShadowRule(min_agreement=0.7, max_invalid=0),
    gated=True,  # its schedule delivers once a shadow of it meets the rule or is promoted
)
JOB_V1, SCHEDULE_V1 = build_idempotent_job(V1)
JOB_V2, SCHEDULE_V2 = build_idempotent_job(V2)


def _model() -> OpenAICompatibleModel:
    return OpenAICompatibleModel(
        model="gpt-4o-mini",
        api_key="sk-local-fake",
        base_url=dg.EnvVar("SHADOW_DOC_FAKE_URL"),
        output_schema="shadow_session:LABEL",
    )


defs = dg.Definitions(
    jobs=[JOB_V1, JOB_V2],
    schedules=[SCHEDULE_V1, SCHEDULE_V2],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "collector": Tickets(),
        "model": _model(),
        "model_v2": _model(),
        "report_file": JsonLinesChannel(path=dg.EnvVar("SHADOW_DOC_NOTES")),
    },
)


def _v2_answer(request: Any) -> Any:
    """v2 calls a crash a bug; v1 labelled every ticket billing."""
    from testkit.fake_providers import Answer

    label = "bug" if "crashes" in json.dumps(request.body) else "billing"
    return Answer(json.dumps({"label": label}), 412, 6)


def _say(*argv: str) -> None:
    shown = " ".join("<shadow>" if a.startswith("sh-") else a for a in argv)
    print(f"\n$ idempotent-jobs {shown}", flush=True)
    if cli(["-f", __file__, *argv]) != 0:
        raise SystemExit(f"idempotent-jobs {shown} failed")
    sys.stdout.flush()


def _deliver() -> None:
    """``outbox deliver``, its table of keys summed up in one line."""
    print("\n$ idempotent-jobs outbox deliver")
    out = io.StringIO()
    with redirect_stdout(out):
        if cli(["-f", __file__, "outbox", "deliver", "--limit", "1000", "--json"]) != 0:
            raise SystemExit("idempotent-jobs outbox deliver failed")
    delivered = json.loads(out.getvalue())["delivered"]
    revised = sum(1 for row in delivered if row["revision"])
    print(f"{len(delivered)} delivered, {revised} under a revision's key (<run>:report_file:r1)")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's testkit
    from testkit.fake_providers import FakeProviders

    home = Path(os.environ.get("IDEMPOTENT_JOBS_HOME", "."))
    notes = home / "shadow_session.jsonl"
    notes.unlink(missing_ok=True)
    os.environ["SHADOW_DOC_NOTES"] = str(notes)
    with FakeProviders(default=_v2_answer) as fake:
        os.environ["SHADOW_DOC_FAKE_URL"] = fake.openai_url
        url = os.environ[DATABASE_URL_ENV]
        with LedgerAdmin(url) as admin:
            admin.set_price("gpt-4o-mini", "0.15", "0.60")
            admin.set_price("gpt-4o-mini", "0.075", "0.30", tier="batch")
        # 40 runs at v1 (8 days of 5 teams), each answered "billing" and delivered once.
        keys = [f"{team}|2026-11-{day:02d}" for day in range(1, 9) for team in TEAMS]
        with RunLedger(url) as ledger:
            for key in keys:
                identity = V1.identity_for(key)
                run_idempotent(
                    ledger,
                    identity,
                    collect=Tickets().collect,
                    transform=lambda raw: ModelAnswer(
                        {"label": "billing"}, ModelUsage("gpt-4o-mini", 412, 6)
                    ),
                    notifications=partial(V1.notifications, identity),
                )
        _deliver()
        _say(
            "shadow",
            "start",
            "--job",
            "ticket_labels",
            "--version",
            "v2",
            "--wait",
            "--poll-seconds",
            "0.2",
        )
        with LedgerAdmin(url) as admin:
            [shadow] = admin.shadows("ticket-labels")
        shadow_id = str(shadow["shadow_id"])
        _say("shadow", "show", shadow_id, "--limit", "3", "--report", "shadow-report.md")
        print("\n$ cat shadow-report.md | head -12")
        print("\n".join(Path("shadow-report.md").read_text().splitlines()[:12]))
        _say("shadow", "promote", shadow_id, "--revise")
        _deliver()
        _say("shadow", "list")
        sent = [json.loads(line)["key"] for line in notes.read_text().splitlines()]
        print(
            f"\nnotifications: {len(sent)} in all, "
            f"{sum(1 for k in sent if k.endswith(':r1'))} under a revision's key"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
