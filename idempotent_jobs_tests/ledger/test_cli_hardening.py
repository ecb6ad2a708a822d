"""No part of a password in any message, however the URL is malformed; numeric options refuse
what is not a finite number in range (exit 2); a failed recompute of a revision says so in one
line (exit 1)."""

import re
from pathlib import Path

import pytest

from idempotent_jobs import Budget, LedgerAdmin
from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC
from idempotent_jobs_tests.helpers import claimed
from idempotent_jobs_tests.ledger.test_operator_cli import cli_env, run  # noqa: F401 - fixture
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv

PASSWORDS = [
    "correct horse battery staple",
    "p@ssword-Zq",
    "100%real-Zq",
    "it's\"quoted-Zq",
    "pässwörd-ü-Zq",
    "a/b?c#d=Zq&x",
    "trail space ",
]


def _urls(password: str) -> list[str]:
    return [
        f"postgresql://ledger:{password}@127.0.0.1:1/x",
        f"postgresql+psycopg2://ledger:{password}@127.0.0.1:1/x?sslmode=disable",
        f"host=127.0.0.1 port=1 user=ledger password={password} dbname=x",
        f"host=127.0.0.1 port=1 password='{password}' dbname=x",
        # Malformed: a scheme typo, one slash, no scheme, text that is neither URL nor conninfo.
        f"postgresql//ledger:{password}@127.0.0.1:1/x",
        f"postgresql:/ledger:{password}@127.0.0.1:1/x",
        f"postgersql://ledger:{password}@127.0.0.1:1/x",
        f"ledger:{password}@127.0.0.1:1/x",
        f"the ledger is at 127.0.0.1 and its password is {password}",
    ]


def _leaks(password: str, text: str) -> list[str]:
    """The pieces of ``password`` (two characters or more between separators, or any four in
    a row within such a piece) that appear in ``text``."""
    pieces = {p for p in re.split(r"[\s@%'\"/:?&=#]+", password) if len(p) >= 2}
    runs = {p[i : i + 4] for p in pieces for i in range(len(p) - 3)}
    return sorted(p for p in pieces | runs if p.strip() and p in text)


@pytest.mark.parametrize("password", PASSWORDS)
def test_no_part_of_a_password_appears_in_any_message(
    password: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in _urls(password):
        with pytest.raises(Exception) as info:
            HarnessLedger(url, connect_timeout_seconds=1).open()
        assert not _leaks(password, str(info.value)), (url, str(info.value))
        with pytest.raises(Exception) as info:
            LedgerAdmin(url, connect_timeout_seconds=1).migrate()
        assert not _leaks(password, str(info.value)), (url, str(info.value))
        monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", url)
        for argv in (["migrate"], ["doctor"], ["runs", "list"]):
            code, out = run(capsys, "--connect-timeout", "1", *argv)
            assert code in (1, 2) and "Traceback" not in out, out
            assert not _leaks(password, out), (url, argv, out)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "-3", "ten"])
@pytest.mark.parametrize(
    "argv",
    [
        ["--connect-timeout", "{}", "runs", "list"],
        ["prune", "--output-days", "{}"],
        ["prune", "--raw-input-days", "{}"],
        ["doctor", "--outbox-age", "{}"],
        ["runs", "list", "--limit", "{}"],
    ],
)
def test_numeric_options_refuse_what_is_not_a_finite_number_in_range(
    argv: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, *(a.format(value) for a in argv))
    assert code == 2, out
    assert "Traceback" not in out and "error:" in out, out


@pytest.mark.parametrize(
    "argv", [["prune", "--output-days", "800000"], ["--connect-timeout", "99999", "runs", "list"]]
)
def test_numbers_past_their_range_are_refused_saying_the_limit(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run(capsys, *argv)
    assert code == 2 and "must be at most" in out, out


@pytest.mark.slow  # recomputes through a Dagster run
def test_revise_now_whose_recompute_fails_says_the_revision_stands_in_one_line(
    cli_env: Path,  # noqa: F811
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The suite's own code location: its model step retries after 0.1 s, not the demo's 2 s
    # doubling (the recompute fails through every retry, which is what is being tested).
    ident = SUMMARY_SPEC.identity_for("workspace-acme|2026-08-07")
    ledger.complete(claimed(ledger, ident), {"summary": "first"}, {"report_file": {"n": 1}})
    operator.arm_drill("*", 100, 3600)  # every model call of the recompute fails
    try:
        code, out = run(
            capsys,
            *("-m", "idempotent_jobs_tests.dagster_defs"),
            *("revise", ident.run_id, "--reason", "prompt fixed", "--now"),
        )
    finally:
        operator.disarm_drills()
    assert code == 1, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert "revision 1 recorded" in lines[0] and "recompute failed" in lines[0]
    record = ledger.get(ident.run_id)
    assert record is not None and record.revision == 1 and record.status == "failed"
    assert record.lease_owner is None
    assert dagster_env.model_calls() == 0  # the drill failed every call before it was sent


def test_the_db_commands_never_show_a_configured_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotent_jobs.operator.database_commands import psql_command

    secret = "pw-db-9f3 secret"
    url = f"postgresql://app:{secret.replace(' ', '%20')}@db.example:5432/ledger"
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", url)
    code, out = run(capsys, "db", "env")
    assert code == 2 and "is set" in out and "pw-db" not in out
    code, out = run(capsys, "db", "url")
    assert code == 0 and "db.example" in out and "pw-db" not in out
    argv, env = psql_command(url, ["--", "-c", "select 1"])
    assert env == {"PGPASSWORD": secret}
    assert "pw-db" not in " ".join(argv) and "host=db.example" in argv[0]
    assert argv[1:] == ["-c", "select 1"]


@pytest.mark.parametrize(
    ("scope", "spent_by", "refused"),
    [("job", "", True), ("subject", "workspace-acme", True), ("subject", "other-subject", False)],
)
def test_revise_now_with_a_spent_budget_is_refused_before_the_revision_is_recorded(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    capsys: pytest.CaptureFixture[str],
    scope: str,
    spent_by: str,
    refused: bool,
) -> None:
    """The recompute would be refused by the job's budget (or its subject's): nothing is
    written, and the run stays completed at its revision. Another subject's spend does not
    stop it."""
    ident = COMPETITOR_SUMMARY.identity_for("workspace-acme|2026-08-07")
    ledger.complete(claimed(ledger, ident), {"summary": "first"}, {"report_file": {"n": 1}})
    with LedgerAdmin.beside(ledger) as admin:
        admin.set_budget(Budget(amount=1, scope=scope), job_name=ident.job_name)  # type: ignore[arg-type]
    with ledger.connection() as conn:  # the period's budget is spent, by `spent_by`
        conn.execute("DELETE FROM idempotent_jobs.budget_counters")
        conn.execute(
            "INSERT INTO idempotent_jobs.budget_counters (budget_id, period_start, subject_id,"
            " spent) SELECT budget_id, idempotent_jobs.period_start(period, now()), %s, 1"
            " FROM idempotent_jobs.spend_budgets",
            (spent_by,),
        )
    if not refused:
        with LedgerAdmin.beside(ledger) as admin:
            [standing] = admin.budgets(ident.job_name, subject_id=ident.subject_id)
            assert standing.spent == 0  # the run's own subject has room
        return
    code, out = run(capsys, "revise", ident.run_id, "--reason", "prompt fixed", "--now")
    assert code == 2 and "--now" in out and "no room left" in out, out
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.revision) == ("completed", 0)
