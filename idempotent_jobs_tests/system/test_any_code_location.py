"""The CLI on a job that is not in this repository: the ticket-triage example, copied into a
project folder of its own (``[tool.dagster]`` in its pyproject), with a Dagster instance whose
``dagster.yaml`` is the user's. Every command that needs jobs or channels finds them there."""

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.cli import main
from idempotent_jobs.operator.code_location import load_workspace
from idempotent_jobs.operator.location_targets import CODE_LOCATION_ENV
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.dagster.test_your_own_job import EXAMPLE, Helpdesk
from idempotent_jobs_tests.ledgers import HarnessLedger

PARTITIONS = ("support|2026-11-02", "sales|2026-11-02")
# The user's own instance configuration: the CLI must leave it as it is, byte for byte.
USER_DAGSTER_YAML = (
    "# my team's instance\n"
    "run_coordinator:\n"
    "  module: dagster.core.run_coordinator\n"
    "  class: QueuedRunCoordinator\n"
    "  config:\n"
    "    max_concurrent_runs: 3\n"
    "telemetry:\n"
    "  enabled: false\n"
)


@pytest.fixture
def project(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """A user's project outside the repository, the shell sitting in it."""
    folder = tmp_path / "triage-project"
    (folder / "src").mkdir(parents=True)
    module = f"triage_defs_{uuid.uuid4().hex[:8]}"  # a fresh import per test
    shutil.copyfile(EXAMPLE, folder / f"{module}.py")
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "triage"\n\n[tool.dagster]\nmodule_name = "{module}"\n'
    )
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(USER_DAGSTER_YAML)
    helpdesk, receiver = Helpdesk(), Receiver()
    for name, value in {
        "IDEMPOTENT_JOBS_DATABASE_URL": database,
        "HELPDESK_TICKETS_URL": helpdesk.url,
        "TRIAGE_WEBHOOK_URL": receiver.url,
        "DAGSTER_HOME": str(home),
        "IDEMPOTENT_JOBS_HOME": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(CODE_LOCATION_ENV, raising=False)
    monkeypatch.chdir(folder / "src")  # a subfolder: the project is found above it
    try:
        yield {"home": home, "receiver": receiver, "module": module, "folder": folder}
    finally:
        helpdesk.close()
        receiver.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.dagster_instance
def test_every_command_finds_the_users_job(
    project: dict[str, Any], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver: Receiver = project["receiver"]
    workspace = load_workspace()
    assert [s.name for s in workspace.specs] == ["ticket_triage"]
    assert project["module"] in workspace.describe()
    receiver.faults = ["500"] * 100  # the job's own delivery fails: the CLI delivers later
    with dg.DagsterInstance.get() as instance:
        job = workspace.locations[0].defs.resolve_job_def("ticket_triage")
        for key in PARTITIONS:
            result = job.execute_in_process(
                partition_key=key, instance=instance, raise_on_error=False
            )
            assert result.output_for_node("persist")  # the answer is in; only delivery failed
    receiver.faults = []

    code, out = cli(capsys, "runs", "list", "--job", "ticket_triage")
    assert code == 0, out
    assert "job: Dagster job ticket_triage (identity job ticket-triage)" in out
    assert out.count("ticket-triage") == 3  # the line above and two runs

    code, out = cli(capsys, "outbox", "deliver")
    assert code == 0, out
    assert out.count("delivered") == 2
    assert sorted(receiver.effects.values()) == [1, 1]

    code, out = cli(capsys, "reconcile", "--job", "ticket-triage")
    assert "job: identity job ticket-triage (Dagster job ticket_triage)" in out
    assert code == 0, out

    code, out = cli(capsys, "prune", "--job", "ticket_triage", "--output-days", "0.00001")
    assert code == 0, out
    assert "ticket-triage  runs.output" in out and "dry run" in out

    with LedgerAdmin(database) as operator:
        [first, _] = operator.list_runs(job_name="ticket-triage")
    code, out = cli(
        capsys,
        "revise",
        first.run_id[:12],
        "--reason",
        "labels v2",
        "--channel",
        "triage_webhook",
        "--now",
    )
    assert code == 0, out
    with HarnessLedger(database) as ledger:
        record = ledger.get(first.run_id)
        assert record is not None and (record.status, record.revision) == ("completed", 1)
        assert [c.outcome for c in ledger.model_calls(first.run_id)] == ["accepted", "accepted"]
    assert receiver.effects[f"{first.run_id}:triage_webhook:r1"] == 1

    code, out = cli(capsys, "reconcile", "--job", "lead_scoring")
    assert code == 2
    assert "no job named 'lead_scoring'" in out and "ticket_triage (identity ticket-triage)" in out
    assert (project["home"] / "dagster.yaml").read_text() == USER_DAGSTER_YAML


def test_the_code_location_can_be_named_on_the_command_line_or_in_the_environment(
    project: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # outside the project: nothing to discover
    code, out = cli(capsys, "reconcile")
    assert code == 2
    assert "no Dagster code location found" in out and "-m <module>" in out
    monkeypatch.syspath_prepend(str(project["folder"]))
    code, out = cli(capsys, "-m", project["module"], "reconcile", "--job", "nope")
    assert code == 2 and "ticket_triage (identity ticket-triage)" in out
    monkeypatch.setenv(CODE_LOCATION_ENV, f"{project['module']}:defs")
    code, out = cli(capsys, "reconcile", "--job", "nope")
    assert code == 2 and f"from ${CODE_LOCATION_ENV}" in out
    file = project["folder"] / f"{project['module']}.py"
    code, out = cli(capsys, "-f", str(file), "-a", "no_such", "reconcile")
    assert code == 2 and "'no_such' is not a dagster Definitions" in out


@pytest.mark.dagster_instance
def test_dev_serves_a_project_with_only_a_dagster_block(tmp_path: Path) -> None:
    """`idempotent-jobs dev` in a user's project that has `[tool.dagster]` and no workspace.yaml
    or dagster.yaml of its own, with the user's DAGSTER_HOME: the UI serves the user's job, the
    user's dagster.yaml is untouched, and Ctrl-C stops the embedded server dev started."""
    import json
    import os
    import signal
    import urllib.request

    from idempotent_jobs_tests.system.test_browser import running_dev

    project = tmp_path / "triage-project"
    (project / "src").mkdir(parents=True)
    shutil.copyfile(EXAMPLE, project / "triage_defs.py")
    (project / "pyproject.toml").write_text('[tool.dagster]\nmodule_name = "triage_defs"\n')
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(USER_DAGSTER_YAML)
    state = tmp_path / "state"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("IDEMPOTENT_JOBS_DATABASE_URL", "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL")
    }
    env.update(
        DAGSTER_HOME=str(home),
        IDEMPOTENT_JOBS_HOME=str(state),
        HELPDESK_TICKETS_URL="http://127.0.0.1:9/tickets",
        TRIAGE_WEBHOOK_URL="http://127.0.0.1:9/hook",
    )
    with running_dev(env, tmp_path / "dev.log", cwd=project / "src", stop=signal.SIGINT) as url:
        jobs = "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }"
        query = json.dumps({"query": jobs}).encode()
        request = urllib.request.Request(
            f"{url}/graphql", data=query, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            nodes = json.load(answer)["data"]["repositoriesOrError"]["nodes"]
        assert "ticket_triage" in {job["name"] for node in nodes for job in node["jobs"]}
        assert (state / "pgdata" / "postmaster.pid").exists()
    assert not (state / "pgdata" / "postmaster.pid").exists(), "dev stops what it started"
    assert (home / "dagster.yaml").read_text() == USER_DAGSTER_YAML


@pytest.mark.dagster_instance
def test_launched_partitions_show_on_the_jobs_pages(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``launch`` records its runs in the user's Dagster instance with the tags ``dagster dev``'s
    UI selects a job's runs and partition statuses by, for the location name Dagster's own
    loader gives this project."""
    from dagster._core.remote_representation.external_data import (
        partition_set_snap_name_for_job_name,
    )
    from dagster._core.storage.tags import PARTITION_SET_TAG, REPOSITORY_LABEL_TAG
    from dagster._core.workspace.load_target import get_origins_from_toml

    code, out = cli(capsys, "launch", "--wait", "--job", "ticket_triage", *PARTITIONS)
    assert code == 0, out
    assert out.count("new") == 2
    code, out = cli(capsys, "launch", "--wait", "--job", "ticket-triage", PARTITIONS[0])
    assert code == 0 and "reused" in out, out
    code, out = cli(capsys, "launch", "--job", "ticket_triage", "nowhere|2026-11-02")
    assert code == 2 and "has no partition 'nowhere|2026-11-02'" in out
    code, out = cli(capsys, "runs", "show", "--partition", PARTITIONS[0], "--job", "ticket_triage")
    assert code == 0 and "support" in out and "completed" in out, out
    code, out = cli(capsys, "runs", "show", "--partition", PARTITIONS[0])
    assert code == 2 and "--partition needs the job" in out

    [origin] = get_origins_from_toml(str(project["folder"] / "pyproject.toml"))
    label = f"__repository__@{origin.location_name}"
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(
            dg.RunsFilter(job_name="ticket_triage", tags={REPOSITORY_LABEL_TAG: label})
        )
        partitions = instance.run_storage.get_run_partition_data(
            dg.RunsFilter(
                tags={
                    PARTITION_SET_TAG: partition_set_snap_name_for_job_name("ticket_triage"),
                    REPOSITORY_LABEL_TAG: label,
                }
            )
        )
    assert len(runs) == 3 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert {p.partition for p in partitions} == set(PARTITIONS)
    assert (project["home"] / "dagster.yaml").read_text() == USER_DAGSTER_YAML


@pytest.mark.dagster_instance
def test_a_launched_run_that_failed_is_re_executed_from_failure_as_the_ui_does(
    project: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``launch`` starts runs as the UI does (the code location's origin, the instance's run
    coordinator and launcher): one that failed is re-executed from failure through the UI's
    GraphQL mutation, and only the failed step runs again."""
    from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION

    from idempotent_jobs.operator.ui_launch import Launched, dequeue, served, wait_for
    from testkit.dagster_harness import graphql

    receiver: Receiver = project["receiver"]
    receiver.faults = ["500"] * 100  # the job's own delivery fails: the run fails there
    code, out = cli(capsys, "launch", "--wait", "--json", "--job", "ticket_triage", PARTITIONS[0])
    assert code == 1, out
    [row] = json.loads(out)
    assert row["result"].startswith("failed in") and "deliver" in row["result"]
    receiver.faults = []
    target = load_workspace().locations[0].target
    with dg.DagsterInstance.get() as instance, served(target, instance) as context:
        data = graphql(
            context,
            LAUNCH_PIPELINE_REEXECUTION_MUTATION,
            {
                "reexecutionParams": {
                    "parentRunId": row["dagster_run_id"],
                    "strategy": "FROM_FAILURE",
                }
            },
        )
        launched = data["launchPipelineReexecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        again = Launched(PARTITIONS[0], launched["run"]["runId"], dg.DagsterRunStatus.QUEUED)
        dequeue(context, [again])  # no daemon here: as launch does
        [ended] = list(wait_for(instance, [again]))
        run = instance.get_run_by_id(ended.run_id)
    assert ended.status == dg.DagsterRunStatus.SUCCESS
    assert run is not None and run.parent_run_id == row["dagster_run_id"]
    assert run.step_keys_to_execute is not None and all(
        "deliver" in step for step in run.step_keys_to_execute
    )  # from failure: the model step did not run again
    assert sorted(receiver.effects.values()) == [1]
