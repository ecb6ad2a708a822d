"""The batch lane as a team runs it: 5 partitions backfilled from the Dagster UI's path (the
launchpad's GraphQL mutation, with a range) through the fake OpenAI Batch API, a real
``dagster-daemon`` launching the run and ticking the sensor, killed (SIGKILL, its whole process
group) while the batch is in flight and started again. Then, with no manual command: one
provider batch, 5 runs accepted once at the batch tier, a successful run of every partition
(as the UI's partition status reads it) that delivered its notification once, the UI's metadata
and the sensor's ticks, and ``runs stats``."""

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest

from idempotent_jobs import LedgerAdmin
from idempotent_jobs.operator.cli import main as cli
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import (
    LOCATION,
    PROJECT_ROOT,
    REPOSITORY,
    DagsterTestEnv,
    dagster_instance,
    graphql,
    step_metadata,
    workspace,
)
from testkit.fake_providers import Answer, FakeProviders

pytestmark = [pytest.mark.slow, pytest.mark.dagster_instance]

MODULE = "idempotent_jobs_tests.batch_defs"


def _daemon_command(home: Path) -> list[str]:
    """``dagster-daemon run`` on this code location, under the name the launch used."""
    import shutil
    import sys

    found = shutil.which("dagster-daemon", path=str(Path(sys.executable).parent))
    assert found is not None
    workspace_file = home / "workspace.yaml"
    workspace_file.write_text(
        "load_from:\n  - python_module:\n"
        f"      module_name: {MODULE}\n      attribute: defs\n"
        f"      working_directory: {PROJECT_ROOT}\n      location_name: {LOCATION}\n"
    )
    return [found, "run", "-w", str(workspace_file)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer('{"label": "billing"}', 412, 6)) as server:
        server.batches.polls_to_complete = 4
        monkeypatch.setenv("IJ_FAKE_OPENAI_URL", server.openai_url)
        yield server


def _start_daemon(home: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            _daemon_command(home),
            env={**os.environ, "DAGSTER_HOME": str(home)},
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its code server with it, in one process group
        )


def _kill(daemon: subprocess.Popen[bytes]) -> None:
    os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait(timeout=30)


def _wait(condition: Callable[[], bool], what: str, log: Path, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def _batch(db: psycopg.Connection) -> tuple[Any, ...] | None:
    return db.execute("SELECT batch_id, state FROM idempotent_jobs.batches").fetchone()


def test_a_backfill_through_the_batch_lane_survives_a_killed_daemon_and_ends_green(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    fake: FakeProviders,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with LedgerAdmin.beside(ledger) as admin:  # `runs stats` shows the batch tier's money
        admin.set_price("gpt-4o-mini", "0.15", "0.60")
        admin.set_price("gpt-4o-mini", "0.075", "0.30", tier="batch")
    log = dagster_env.tmp_path / "daemon.log"
    with (
        dagster_instance(dagster_env, sync_launcher=False) as instance,
        workspace(instance, module=MODULE) as context,
    ):
        home = Path(instance.root_directory)
        # As the launchpad does: the batch job with a range of a day of five teams.
        data = graphql(
            context,
            LAUNCH,
            {
                "executionParams": {
                    "selector": {**REPOSITORY, "jobName": "ticket_labels_batch"},
                    "runConfigData": {
                        "ops": {
                            "open_batch": {"config": {"start": "2026-11-01", "end": "2026-11-01"}}
                        }
                    },
                }
            },
        )
        launched = data["launchPipelineExecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        request = context.create_request_context()
        sensor = (
            request.get_code_location(LOCATION)
            .get_repository("__repository__")
            .get_sensor("ticket_labels_batches")
        )

        def said(text: str) -> bool:  # a tick of the sensor said it (in the UI's tick list)
            ticks = instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id)
            return any(text in (tick.skip_reason or "") for tick in ticks)

        daemon = _start_daemon(home, log)
        try:
            # Submitted, and polled at least once: then the daemon dies with its code server.
            _wait(lambda: (_batch(db) or (None, ""))[1] == "submitted", "the submit", log)
            _wait(lambda: ("openai", "retrieve") in fake.batches.calls, "a poll", log)
            _kill(daemon)
            assert (_batch(db) or (None, ""))[1] != "collected"
            daemon = _start_daemon(home, log)
            _wait(lambda: (_batch(db) or (None, ""))[1] == "collected", "the collection", log)
            # The sensor then requests a run of every partition, which the daemon launches.
            _wait(
                lambda: set(_partition_statuses(context).get(key) for key in KEYS) == {"SUCCESS"},
                "a successful run of every partition",
                log,
            )
        finally:
            _kill(daemon)

        assert said("submitted (5 pending)")
        tags = [
            r.dagster_run.tags.get("idempotent_jobs/batch")
            for r in instance.get_run_records(dg.RunsFilter(job_name="ticket_labels"))
        ]
        assert len(tags) == 5 and set(tags) == {(_batch(db) or ("",))[0]}
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        shown = step_metadata(instance, run_id, "open_batch")
        assert (shown["partitions"], shown["runs_in_batch"], shown["state"]) == (
            5,
            5,
            "submitted",
        )

    assert len(fake.batches.created["openai"]) == 1
    calls = db.execute(
        "SELECT count(*), count(DISTINCT run_id), count(*) FILTER (WHERE tier = 'batch')"
        " FROM idempotent_jobs.model_calls WHERE outcome = 'accepted'"
    ).fetchone()
    assert calls == (5, 5, 5)
    runs = db.execute(
        "SELECT count(*) FROM idempotent_jobs.runs WHERE status = 'completed'"
    ).fetchone()
    assert runs == (5,)
    delivered = [json.loads(line) for line in dagster_env.notifications.read_text().splitlines()]
    partitions = [(d["payload"]["subject"], d["payload"]["window_start"][:10]) for d in delivered]
    assert sorted(partitions) == sorted(
        (subject, "2026-11-01") for subject in SUBJECTS
    )  # one notification each, no manual command
    capsys.readouterr()
    assert cli(["runs", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    [spend] = [s for s in stats["spend"] if s["job_name"] == "ticket-labels"]
    # 5 calls of 412 input and 6 output tokens at the batch tier's 0.075 and 0.30 per million.
    assert (spend["calls"], spend["tokens"]) == (5, 5 * 418)
    assert Decimal(spend["cost"]) == Decimal("0.0001635")


SUBJECTS = ("emea", "amer", "apac", "nordics", "iberia")
KEYS = [f"{subject}|2026-11-01" for subject in SUBJECTS]

PARTITION_STATUSES = """
query($selector: RepositorySelector!, $name: String!) {
  partitionSetOrError(repositorySelector: $selector, partitionSetName: $name) {
    __typename
    ... on PartitionSet {
      partitionStatusesOrError {
        __typename
        ... on PartitionStatuses { results { partitionName runStatus } }
      }
    }
  }
}
"""


def _partition_statuses(context: Any) -> dict[str, str | None]:
    """Each partition's latest run status, as the UI's partitions view reads it."""
    data = graphql(
        context,
        PARTITION_STATUSES,
        {"selector": REPOSITORY, "name": "ticket_labels_partition_set"},
    )
    found = data["partitionSetOrError"]["partitionStatusesOrError"]
    return {r["partitionName"]: r["runStatus"] for r in found.get("results") or []}


LAUNCH = """
mutation($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
