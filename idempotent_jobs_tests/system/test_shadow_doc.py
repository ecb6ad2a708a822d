"""docs/shadow.md's session, run as the page shows it: ``docs/examples/shadow_session.py`` in a
process of its own, from outside the repository, on a ledger of its own. Its printed lines are
the page's (ids and times aside)."""

from pathlib import Path

import pytest

from idempotent_jobs_tests.helpers import doc_example
from idempotent_jobs_tests.ledgers import HarnessLedger

pytestmark = [pytest.mark.slow]


def test_the_shadow_page_shows_what_the_session_prints(
    ledger: HarnessLedger, database: str, tmp_path: Path
) -> None:
    printed, shown = doc_example("shadow_session.py", "shadow.md", database, tmp_path)
    assert printed == shown
    assert (tmp_path / "shadow-report.md").read_text().count("| differ |") == 10
