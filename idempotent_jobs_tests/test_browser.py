"""A real browser on the real UI: `idempotent-jobs dev` (embedded PostgreSQL, a temporary
DAGSTER_HOME), Debian's Chromium driven by Playwright. Launch one partition from the Launchpad
twice: the first run does the work, the second reports "reused" and the ledger is unchanged."""

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Page, sync_playwright

from idempotent_jobs.database import start_embedded_postgres
from idempotent_jobs.jobs import COMPETITOR_SUMMARY

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
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


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`idempotent-jobs dev` in its own session; yields the UI URL and the project home."""
    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "IDEMPOTENT_JOBS_DATABASE_URL",
            "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL",
            "DAGSTER_HOME",
        )
    }
    env["IDEMPOTENT_JOBS_HOME"] = str(home)
    port = free_port()
    log = tmp_path / "dev.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "idempotent_jobs.cli", "dev", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, log)
        yield url, home
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 0, log.read_text()[-3000:]
    assert not (home / "pgdata" / "postmaster.pid").exists(), "dev stops what it started"


def launch_partition_from_ui(page: Page, url: str, partition: str) -> str:
    page.goto(f"{url}/locations/idempotent_jobs/jobs/competitor_summary/playground")
    box = page.get_by_placeholder("Partition")
    box.wait_for(timeout=60_000)
    box.click()
    box.fill(partition)
    page.get_by_text(partition, exact=True).first.wait_for()
    box.press("Enter")
    page.get_by_text(f"partition/subject: {partition.split('|')[0]}").wait_for(timeout=30_000)
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url("**/runs/**", timeout=60_000)
    page.get_by_text("Success", exact=True).first.wait_for(timeout=180_000)
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


def test_launch_a_partition_twice_from_the_ui(dev_server: tuple[str, Path]) -> None:
    url, home = dev_server
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
        finally:
            page.screenshot(path=str(ARTIFACTS / "browser-last-page.png"))
            browser.close()
