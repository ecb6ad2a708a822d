"""The cluster harness tears itself down: SIGTERM mid-run (a CI timeout) leaves no network
namespace and no process of its hosts. Its trials run outside pytest: ``make proof``."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from idempotent_jobs_tests.cluster.hosts import PROJECT_ROOT

pytestmark = [pytest.mark.slow]


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def test_a_terminated_harness_takes_every_host_and_process_with_it() -> None:
    """SIGTERM in the middle of a run (a CI timeout), here as trial 1 starts: the harness
    exits, and no namespace and no process of its hosts (PostgreSQL, Redis, daemons, code
    servers, Celery) nor of the trial's workers is left."""
    before = namespaces()
    harness = subprocess.Popen(
        [sys.executable, "-m", "idempotent_jobs_tests.cluster", "--trials", "50", "--keep"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert harness.stdout is not None
    workdir = ""
    seen: list[str] = []
    try:
        for line in harness.stdout:
            seen.append(line)
            if line.startswith("work directory (kept): "):
                workdir = line.split(": ", 1)[1].strip()
            if line.startswith("cluster up "):
                break  # the hosts are up and trial 1 is under way: a timeout lands mid-trial
        assert workdir and seen[-1].startswith("cluster up "), "".join(seen)[-3000:]
        assert processes_mentioning(workdir), "the hosts' processes were not found running"
        harness.terminate()
        harness.communicate(timeout=120)
        assert harness.returncode != 0
        assert namespaces() == before, "the harness left network namespaces behind"
        assert processes_mentioning(workdir) == []
    finally:
        if harness.poll() is None:
            harness.kill()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
