"""An upgrade from release 0.1: its own ledger, restored from the committed dump, then migrated.

The dump (``ledger_0_1.sql``) and what the builder saw (``ledger_0_1.json``) were made by
``make_fixture.py`` running release 0.1's code. After today's ``migrate``: nothing is computed or
notified again, every read works, the worker role granted as then advised still works and can no
longer write the migration history, and ``migrate`` says what it found and did.
"""

import json
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity, run_idempotent
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.json_values import MAX_JSON_DEPTH, UnreadableValue
from idempotent_jobs.dagster.partitions import identity_for_partition, load_subjects
from idempotent_jobs.operator.cli import main
from idempotent_jobs_tests.ledgers import HarnessLedger
from idempotent_jobs_tests.upgrade.make_fixture import DUMP, MADE, WORKER_ROLE, create_worker_role

WINDOW = datetime(2026, 11, 2, tzinfo=UTC)
JOB = "weekly-digest"


@pytest.fixture
def made() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(MADE.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture
def old_ledger(server_url: str, fresh_database: str) -> str:
    """A database holding release 0.1's ledger exactly as 0.1 left it; yields its conninfo."""
    create_worker_role(server_url)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(DUMP.read_text(encoding="utf-8").encode())
    return fresh_database


def nfc_identity(subject: str) -> RunIdentity:
    return RunIdentity(JOB, unicodedata.normalize("NFC", subject), WINDOW, "v1")


def never(raw: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("a run 0.1 completed was computed again")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_fixture_is_release_0_1s_ledger(old_ledger: str) -> None:
    with psycopg.connect(old_ledger) as conn:
        versions = conn.execute("SELECT version FROM idempotent_jobs.schema_migrations").fetchall()
    assert [v for (v,) in versions] == [1, 2, 3]


def test_migrate_reports_what_it_found_and_did(
    old_ledger: str,
    made: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", old_ledger)
    code, out = cli(capsys, "migrate")
    assert code == 0, out
    runs = made["runs"]
    assert "0004_candidate_basis" in out
    # The NFD run is now found from its NFC form; the NFD twin of an NFC run cannot be merged.
    assert f"identity normalised to NFC: {runs['nfd'][:12]}" in out
    assert f"kept as stored: {runs['twin_nfd'][:12]}" in out
    assert f"normalised to NFC: {runs['twin_nfc'][:12]}" not in out
    assert f"too deep to read: {runs['deep'][:12]} output" in out
    assert f"granted idempotent_jobs_worker to {WORKER_ROLE}" in out
    # A second migrate finds nothing left to do and says so: the data steps scanned the tables
    # once, at the upgrade (upgrade_steps), not at every migrate.
    code, out = cli(capsys, "migrate")
    assert code == 0
    assert out.strip() == "schema is up to date", out


def test_nothing_is_computed_or_notified_again(old_ledger: str, made: dict[str, Any]) -> None:
    LedgerAdmin(old_ledger).migrate()
    runs = made["runs"]
    with HarnessLedger(old_ledger) as ledger:
        for name, subject in [
            ("nfd", "Société Générale"),
            ("twin_nfc", "Zoë"),
            ("deep", "deep-output"),
            ("revised", "Globex"),
        ]:
            outcome = run_idempotent(
                ledger,
                nfc_identity(subject),
                collect=lambda i: {"collected": "again"},
                transform=never,
                notifications=lambda out: {"webhook": {"again": True}},
            )
            assert (outcome.run_id, outcome.status, outcome.executed) == (
                runs[name],
                "completed",
                False,
            ), name
        # The NFD spelling, as an NFD subjects.yaml still passes it, finds the same run.
        spelled_nfd = RunIdentity(
            JOB, unicodedata.normalize("NFD", "Société Générale"), WINDOW, "v1"
        )
        assert ledger.register(spelled_nfd).run_id == runs["nfd"]
        deep = ledger.get(runs["deep"])
        assert deep is not None and isinstance(deep.output, UnreadableValue)
        # The failed run is retried once, under its own id; the model is paid once.
        retried = run_idempotent(
            ledger,
            nfc_identity("Initech"),
            collect=lambda i: {"items": [1]},
            transform=lambda raw: ModelAnswer({"summary": "now"}, ModelUsage("m", 5, 2)),
        )
        assert (retried.run_id, retried.executed) == (runs["failed"], True)
        # Exactly the rows 0.1 left pending go out, under the keys 0.1 gave them.
        sent: list[str] = []
        report = ledger.deliver_outbox(lambda row: sent.append(row.idempotency_key))
        assert sorted(sent) == made["pending_keys"]
        assert not report.failed
        assert ledger.deliver_outbox(lambda row: sent.append(row.idempotency_key)).delivered == []


def test_every_read_works(
    old_ledger: str,
    made: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    LedgerAdmin(old_ledger).migrate()
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", old_ledger)
    code, out = cli(capsys, "runs", "list")
    assert code == 0, out
    assert made["runs"]["deep"][:12] in out
    code, out = cli(capsys, "runs", "list", "--json")
    assert code == 0, out
    listed = json.loads(out)
    assert {row["run_id"] for row in listed} == set(made["runs"].values())
    for run_id in made["runs"].values():
        code, out = cli(capsys, "runs", "show", run_id)
        assert code == 0, out
        code, out = cli(capsys, "runs", "show", run_id, "--json")
        assert code == 0, out
        json.loads(out)
    code, out = cli(capsys, "runs", "show", made["runs"]["deep"])
    assert f"unreadable: nested more than {MAX_JSON_DEPTH} levels deep" in out
    for argv in (["outbox", "list"], ["runs", "stats"], ["doctor"]):
        code, out = cli(capsys, *argv)
        assert "Traceback" not in out and "RecursionError" not in out, argv


def test_the_worker_role_granted_for_0_1_still_works(old_ledger: str, made: dict[str, Any]) -> None:
    LedgerAdmin(old_ledger).migrate()
    as_worker = make_conninfo(old_ledger, user=WORKER_ROLE)
    with HarnessLedger(as_worker) as ledger:
        outcome = run_idempotent(
            ledger,
            RunIdentity(JOB, "Hooli", WINDOW, "v1"),
            collect=lambda i: {"items": [1]},
            transform=lambda raw: ModelAnswer({"summary": "ok"}, ModelUsage("m", 7, 3)),
            notifications=lambda out: {"webhook": out},
        )
        assert outcome.executed
        assert [c.outcome for c in ledger.model_calls(outcome.run_id)] == ["accepted"]
        with LedgerAdmin.beside(ledger) as operator:  # the worker role reads attempts too
            assert operator.attempts(outcome.run_id)
    with psycopg.connect(as_worker, autocommit=True) as conn:
        for statement in (
            "DELETE FROM idempotent_jobs.schema_migrations",
            "UPDATE idempotent_jobs.schema_migrations SET checksum = 'x'",
            "INSERT INTO idempotent_jobs.schema_migrations VALUES (99, 'x', 'x')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_an_nfd_subjects_file_keeps_its_dagster_partition_keys(
    old_ledger: str, made: dict[str, Any], tmp_path: Path
) -> None:
    """0.1 made partition keys of the subjects as written; they stay, and find 0.1's runs."""
    LedgerAdmin(old_ledger).migrate()
    subjects_file = tmp_path / "subjects.yaml"
    subjects_file.write_text(made["subjects_yaml"], encoding="utf-8")
    subjects = load_subjects(JOB, subjects_file)
    assert subjects == made["partition_subjects"]
    partitions = dg.MultiPartitionsDefinition(
        {
            "window": dg.DailyPartitionsDefinition(start_date="2026-11-01"),
            "subject": dg.StaticPartitionsDefinition(subjects),
        }
    )
    key = f"{made['partition_subjects'][0]}|2026-11-02"
    ident = identity_for_partition(partitions, key, JOB, "v1")
    with HarnessLedger(old_ledger) as ledger:
        assert ledger.register(ident).run_id == made["runs"]["nfd"]
