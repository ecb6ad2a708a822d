"""A shadow as a team runs it, from outside this repository: a project of its own (a tmp folder
with ``defs.py``: a job at v1 that delivers, and its v2 beside it, gated, with another prompt
and model step), 200 runs completed and delivered at v1, then the command line: ``shadow
start`` of v2 through the fake OpenAI Batch API, ``shadow show`` (with a Markdown report),
``shadow promote --revise`` and ``outbox deliver``. Then: one provider batch; every shadow call
paid once and none delivered before the promotion; each changed run delivered once more, with
its revision's key, and no unchanged run; the budget's counters equal the calls' money; the
gated v2 schedule skipped (with the reason) until the promotion, then requesting runs."""

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest

from idempotent_jobs import Budget, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.operator.cli import main as cli
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Request

pytestmark = [pytest.mark.slow]

DEFS = """
from typing import Any

import dagster as dg

from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.dagster import (
    IdempotentJobSpec, OpenAICompatibleModel, RunLedgerResource, ShadowRule,
    build_idempotent_job, build_shadow_sensor,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel

LABEL = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
WINDOW = dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-12-11")
SUBJECTS = ["emea", "amer", "apac", "nordics", "iberia"]


class Tickets(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"tickets": [f"{identity.subject_id} {identity.scheduled_at:%Y-%m-%d}"]}


def same_label(accepted: dict[str, Any], new: dict[str, Any]) -> bool:
    return accepted.get("label") == new.get("label")


V1 = IdempotentJobSpec(
    name="labels", identity_job_name="team-labels", version="v1", window=WINDOW,
    subjects=SUBJECTS, prompt="Label the tickets.", channels=["notices"],
    validate=lambda output: bool(output.get("label")),
)
V2 = IdempotentJobSpec(
    name="labels_v2", identity_job_name="team-labels", version="v2", window=WINDOW,
    subjects=SUBJECTS, prompt="Label the tickets, v2.", channels=["notices"], model="model_v2",
    validate=lambda output: bool(output.get("label")), compare=same_label, gated=True,
    shadow_rule=ShadowRule(min_agreement=0.7),
)
JOB_V1, SCHEDULE_V1 = build_idempotent_job(V1)
JOB_V2, SCHEDULE_V2 = build_idempotent_job(V2)
SENSOR_V2 = build_shadow_sensor(V2)

defs = dg.Definitions(
    jobs=[JOB_V1, JOB_V2],
    schedules=[SCHEDULE_V1, SCHEDULE_V2],
    sensors=[SENSOR_V2],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")),
        "collector": Tickets(),
        "model": OpenAICompatibleModel(
            model="gpt-4o-mini", api_key="sk-fake", base_url=dg.EnvVar("TEAM_FAKE_URL"),
            output_schema="defs:LABEL",
        ),
        "model_v2": OpenAICompatibleModel(
            model="gpt-4o-mini", api_key="sk-fake", base_url=dg.EnvVar("TEAM_FAKE_URL"),
            output_schema="defs:LABEL",
        ),
        "notices": JsonLinesChannel(path=dg.EnvVar("TEAM_NOTICES")),
    },
)
"""


def _v2_answer(request: Request) -> Answer:
    """v2 labels a day divisible by 4 `refund` (v1 said `billing` for every run)."""
    text = json.dumps(request.body)
    day = int(text.split(" 2026-")[1][3:5])
    return Answer(json.dumps({"label": "refund" if day % 4 == 0 else "billing"}), 412, 6)


@pytest.fixture
def project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str
) -> Iterator[tuple[Path, FakeProviders, Any]]:
    folder = tmp_path / "team-project"
    folder.mkdir()
    (folder / "defs.py").write_text(DEFS)
    with FakeProviders(default=_v2_answer) as fake:
        fake.batches.polls_to_complete = 2
        monkeypatch.setenv("TEAM_FAKE_URL", fake.openai_url)
        monkeypatch.setenv("TEAM_NOTICES", str(tmp_path / "notices.jsonl"))
        monkeypatch.setenv(DATABASE_URL_ENV, database)
        monkeypatch.chdir(folder)
        monkeypatch.syspath_prepend(str(folder))
        sys.modules.pop("defs", None)
        import defs  # type: ignore[import-not-found]  # the team's module, as the CLI loads it

        yield folder, fake, defs
        sys.modules.pop("defs", None)


