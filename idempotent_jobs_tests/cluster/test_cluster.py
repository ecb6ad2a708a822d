"""A short run of the cluster harness (one trial of each kind), as CI runs it: six hosts in
network namespaces, every process started inside its host, and nothing left behind."""

import subprocess
import sys

import pytest

from idempotent_jobs_tests.cluster.hosts import PROJECT_ROOT
from idempotent_jobs_tests.cluster.runner import KINDS

pytestmark = [pytest.mark.slow]


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def test_one_trial_of_each_kind_passes_and_every_namespace_is_gone() -> None:
    before = namespaces()
    harness = subprocess.Popen(
        [sys.executable, "-m", "idempotent_jobs_tests.cluster", "--trials", str(len(KINDS))],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = harness.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        harness.terminate()  # SIGTERM: the harness tears its hosts down before it exits
        stdout, stderr = harness.communicate(timeout=120)
    lines = stdout.strip().splitlines()
    assert harness.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert lines[-1] == f"{len(KINDS)} passed, 0 failed", stdout[-3000:]
    assert "duplicates=0 lost=0" in lines
    ran = {
        line.split("(")[1].split(":")[0].split(")")[0]
        for line in lines
        if line.startswith("trial ")
    }
    assert ran == set(KINDS)
    assert namespaces() == before, "the harness left network namespaces behind"
