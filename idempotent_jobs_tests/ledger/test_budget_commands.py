"""``budgets set|list|clear``, ``prices set --from``, ``runs spend``: the operator's side of
budgets and prices, through the CLI as an operator types it."""

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from idempotent_jobs import (
    BudgetExceededError,
    JobConfig,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    run_idempotent,
)
from idempotent_jobs_tests.ledger.test_operator_cli import cli_env, run  # noqa: F401
from idempotent_jobs_tests.ledgers import HarnessLedger


def _call(ledger: HarnessLedger, job: str, subject: str, tokens: int = 1000) -> None:
    run_idempotent(
        ledger,
        RunIdentity(job, subject, datetime(2026, 12, 1, 9, tzinfo=UTC), "v1"),
        collect=lambda i: {"x": 1},
        transform=lambda raw: ModelAnswer(
            {"summary": "s"}, ModelUsage("m", tokens, 0, cache_read_tokens=tokens // 2)
        ),
        config=JobConfig.of(prompt="", model="m", validator=""),
        max_tokens_per_call=tokens,
    )


def test_an_operators_group_budget_caps_every_job_of_the_group(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(
        capsys, "budgets", "set", "--group", "team-a", "--job", "one", "--job", "two",
        "--tokens", "2500", "--per", "month",
    )  # fmt: skip
    assert code == 0, out
    assert "group:tokens/month:team-a" in out and "one, two" in out
    _call(ledger, "one", "a")
    _call(ledger, "two", "a")
    with pytest.raises(BudgetExceededError):
        _call(ledger, "one", "b")  # 2,000 + a worst case of 1,000 > 2,500
    _call(ledger, "three", "a")  # not in the group
    code, out = run(capsys, "budgets", "list", "--json")
    [standing] = json.loads(out)
    assert (standing["spent"], standing["reserved"], standing["jobs"]) == (
        "2000",
        "0",
        ["one", "two"],
    )
    code, out = run(capsys, "budgets", "list", "--job", "three")
    assert code == 0 and out.strip() == "no budgets"
    code, out = run(capsys, "budgets", "clear", "--group", "team-a", "--per", "month")
    assert code == 0 and "cleared group:tokens/month:team-a" in out
    _call(ledger, "one", "b")
    code, out = run(capsys, "budgets", "clear", "group:tokens/month:team-a")
    assert code == 2 and "no budget" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["budgets", "set", "--job", "j", "--tokens", "1.5"], "--tokens: must be a whole number"),
        (["budgets", "set", "--job", "j", "--tokens", "1", "--money", "1"], "one"),
        (["budgets", "set", "--job", "j", "--tokens", "1000000000000000000000"], "10^18"),
        (["budgets", "set", "--job", "j", "--money", "abc"], "--money: must be a number"),
        (["budgets", "set", "--group", "g", "--tokens", "5"], "its jobs"),
        (["prices", "set", "m", "--input", "1", "--output", "1", "--from", "soon"], "--from"),
        (["prices", "set", "m", "--input", "-1", "--output", "1"], "--input: must be from 0"),
        (
            ["prices", "set", "m", "--input", "1", "--output", "1", "--reasoning", "x"],
            "--reasoning",
        ),
        (
            ["prices", "set", "m", "--input", "1", "--output", "1", "--currency", "EURO"],
            "--currency",
        ),
        (["limits", "set", "p", "m", "--requests-per-minute", "0"], "--requests-per-minute"),
    ],
)
def test_a_bad_budget_price_or_limit_is_one_line_naming_the_argument(
    cli_env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    words: str,
) -> None:
    code, out = run(capsys, *argv)
    assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out


def test_a_months_spend_by_kind_at_two_prices(
    cli_env: Path,  # noqa: F811
    ledger: HarnessLedger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(capsys, "prices", "set", "m", "--input", "2", "--output", "8",
               "--cache-read", "1", "--from", "2026-11-01")[0] == 0  # fmt: skip
    _call(ledger, "spender", "a")
    with ledger.connection() as conn:  # the first call was made mid-November
        conn.execute("UPDATE idempotent_jobs.model_calls SET called_at = '2026-11-15 09:00Z'")
    assert run(capsys, "prices", "set", "m", "--input", "1", "--output", "4",
               "--from", "2026-11-20")[0] == 0  # fmt: skip
    _call(ledger, "spender", "b")
    with ledger.connection() as conn:
        conn.execute(
            "UPDATE idempotent_jobs.model_calls SET called_at = '2026-11-25 09:00Z'"
            " WHERE called_at > '2026-11-16'"
        )
    code, out = run(capsys, "runs", "spend", "--month", "2026-11", "--json")
    assert code == 0, out
    spend = json.loads(out)
    rows = [(r["kind"], r["tokens"], Decimal(r["money"])) for r in spend["rows"]]
    # 500 uncached at 2 and 500 read at 1; then at the new price: 500 at 1, 500 read at 1
    # (the new price has no cache-read price: the input price).
    assert rows == [
        ("input", 500, Decimal("0.001")),
        ("cache read", 500, Decimal("0.0005")),
        ("input", 500, Decimal("0.0005")),
        ("cache read", 500, Decimal("0.0005")),
    ]
    assert Decimal(spend["total"]) == Decimal("0.0025")
    code, out = run(capsys, "runs", "spend", "--month", "2026-11")
    assert "2026-11-01 00:00" in out and "2026-11-20 00:00" in out and "total: 0.0025" in out