def _notices(path: Path) -> list[str]:
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


def _cli(folder: Path, *args: str) -> None:
    assert cli(["-f", str(folder / "defs.py"), *args]) == 0


def _schedule_says(defs: Any, database: str) -> Any:
    from idempotent_jobs.dagster import RunLedgerResource

    with dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 12, 12, tzinfo=UTC),
        resources={"ledger": RunLedgerResource(database_url=database)},
        repository_def=defs.defs.get_repository_def(),
    ) as context:
        return defs.SCHEDULE_V2.evaluate_tick(context)


def _sensor_says(defs: Any, database: str) -> str:
    from idempotent_jobs.dagster import RunLedgerResource

    resources = {
        "ledger": RunLedgerResource(database_url=database),
        "model_v2": defs.defs.resources["model_v2"],
    }
    with dg.build_sensor_context(resources=resources, definitions=defs.defs) as context:
        said = defs.SENSOR_V2.evaluate_tick(context).skip_message
    assert isinstance(said, str)
    return said


def test_a_shadow_of_200_runs_is_compared_and_promoted_delivering_each_changed_run_once(
    project: tuple[Path, FakeProviders, Any],
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
    database: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, fake, defs = project
    spec = defs.V1
    operator.set_price("gpt-4o-mini", "0.15", "0.60")
    operator.set_price("gpt-4o-mini", "0.075", "0.30", tier="batch")
    keys = [
        f"{subject}|{window}"
        for window in spec.window.get_partition_keys(
            current_time=datetime(2026, 12, 12, tzinfo=UTC)
        )
        for subject in spec.subjects
    ]
    assert len(keys) == 200
    for key in keys:
        done = run_idempotent(
            ledger,
            spec.identity_for(key),
            collect=defs.Tickets().collect,
            transform=lambda raw: {"label": "billing"},
            notifications=partial(spec.notifications, spec.identity_for(key)),
            worker_id="v1",
        )
        assert done.executed
    # A money budget from here (v1's answers reported no usage: a budget would charge them
    # all its room).
    operator.set_budget(Budget(amount="1", unit="money", period="month"), job_name="team-labels")
    notices = tmp_path / "notices.jsonl"
    _cli(folder, "outbox", "deliver", "--limit", "1000")
    assert len(_notices(notices)) == 200
    gated = _schedule_says(defs, database)
    assert gated.skip_message and "version v2 is gated" in gated.skip_message
    capsys.readouterr()

    _cli(
        folder,
        "shadow",
        "start",
        "--job",
        "labels",
        "--version",
        "v2",
        "--wait",
        "--poll-seconds",
        "0.1",
        "--json",
    )
    started = json.loads(capsys.readouterr().out)
    shadow_id = started["shadow_id"]
    assert started["state"] == "compared" and started["lane"] == "batch"
    changed = {spec.identity_for(k).run_id for k in keys if int(k.split("|")[1][8:10]) % 4 == 0}
    summary = started["summary"]
    assert (summary["agree"], summary["differ"], summary["invalid"]) == (
        200 - len(changed),
        len(changed),
        0,
    )
    assert len(fake.batches.created["openai"]) == 1
    # Every shadow call paid once, at the batch tier; nothing delivered or accepted.
    calls = db.execute(
        "SELECT count(*), count(DISTINCT run_id), min(tier), max(tier), sum(money)"
        " FROM idempotent_jobs.model_calls WHERE shadow_id = %s",
        (shadow_id,),
    ).fetchone()
    assert calls is not None and calls[:4] == (200, 200, "batch", "batch") and calls[4] > 0
    assert len(_notices(notices)) == 200
    queued = db.execute("SELECT count(*) FROM idempotent_jobs.notification_outbox").fetchone()
    assert queued == (200,)

    # The same summary in the Dagster UI: the shadow sensor's tick; it meets the job's rule
    # (77.5% agree, 70% wanted), so the gate says v2 may deliver.
    said = _sensor_says(defs, database)
    assert f"compared 200: {200 - len(changed)} agree, {len(changed)} differ" in said
    assert "version v2 may deliver: its gate is open" in said

    report = tmp_path / "report.md"
    _cli(folder, "shadow", "show", shadow_id, "--report", str(report))
    shown = capsys.readouterr().out
    assert f"{len(changed)} differ" in shown and "refund" in shown
    assert report.read_text().count("| differ |") == len(changed)

    _cli(folder, "shadow", "promote", shadow_id, "--revise")
    assert f"revised {len(changed)} changed run(s)" in capsys.readouterr().out
    _cli(folder, "outbox", "deliver", "--limit", "1000")
    delivered = _notices(notices)
    assert len(delivered) == 200 + len(changed)
    assert sorted(delivered[200:]) == sorted(f"{run_id}:notices:r1" for run_id in changed)
    assert len(set(delivered)) == len(delivered)
    # The promotion called no model: the shadow's calls are still the only ones it paid for.
    after = db.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE shadow_id = %s", (shadow_id,)
    ).fetchone()
    assert after == (200,)
    # One money: the budget's counter is the calls' money, under its amount, nothing held.
    [standing] = operator.budgets("team-labels")
    money = db.execute("SELECT sum(money) FROM idempotent_jobs.model_calls").fetchone()
    assert money is not None and standing.spent == money[0] <= Decimal(1)
    assert standing.reserved == 0
    # The gate opened: the v2 schedule requests the last window's runs.
    opened = _schedule_says(defs, database)
    assert opened.skip_message is None and len(opened.run_requests or []) == 5


