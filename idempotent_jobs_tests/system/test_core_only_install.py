"""`pip install idempotent-jobs` without extras: the core works with no Dagster installed.

Builds the package as a user would get it (a non-editable install into a new virtualenv of its
own, psycopg its only dependency), then runs the same logical run twice through
``run_idempotent`` against this test's database: one model call, and Dagster never importable.
"""

import json
import subprocess
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

CHECKOUT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.util, json, sys
from datetime import UTC, datetime

import idempotent_jobs.core
from idempotent_jobs import RunIdentity, RunLedger, run_idempotent

calls = []

def model(raw):
    calls.append(raw)
    return {"summary": "one call"}

identity = RunIdentity("core-only", "subject", datetime(2026, 12, 1, tzinfo=UTC), "v1")
with RunLedger(sys.argv[1]) as ledger:
    outcomes = [
        run_idempotent(ledger, identity, collect=lambda i: {"n": 1}, transform=model).executed
        for _ in range(2)
    ]
print(json.dumps({
    "outcomes": outcomes,
    "model_calls": len(calls),
    "dagster": importlib.util.find_spec("dagster") is not None,
    "pydantic": importlib.util.find_spec("pydantic") is not None,
    "tests_shipped": importlib.util.find_spec("idempotent_jobs_tests") is not None,
    "dagster_imported": any(m.split(".")[0] == "dagster" for m in sys.modules),
}))
"""


def test_the_core_installs_and_runs_without_dagster(tmp_path: Path, database: str) -> None:
    home = tmp_path / "core-venv"
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(CHECKOUT)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    (tmp_path / "script.py").write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [python, str(tmp_path / "script.py"), database],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not the checkout: only the installed package is importable
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report == {
        "outcomes": [True, False],  # executed, then reused
        "model_calls": 1,
        "dagster": False,
        "pydantic": False,
        "tests_shipped": False,
        "dagster_imported": False,
    }
