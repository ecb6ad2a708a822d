"""docs/your-own-job.md's create-dagster path, built from its own blocks outside the repository.

``create-dagster`` (at the Dagster version the package pins) makes the project, ``dg`` scaffolds
the package's component into it, the page's ``dg-file=`` blocks replace the template, and every
``bash dg-run`` (in the folder above) and ``bash dg-project`` (in the project) line runs as it
is, with the package installed as a wheel in a virtualenv of its own. Then: ``dg list
components`` shows the type, ``dg check defs`` refuses a wrong field naming it, and the ledger
holds one run, one model call and one webhook post per partition, however often each was
launched, by ``dg`` or by the CLI. In the same project, a model step of the package's own in
YAML (its prompt builder and schema relative to the component's folder) is checked by ``dg check
defs`` and answers through a fake provider, and a run ``idempotent-jobs launch`` started, failed
in its delivery, is re-executed from failure through the UI's GraphQL mutation.
"""

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.helpers import JsonApi
from idempotent_jobs_tests.installed_wheel import CHECKOUT
from idempotent_jobs_tests.system.test_quickstart import blocks
from testkit.fake_providers import Answer, FakeProviders

pytestmark = [pytest.mark.dagster_instance]

DOC = CHECKOUT / "docs" / "your-own-job.md"
SECTION = "## The create-dagster path"
ACCOUNTS = [{"id": "a1", "logins": 0}, {"id": "a2", "logins": 9}, {"id": "a3", "logins": 1}]
COMPONENT = "idempotent_jobs.dagster.IdempotentJob"

#: Added to the project's steps.py: a prompt builder and an output schema for a YAML model step.
YAML_MODEL_STEPS = """

from idempotent_jobs.models import Prompt

CHURN_SCHEMA = {
    "type": "object",
    "properties": {"at_risk": {"type": "array", "items": {"type": "string"}}},
    "required": ["at_risk"],
    "additionalProperties": False,
}


def churn_prompt(raw_input, context):
    return Prompt.of(system=context.instructions, user=json.dumps(raw_input))
"""
#: The model step of the package's own, in the component's YAML.
YAML_MODEL = """  model_step:
    type: OpenAICompatibleModel
    config:
      model: gpt-4o-mini
      api_key: {env: OPENAI_API_KEY}
      base_url: {env: OPENAI_BASE_URL}
      prompt: .steps:churn_prompt
      output_schema: .steps:CHURN_SCHEMA
      max_tokens: 200
"""
#: Run in the project's virtualenv: re-execute a failed run from failure through the UI's own
#: GraphQL mutation (the code location served as `dagster dev` serves it), and wait for it.
REEXECUTE = """
import json, sys
import dagster as dg
from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql
from idempotent_jobs.operator.code_location import load_workspace
from idempotent_jobs.operator.ui_launch import Launched, dequeue, served, wait_for

parent, partition, answer = sys.argv[1], sys.argv[2], sys.argv[3]
target = load_workspace().locations[0].target
with dg.DagsterInstance.get() as instance, served(target, instance) as context:
    result = execute_dagster_graphql(
        context.create_request_context(),
        LAUNCH_PIPELINE_REEXECUTION_MUTATION,
        {"reexecutionParams": {"parentRunId": parent, "strategy": "FROM_FAILURE"}},
    )
    launched = result.data["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    again = Launched(partition, launched["run"]["runId"], dg.DagsterRunStatus.QUEUED)
    dequeue(context, [again])
    [ended] = list(wait_for(instance, [again]))
    run = instance.get_run_by_id(ended.run_id)
    steps = sorted(run.step_keys_to_execute or [])
with open(answer, "w", encoding="utf-8") as out:  # stdout carries the served location's logs
    json.dump({"status": ended.status.value, "parent": run.parent_run_id, "steps": steps}, out)
"""