def test_a_version_no_spec_defines_is_the_jobs_spec_with_another_model(
    project: tuple[Path, FakeProviders, Any],
    ledger: HarnessLedger,
    db: psycopg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, fake, defs = project
    spec = defs.V1
    for key in ("emea|2026-11-04", "amer|2026-11-04", "apac|2026-11-05"):
        run_idempotent(
            ledger,
            spec.identity_for(key),
            collect=defs.Tickets().collect,
            transform=lambda raw: {"label": "billing"},
            worker_id="v1",
        )
    # v2 is a spec's: it says its own model and prompt.
    assert (
        cli(
            [
                "-f",
                str(folder / "defs.py"),
                "shadow",
                "start",
                "--job",
                "labels",
                "--version",
                "v2",
                "--model",
                "gpt-4.1-mini",
            ]
        )
        == 2
    )
    assert "defines version v2" in capsys.readouterr().err
    _cli(
        folder,
        "shadow",
        "start",
        "--job",
        "labels",
        "--version",
        "v3",
        "--model",
        "gpt-4.1-mini",
        "--wait",
        "--poll-seconds",
        "0.1",
        "--json",
    )
    started = json.loads(capsys.readouterr().out)
    assert started["state"] == "compared" and started["config_parts"]["model"] == "gpt-4.1-mini"
    assert started["summary"]["differ"] == 2  # the 4th is a day divisible by 4: refund
    models = db.execute(
        "SELECT DISTINCT requested_model FROM idempotent_jobs.model_calls WHERE shadow_id = %s",
        (started["shadow_id"],),
    ).fetchall()
    assert models == [("gpt-4.1-mini",)]
    # Its promotion rebuilds the same version (the job's spec, that model) from the ledger.
    _cli(folder, "shadow", "promote", started["shadow_id"], "--revise", "--force")
    assert "revised 2 changed run(s)" in capsys.readouterr().out
