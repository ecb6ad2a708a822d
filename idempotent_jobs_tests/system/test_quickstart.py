"""docs/your-own-job.md, built from its own code blocks in a folder outside the repository.

Every ``file=`` block is written as it is, every ``bash run`` block is run line by line (with
``<run-id>`` filled in) by the package installed as a wheel into a virtualenv of its own, and the
``sql`` block grants a worker role. A real Dagster instance on PostgreSQL (the page's own
``dagster.yaml``) records the runs. Then the ledger and the receiver are checked: one run, one
accepted call and one delivered notification per partition, a revision recomputed and notified
once under the ``:r1`` key, and the user's ``dagster.yaml`` unchanged.
"""

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.helpers import JsonApi
from idempotent_jobs_tests.installed_wheel import CHECKOUT
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders, Request

pytestmark = [pytest.mark.dagster_instance]

DOC = CHECKOUT / "docs" / "your-own-job.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LEADS = [{"id": 1, "note": "asked for a quote today"}, {"id": 2, "note": "just browsing"}]


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, info after it, body) of every fenced block, in order."""
    return [(lang, info.strip(), body) for lang, info, body in BLOCK.findall(text)]


#: The page's OpenAI model step, replaced by its Anthropic block for the other provider.
OPENAI_STEP = re.compile(r'^ +"lead_scorer": OpenAICompatibleModel\(\n.*?^ +\),\n', re.M | re.S)
#: The first answer misses the schema (no "reason"): it is repaired, and paid for twice.
OUTSIDE_THE_SCHEMA = Answer(json.dumps({"scores": [{"id": "1", "score": 90}]}), 300, 20)


def scored(request: Request) -> Answer:
    """A model that scores the leads it is shown, in either API's request format."""
    texts = [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in request.body["messages"]
    ]
    [shown] = [t for t in texts if t.startswith("Leads of region")]  # a repair turn repeats it
    leads = json.loads(shown.split("\n", 1)[1])
    scores = [
        {"id": str(lead["id"]), "score": 10 * len(lead["note"].split()), "reason": lead["note"]}
        for lead in leads
    ]
    return Answer(json.dumps({"scores": scores}), 320, 40)


def _emea_first_outside() -> Callable[[Request], Answer]:
    """``scored``, except emea's first request, which misses the schema (the launches run at
    once, so the first request of all may be either region's)."""
    missed: list[bool] = []

    def answer(request: Request) -> Answer:
        if "Leads of region emea" in json.dumps(request.body) and not missed:
            missed.append(True)
            return OUTSIDE_THE_SCHEMA
        return scored(request)

    return answer


@pytest.fixture
def servers() -> Iterator[tuple[JsonApi, Receiver, FakeProviders]]:
    api, receiver = JsonApi(LEADS, "/api/leads"), Receiver()
    provider = FakeProviders(default=_emea_first_outside())
    try:
        yield api, receiver, provider
    finally:
        api.close()
        receiver.close()
        provider.close()


