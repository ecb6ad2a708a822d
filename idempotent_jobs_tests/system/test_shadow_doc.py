"""docs/shadow.md's session, run as the page shows it: ``docs/examples/shadow_session.py`` in a
process of its own, from outside the repository, on a ledger of its own. Its printed lines are
the page's (ids and times aside)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs_tests.ledgers import BothFaces

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "examples" / "shadow_session.py"

pytestmark = [pytest.mark.slow]


def _stable(text: str) -> list[str]:
    """The output's lines with ids, times and column padding taken out."""
    text = re.sub(r"\bsh-[0-9a-f]{12}\b", "<shadow>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d UTC)?", "<time>", text)
    return [re.sub(r"\s+", " ", line).strip() for line in text.splitlines() if line.strip()]


def test_the_shadow_page_shows_what_the_session_prints(
    ledger: BothFaces, database: str, tmp_path: Path
) -> None:
    env = {**os.environ, DATABASE_URL_ENV: database, "IDEMPOTENT_JOBS_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = _stable(done.stdout)
    page = (ROOT / "docs" / "shadow.md").read_text()
    [shown] = re.findall(r"<!-- printed -->\n```text\n(.*?)```", page, re.S)
    assert printed == _stable(shown)
    assert (tmp_path / "shadow-report.md").read_text().count("| differ |") == 10
