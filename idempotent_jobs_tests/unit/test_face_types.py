"""The faces are typed: ``mypy --strict`` refuses a method no face has, as a user's checked
code would see it (a module outside this repository, importing the installed package)."""

import textwrap
from pathlib import Path

from mypy import api

USER_CODE = """
from idempotent_jobs import RunLedger
from idempotent_jobs.core.admin import LedgerAdmin


def work(ledger: RunLedger, admin: LedgerAdmin) -> None:
    ledger.no_such_method_at_all(1, 2, 3)
    admin.no_such_listing()
    ledger.begin  # a real method: no error on this line
"""


def test_mypy_strict_refuses_a_method_no_face_has(tmp_path: Path) -> None:
    module = tmp_path / "users_job.py"
    module.write_text(textwrap.dedent(USER_CODE), encoding="utf-8")
    out, _, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            # Never the project's cache, which `make check`'s own mypy writes meanwhile.
            f"--cache-dir={tmp_path / 'mypy-cache'}",
            str(module),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out
    assert any('"RunLedger" has no attribute "no_such_method_at_all"' in e for e in errors), out
    assert any('"LedgerAdmin" has no attribute "no_such_listing"' in e for e in errors), out
    assert len(errors) == 2, out