@pytest.fixture
def servers() -> Iterator[tuple[JsonApi, Receiver]]:
    api, receiver = JsonApi(ACCOUNTS, "/api/accounts"), Receiver()
    try:
        yield api, receiver
    finally:
        api.close()
        receiver.close()


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_create_dagster_path_runs_as_written(
    installed: Path,
    servers: tuple[JsonApi, Receiver],
    fresh_database: str,
    tmp_path: Path,
) -> None:
    api, receiver = servers
    text = DOC.read_text(encoding="utf-8")
    parts = blocks(text[text.index(SECTION) :])
    base = tmp_path / "work"
    base.mkdir()
    project = base / "churn-alerts"
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        "PATH": f"{installed}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "VIRTUAL_ENV": str(installed.parent),
        "IDEMPOTENT_JOBS_DATABASE_URL": fresh_database,
        "DAGSTER_HOME": str(home),
        "ACCOUNTS_API_URL": api.url,
        "ALERTS_WEBHOOK_URL": receiver.url,
    }
    ran: list[str] = []
    for lang, info, body in parts:
        if info.startswith("dg-file="):
            target = project / info.removeprefix("dg-file=")
            assert target.is_file(), f"dg scaffold wrote no {target}"  # replaced, not added
            target.write_text(body, encoding="utf-8")
            continue
        if lang != "bash" or info not in ("dg-run", "dg-project"):
            continue
        for line in filter(str.strip, body.splitlines()):
            done = run(line, base if info == "dg-run" else project, env)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr[-3000:]}"
            ran.append(line)
    assert any(line.startswith("dg launch") for line in ran)
    assert any(line.startswith("dg check defs") for line in ran)

    listed = run("dg list components", project, env)
    assert listed.returncode == 0 and COMPONENT in listed.stdout, listed.stdout + listed.stderr

    with LedgerAdmin(fresh_database) as operator:
        runs = operator.list_runs(job_name="churn-alerts")
        assert sorted(r.subject_id for r in runs) == ["amer", "emea"]
        for record in runs:
            assert record.status == "completed"
            assert [c.outcome for c in operator.model_calls(record.run_id)] == ["accepted"]
            assert record.output == {"at_risk": ["a1", "a3"]}
            assert receiver.effects[f"{record.run_id}:alerts_webhook"] == 1
    assert sum(receiver.effects.values()) == 2
    assert len(api.asked) == 2  # collected once per partition

    # A wrong field is refused by `dg check defs`, naming it.
    defs_yaml = project / "src" / "churn_alerts" / "defs" / "churn_alerts" / "defs.yaml"
    good = defs_yaml.read_text(encoding="utf-8")
    defs_yaml.write_text(re.sub(r"\bsubjects:", "subjekts:", good), encoding="utf-8")
    checked = run("dg check defs", project, env)
    assert checked.returncode != 0
    assert "subjekts" in checked.stdout + checked.stderr
    defs_yaml.write_text(good.replace("every: day", "every: fortnight"), encoding="utf-8")
    checked = run("dg check defs", project, env)
    assert checked.returncode != 0 and "fortnight" in checked.stdout + checked.stderr

    # A model step of the package's own in YAML: checked by `dg check defs` (a typo in its
    # prompt reference names the field), then answering through a fake provider.
    steps = defs_yaml.parent / "steps.py"
    steps.write_text(steps.read_text(encoding="utf-8") + YAML_MODEL_STEPS, encoding="utf-8")
    with_model = good.replace("version: v1", "version: v2").replace(
        "  model_step: {type: .steps.ChurnScorer}\n", YAML_MODEL
    )
    assert with_model != good.replace("version: v1", "version: v2")
    with FakeProviders(default=lambda request: Answer('{"at_risk": ["a2"]}', 30, 6)) as fake:
        env = {**env, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.openai_url}
        defs_yaml.write_text(with_model.replace(".steps:churn_prompt", ".steps:churn_promt"))
        checked = run("dg check defs", project, env)
        assert checked.returncode != 0, checked.stdout
        assert "churn_promt" in checked.stdout + checked.stderr
        defs_yaml.write_text(with_model, encoding="utf-8")
        checked = run("dg check defs", project, env)
        assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
        launched = run(
            "idempotent-jobs launch --wait --json --job churn_alerts 'emea|2026-11-03'",
            project,
            env,
        )
        assert launched.returncode == 0, launched.stdout + launched.stderr[-3000:]
        assert len(fake.requests) == 1 and fake.requests[0].body["model"] == "gpt-4o-mini"

        # A launched run that failed in its delivery, re-executed from failure as the UI does.
        receiver.faults = ["500"] * 100
        failed = run(
            "idempotent-jobs launch --wait --json --job churn_alerts 'amer|2026-11-03'",
            project,
            env,
        )
        assert failed.returncode == 1, failed.stdout + failed.stderr[-3000:]
        [row] = json.loads(failed.stdout)
        assert "deliver" in row["result"], row
        receiver.faults = []
        script = tmp_path / "reexecute.py"
        script.write_text(REEXECUTE, encoding="utf-8")
        answer = tmp_path / "reexecuted.json"
        again = run(
            f"{installed / 'python'} {script} {row['dagster_run_id']} 'amer|2026-11-03' {answer}",
            project,
            env,
        )
        assert again.returncode == 0, again.stdout + again.stderr[-3000:]
        ended = json.loads(answer.read_text(encoding="utf-8"))
        assert ended["status"] == "SUCCESS" and ended["parent"] == row["dagster_run_id"]
        assert ended["steps"] and all("deliver" in step for step in ended["steps"]), ended
        assert len(fake.requests) == 2  # re-executed from failure: no model call again

    with LedgerAdmin(fresh_database) as operator:
        runs = operator.list_runs(job_name="churn-alerts")
        answered = [r for r in runs if r.version == "v2"]
        assert sorted(r.subject_id for r in answered) == ["amer", "emea"]
        for record in answered:
            assert record.status == "completed" and record.output == {"at_risk": ["a2"]}
            calls = operator.model_calls(record.run_id)
            assert [(c.outcome, c.requested_model) for c in calls] == [("accepted", "gpt-4o-mini")]
            assert receiver.effects[f"{record.run_id}:alerts_webhook"] == 1