@pytest.mark.parametrize("model_provider", ["openai", "anthropic"])
def test_the_quickstart_runs_as_written(
    model_provider: str,
    installed: Path,
    servers: tuple[JsonApi, Receiver, FakeProviders],
    fresh_database: str,
    server_url: str,
    tmp_path: Path,
) -> None:
    """With the page's OpenAI model step, every command; with its Anthropic block in its place,
    the runs (the operator commands are the same for both)."""
    api, receiver, provider = servers
    project = tmp_path / "leads"
    parts = blocks(DOC.read_text(encoding="utf-8"))
    files = {
        info.removeprefix("file="): body for _, info, body in parts if info.startswith("file=")
    }
    assert set(files) >= {"pyproject.toml", "leads/definitions.py", "leads/scoring.py"}
    if model_provider == "anthropic":
        [claude] = [body for _, info, body in parts if info == "provider=anthropic"]
        definitions = files["leads/definitions.py"]
        assert len(OPENAI_STEP.findall(definitions)) == 1
        files["leads/definitions.py"] = OPENAI_STEP.sub(lambda _: claude, definitions)
    for name, body in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(body, encoding="utf-8")
    user_yaml = (project / "dagster_home" / "dagster.yaml").read_bytes()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IDEMPOTENT_JOBS_DATABASE_URL": fresh_database,
        "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL": dagster_storage_url(fresh_database),
        "DAGSTER_HOME": str(project / "dagster_home"),
        "LEADS_API_URL": api.url,
        "SALES_WEBHOOK_URL": receiver.url,
        # The SDKs' own variables: the page's model steps name no URL.
        "OPENAI_API_KEY": "sk-test-quickstart",
        "OPENAI_BASE_URL": provider.openai_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-quickstart",
        "ANTHROPIC_BASE_URL": provider.anthropic_url,
    }
    commands = [
        line
        for lang, info, body in parts
        if lang == "bash" and info == "run"
        for line in body.splitlines()
        if line.strip()
    ]
    assert commands[0] == "idempotent-jobs migrate"
    if model_provider == "anthropic":  # the runs: migrate and the launches
        commands = [
            c
            for c in commands
            if c.startswith(("idempotent-jobs migrate", "idempotent-jobs launch"))
        ]
    run_id = ""
    for command in commands:
        if "<run-id>" in command:
            with LedgerAdmin(fresh_database) as operator:
                run_id = operator.list_runs(job_name="lead-scoring", subject_id="emea")[0].run_id
            command = command.replace("<run-id>", run_id[:12])
        done = subprocess.run(
            shlex.split(command),
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr[-3000:]}"
        if command.startswith("idempotent-jobs migrate"):
            [grant] = [body for lang, _, body in parts if lang == "sql"]
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute("DROP ROLE IF EXISTS leads_worker")
            with psycopg.connect(fresh_database, autocommit=True) as conn:
                conn.execute(grant)
            worker = {
                **env,
                "IDEMPOTENT_JOBS_DATABASE_URL": make_conninfo(fresh_database, user="leads_worker"),
            }
            doctor = subprocess.run(
                ["idempotent-jobs", "doctor"],
                cwd=project,
                env=worker,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            assert "ok: role leads_worker has every privilege workers need" in doctor.stdout

    assert {r.api for r in provider.requests} == {model_provider}
    asked = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}[model_provider]
    assert {r.body["model"] for r in provider.requests} == {asked}
    with LedgerAdmin(fresh_database) as operator:
        runs = {r.subject_id: r for r in operator.list_runs(job_name="lead-scoring")}
        assert sorted(runs) == ["amer", "emea"]
        emea_calls = operator.model_calls(runs["emea"].run_id)
        # Emea met the answer outside the schema at first: a repair turn, both paid.
        assert [(c.outcome, c.turn, c.tokens) for c in emea_calls[:2]] == [
            ("rejected", 1, 320),
            ("accepted", None, 360),
        ]
        assert all(c.requested_model == asked for c in emea_calls)
        assert [c.outcome for c in operator.model_calls(runs["amer"].run_id)] == ["accepted"]
        output = runs["amer"].output
        assert output is not None and output["scores"][0]["reason"] == LEADS[0]["note"]
        revised = runs["emea"] if model_provider == "openai" else None
        for run in runs.values():
            delivered = [o for o in operator.outbox(run.run_id) if o.delivered_at is not None]
            assert run.status == "completed"
            assert len(delivered) == (2 if run is revised else 1)
            assert receiver.effects[f"{run.run_id}:sales_webhook"] == 1
    if model_provider == "anthropic":
        assert sum(receiver.effects.values()) == 2
        assert len(provider.requests) == 3
        return
    assert revised is not None and revised.run_id == run_id and revised.revision == 1
    assert [c.outcome for c in operator.model_calls(run_id)][2:] == ["accepted"]  # the revision
    assert receiver.effects[f"{run_id}:sales_webhook:r1"] == 1
    assert sum(receiver.effects.values()) == 3
    assert len(api.asked) == 2  # collected once per partition: the revision kept its input
    assert (project / "dagster_home" / "dagster.yaml").read_bytes() == user_yaml
    with psycopg.connect(server_url, autocommit=True) as conn:
        with psycopg.connect(fresh_database, autocommit=True) as db:
            db.execute("DROP OWNED BY leads_worker")
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier("leads_worker")))


def test_the_installed_cli_runs_from_any_folder_given_the_url_and_the_location(
    installed: Path, database: str, tmp_path: Path
) -> None:
    """A pod, a cron job, a CI step: no pyproject.toml or workspace here or above, only the
    database URL and a code location, named each way the CLI takes one."""
    from idempotent_jobs_tests.system.test_outbox_ownership import DEFINITIONS, TEAMS, plant

    anywhere = tmp_path / "pod"
    (anywhere / "code").mkdir(parents=True)
    (anywhere / "code" / "pod_defs.py").write_text(DEFINITIONS.format(**TEAMS["a"]))
    (anywhere / "workspace-elsewhere.yaml").write_text(
        "load_from:\n  - python_file: {relative_path: code/pod_defs.py}\n"
    )
    receiver = Receiver()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IDEMPOTENT_JOBS_DATABASE_URL": database,
        TEAMS["a"]["variable"]: receiver.url,
    }
    with HarnessLedger(database) as ledger:
        keys = plant(ledger, TEAMS["a"]["identity"], days=1)
    commands = [
        ({}, ["runs", "list"]),
        ({}, ["-m", "pod_defs", "runs", "list", "--job", "weekly_report"]),
        ({}, ["-f", "code/pod_defs.py", "runs", "list", "--job", "weekly_report"]),
        (
            {"IDEMPOTENT_JOBS_CODE_LOCATION": "pod_defs:defs"},
            ["runs", "list", "--job", "weekly_report"],
        ),
        ({}, ["-w", "workspace-elsewhere.yaml", "outbox", "deliver"]),
        ({"IDEMPOTENT_JOBS_CODE_LOCATION": "pod_defs:defs"}, ["outbox", "deliver"]),
    ]
    for extra, argv in commands:
        done = subprocess.run(
            ["idempotent-jobs", *argv],
            cwd=anywhere,
            env={**env, **extra, "PYTHONPATH": str(anywhere / "code")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr[-3000:]}"
        assert "not inside a Dagster project" not in done.stderr
    assert set(receiver.effects) == set(keys)
    assert sorted(p.name for p in anywhere.iterdir()) == ["code", "workspace-elsewhere.yaml"]
    receiver.close()
