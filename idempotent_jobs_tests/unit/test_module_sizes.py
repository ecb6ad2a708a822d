"""Small modules with one job each: every module of the package stays under 400 lines (the
ledger's SQL files too; the migrations are history, kept as they were applied)."""

from pathlib import Path

import idempotent_jobs

PACKAGE = Path(idempotent_jobs.__file__).resolve().parent
MOST_LINES = 400


def test_every_module_of_the_package_is_under_400_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): path.read_text(encoding="utf-8").count("\n")
        for pattern in ("*.py", "*.sql")
        for path in PACKAGE.rglob(pattern)
        if "migrations" not in path.parts
    }
    assert len(sizes) > 100  # the package, not an empty folder
    assert {name: lines for name, lines in sizes.items() if lines >= MOST_LINES} == {}
