"""docs/batch.md's backfill, run as the page shows it: ``docs/examples/batch_backfill.py`` in a
process of its own, from outside the repository, on a ledger of its own. Its printed lines are
the page's (ids and times aside)."""

from pathlib import Path

from idempotent_jobs_tests.helpers import doc_example
from idempotent_jobs_tests.ledgers import HarnessLedger


def test_the_batch_page_shows_what_the_example_prints(
    ledger: HarnessLedger, database: str, tmp_path: Path
) -> None:
    printed, shown = doc_example("batch_backfill.py", "batch.md", database, tmp_path)
    assert printed == shown
