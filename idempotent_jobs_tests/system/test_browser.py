"""A real browser on the real UI: `idempotent-jobs dev` (embedded PostgreSQL, a temporary
DAGSTER_HOME), Debian's Chromium driven by Playwright, through every path the project says it is
used by, asserting on the ledger and on the model calls it recorded:
- a partition launched twice from the Launchpad: the second run reports "reused";
- a backfill of three partitions, one already completed ("Completed" ticked): all succeed, two
  model calls;
- the failure drill, then "Re-execute" > "From failure": no second collect, one accepted call;
- a schedule tick previewed and launched: each run's partition is its ledger row.
"""

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY
from idempotent_jobs.operator.dagster_home import DAGSTER_STORAGE_URL_ENV, dagster_storage_url
from idempotent_jobs.operator.embedded import start_embedded_postgres

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PARTITION = "workspace-acme|2026-08-07"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_serving(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):  # up to 120 s
        if process.poll() is not None:
            raise AssertionError(f"idempotent-jobs dev exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=1) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except OSError:
            pass
        try:
            process.wait(timeout=0.2)  # a pause that also notices an early exit
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError(f"the UI never came up:\n{log.read_text()[-3000:]}")


@contextmanager
def running_dev(
    env: dict[str, str], log: Path, cwd: Path | None = None, stop: int = signal.SIGTERM
) -> Iterator[str]:
    """`idempotent-jobs dev` in its own session until the block ends, then stopped with
    ``stop``; yields the UI URL. It must exit 0 (the log's tail says why not)."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "idempotent_jobs.operator.cli", "dev", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, log)
        yield url
    finally:
        process.send_signal(stop)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, log.read_text()[-3000:]


def _without_ledger_urls() -> dict[str, str]:
    """This environment less the ledger's and Dagster's locations: a command run with it uses
    the project home it is given, as `dev` does."""
    dropped = (
        "IDEMPOTENT_JOBS_DATABASE_URL",
        "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL",
        "DAGSTER_HOME",
    )
    return {k: v for k, v in os.environ.items() if k not in dropped}


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`idempotent-jobs dev` in its own session; yields the UI URL and the project home."""
    home = tmp_path / "home"
    env = _without_ledger_urls()
    env["IDEMPOTENT_JOBS_HOME"] = str(home)
    with running_dev(env, tmp_path / "dev.log") as url:
        yield url, home
    assert not (home / "pgdata" / "postmaster.pid").exists(), "dev stops what it started"


def launch_partition_from_ui(page: Page, url: str, partition: str, outcome: str = "Success") -> str:
    page.goto(f"{url}/locations/idempotent_jobs/jobs/competitor_summary/playground")
    box = page.get_by_placeholder("Partition")
    box.wait_for(timeout=60_000)
    # The newsletter dialog may show while the partition is typed or chosen, and its dismissal
    # closes the suggestion list (the Enter then chooses nothing): type it again then, until
    # the partition's tags show it chosen. The list waits for the partition keys, which a
    # loaded CI machine (the rest of the suite on the other core) has taken over 20 s to serve.
    chosen = page.get_by_text(f"partition/subject: {partition.split('|')[0]}")
    for attempt in range(3):
        box.click()
        box.fill(partition)
        try:
            page.get_by_text(partition, exact=True).first.wait_for(timeout=40_000)
            box.press("Enter")
            chosen.wait_for(timeout=30_000)
            break
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url("**/runs/**", timeout=60_000)
    page.get_by_text(outcome, exact=True).first.wait_for(timeout=180_000)
    return page.url.rsplit("/", 1)[-1]


def ledger_state(home: Path, run_id: str) -> Any:
    url = start_embedded_postgres(home / "pgdata")  # the running server, reused
    with psycopg.connect(url) as conn:
        runs = conn.execute(
            "SELECT run_id, status, output, completed_at, lease_epoch, attempts"
            " FROM idempotent_jobs.runs"
        ).fetchall()
        outbox = conn.execute(
            "SELECT run_id, channel, delivered_at FROM idempotent_jobs.notification_outbox"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchall()
    return runs, outbox


def query(home: Path, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(start_embedded_postgres(home / "pgdata")) as conn:
        return conn.execute(statement, params).fetchall()


def calls_of(home: Path, partition: str) -> list[str]:
    """The outcomes of the partition's recorded model calls, oldest first."""
    run_id = COMPETITOR_SUMMARY.identity_for(partition).run_id
    return [
        outcome
        for (outcome,) in query(
            home,
            "SELECT outcome FROM idempotent_jobs.model_calls WHERE run_id = %s ORDER BY call_id",
            run_id,
        )
    ]


def status_of(home: Path, partition: str) -> str | None:
    rows = query(
        home,
        "SELECT status FROM idempotent_jobs.runs WHERE run_id = %s",
        COMPETITOR_SUMMARY.identity_for(partition).run_id,
    )
    return rows[0][0] if rows else None


def dagster_runs(home: Path, page: Page, want: Any, seconds: float = 240) -> list[dg.DagsterRun]:
    """Dagster's runs once ``want(runs)`` holds, from the dev server's own instance (the UI
    page polls meanwhile, as a person watching it would)."""
    with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
        for _ in range(int(seconds)):
            runs = instance.get_runs()
            if want(runs):
                return list(runs)
            page.wait_for_timeout(1000)
    raise AssertionError(f"Dagster's runs never got there: {[(r.run_id, r.status) for r in runs]}")


def succeeded_runs_tagged(home: Path, page: Page, tag: str, count: int) -> list[dg.DagsterRun]:
    """The ``count`` Dagster runs carrying ``tag``, once all of them succeeded."""

    def tagged(runs: list[dg.DagsterRun]) -> list[dg.DagsterRun]:
        return [r for r in runs if r.tags.get(tag)]

    def done(runs: list[dg.DagsterRun]) -> bool:
        mine = tagged(runs)
        return len(mine) == count and all(r.status == dg.DagsterRunStatus.SUCCESS for r in mine)

    return tagged(dagster_runs(home, page, done))


def backfill_from_ui(page: Page, url: str, partitions: list[str]) -> None:
    """The backfill dialog: type the partitions, tick "Completed" (off by default, which hides
    that re-running a completed partition costs nothing), submit."""
    page.goto(f"{url}/locations/idempotent_jobs/jobs/competitor_summary/partitions")
    page.get_by_role("button", name="Launch backfill…").click()
    box = page.get_by_placeholder('ex: "workspace-acme|', exact=False)
    box.click()
    box.fill(", ".join(f'"{p}"' for p in partitions))
    box.press("Enter")
    page.get_by_text("Completed (1)").click()
    page.get_by_role("button", name=f"Submit {len(partitions)} runs").click()


def reexecute_from_failure(page: Page) -> str:
    """On a failed run's page: the menu beside "Re-execute all", then "From failure"."""
    failed = page.url
    rerun = page.get_by_role("button", name="Re-execute all (*)")
    rerun.locator("xpath=following-sibling::*[1]").click()
    page.get_by_role("menuitem", name="From failure").click()
    page.wait_for_url(lambda now: "/runs/" in now and now != failed, timeout=60_000)
    page.get_by_text("Success", exact=True).first.wait_for(timeout=180_000)
    return page.url.rsplit("/", 1)[-1]


def launch_schedule_tick_from_ui(page: Page, url: str) -> None:
    page.goto(f"{url}/locations/idempotent_jobs/schedules/competitor_summary_schedule")
    page.get_by_role("button", name="Preview tick result").click()
    page.get_by_role("button", name="Continue").click()
    page.get_by_text("2 run requests").wait_for(timeout=60_000)
    page.get_by_role("button", name="Launch all & commit tick result").click()


# Eight Dagster runs launched through the UI (a run worker process each) on a 2-core machine:
# may outlast the suite's 300 s per test.
@pytest.mark.timeout(900)
def test_every_used_by_path_from_the_ui(
    dev_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, home = dev_server
    monkeypatch.setenv(  # for reading the dev server's Dagster instance from this process
        DAGSTER_STORAGE_URL_ENV, dagster_storage_url(start_embedded_postgres(home / "pgdata"))
    )
    run_id = COMPETITOR_SUMMARY.identity_for(PARTITION).run_id
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        # The first visit shows a newsletter dialog, at some point: dismiss it whenever it shows.
        page.add_locator_handler(
            page.get_by_text("Join the Dagster community"),
            lambda _: page.get_by_role("button", name="Skip").click(),
        )
        try:
            first_run = launch_partition_from_ui(page, url, PARTITION)
            page.screenshot(path=str(ARTIFACTS / "browser-first-run.png"))
            runs, outbox = ledger_state(home, run_id)
            assert [(r[0], r[1], r[4]) for r in runs] == [(run_id, "completed", 1)]
            assert len(outbox) == 1 and outbox[0][2] is not None

            second_run = launch_partition_from_ui(page, url, PARTITION)
            assert second_run != first_run
            page.get_by_placeholder("Filter").first.fill("reused")
            page.get_by_text(f"ledger run {run_id}: reused").first.wait_for(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "browser-second-run-reused.png"))
            assert ledger_state(home, run_id) == (runs, outbox), "the second run changed nothing"
            assert calls_of(home, PARTITION) == ["accepted"]

            # A backfill of three partitions, one of them completed above.
            backfilled = [PARTITION, "workspace-acme|2026-08-08", "workspace-globex|2026-08-07"]
            backfill_from_ui(page, url, backfilled)
            filled = succeeded_runs_tagged(home, page, "dagster/backfill", 3)
            assert {r.tags["dagster/partition"] for r in filled} == set(backfilled)
            assert [calls_of(home, p) for p in backfilled] == [["accepted"]] * 3, "2 new calls"
            assert [status_of(home, p) for p in backfilled] == ["completed"] * 3
            [first_row] = [r for r in runs if r[0] == run_id]
            assert [r for r in ledger_state(home, run_id)[0] if r[0] == run_id] == [first_row]
            page.screenshot(path=str(ARTIFACTS / "browser-backfill.png"))

            # The failure drill, then "Re-execute" > "From failure".
            drilled = "workspace-acme|2026-08-09"
            arm = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "idempotent_jobs.operator.cli",
                    "drill",
                    "fail-model-calls",
                    "4",
                ],
                env={**_without_ledger_urls(), "IDEMPOTENT_JOBS_HOME": str(home)},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert arm.returncode == 0, arm.stderr
            launch_partition_from_ui(page, url, drilled, outcome="Failure")
            # Every try of the op failed. The run-retry daemon (dagster.yaml: run_retries) may
            # already have retried the run from failure (runs in process take seconds): then
            # the ledger is completed and the re-execution below reuses it.
            assert calls_of(home, drilled) in ([], ["accepted"]), "a drilled call is not counted"
            assert status_of(home, drilled) in ("failed", "completed")
            reexecute_from_failure(page)
            page.screenshot(path=str(ARTIFACTS / "browser-reexecuted-from-failure.png"))
            assert status_of(home, drilled) == "completed"
            assert calls_of(home, drilled) == ["accepted"]
            steps = query(
                home,
                "SELECT caller_step FROM idempotent_jobs.attempts WHERE run_id = %s",
                COMPETITOR_SUMMARY.identity_for(drilled).run_id,
            )
            # Every attempt ended in transform (the step that failed, then re-executed from
            # failure): none ended in collect, which ran once and handed its lease over.
            assert {s for (s,) in steps} == {"transform"}, steps

            # A schedule tick, previewed and launched: one run per subject of the last window.
            launch_schedule_tick_from_ui(page, url)
            ticked = succeeded_runs_tagged(home, page, "dagster/schedule_name", 2)
            for run in ticked:
                partition = run.tags["dagster/partition"]
                identity = COMPETITOR_SUMMARY.identity_for(partition)
                assert status_of(home, partition) == "completed"
                assert calls_of(home, partition) == ["accepted"]
                assert identity.subject_id == run.tags["dagster/partition/subject"]
            assert {r.tags["dagster/partition/subject"] for r in ticked} == set(
                COMPETITOR_SUMMARY.subjects
            )
            page.screenshot(path=str(ARTIFACTS / "browser-schedule-tick.png"))
        finally:
            page.screenshot(path=str(ARTIFACTS / "browser-last-page.png"))
            browser.close()
