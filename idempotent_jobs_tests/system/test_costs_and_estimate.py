"""Prices, spend and estimates on a job that is not in this repository (the ticket-triage
example in a project folder of its own): ``estimate`` says what a backfill will do, and the
backfill then does exactly that."""

import json
from decimal import Decimal
from typing import Any

import pytest

from idempotent_jobs import ModelUsage
from idempotent_jobs.operator.code_location import load_workspace
from idempotent_jobs_tests.ledgers import HarnessLedger
from idempotent_jobs_tests.system.test_any_code_location import cli, project  # noqa: F401

pytestmark = [pytest.mark.slow]


def _calls(ledger: HarnessLedger, job: str = "ticket-triage") -> list[tuple[str, int, str]]:
    """Every model call of ``job``: run id, tokens, outcome, in the order they were made."""
    with ledger.connection() as conn:
        found = conn.execute(
            "SELECT r.run_id, c.input_tokens + c.output_tokens, c.outcome"
            " FROM idempotent_jobs.model_calls c JOIN idempotent_jobs.runs r USING (run_id)"
            " WHERE r.job_name = %s ORDER BY c.call_id",
            (job,),
        ).fetchall()
    return [(str(a), int(b), str(c)) for a, b, c in found]


def test_estimate_agrees_with_the_backfill_that_follows(
    project: dict[str, Any],  # noqa: F811
    database: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workspace = load_workspace()
    [spec] = workspace.specs
    job = workspace.locations[0].defs.resolve_job_def("ticket_triage")
    code, out = cli(capsys, "prices", "set", "keyword-triage", "--input", "2.5", "--output", "10")
    assert code == 0, out
    # History: two accepted runs, and one failed call of a third partition.
    for key in ("support|2026-11-02", "sales|2026-11-02"):
        assert job.execute_in_process(partition_key=key).success
    with HarnessLedger(database) as ledger:
        _, lease = ledger.begin(spec.identity_for("support|2026-11-03"), "w", 30)
        assert lease is not None
        ledger.fail(lease, "model timed out", ModelUsage("keyword-triage", 40, 0), call="failed")
        history = _calls(ledger)
    [(_, per_run, _), _, (_, failed_tokens, failed)] = history
    assert failed == "failed" and failed_tokens == 40 and per_run > 0

    code, out = cli(
        capsys, "estimate", "--job", "ticket_triage", "--from", "2026-11-02", "--to", "2026-11-04"
    )
    assert code == 0, out
    assert "6 partition(s)" in out and "already done (no model call): 2" in out
    assert "\n  would be computed: 4\n" in out  # one line each, not escaped
    code, out = cli(
        capsys,
        "estimate",
        "--json",
        "--job",
        "ticket-triage",
        "--from",
        "2026-11-02",
        "--to",
        "2026-11-04",
    )
    assert code == 0, out
    estimate = json.loads(out)
    assert (estimate["done"], estimate["to_compute"], estimate["expected_calls"]) == (2, 4, 4)
    assert estimate["expected_tokens"] == 4 * per_run
    assert estimate["failure_calls"] == 2.0 and estimate["failure_tokens"] == 80.0
    price = (Decimal(per_run // 2) * Decimal("2.5") + Decimal(per_run // 2) * 10) / 1_000_000
    assert Decimal(str(estimate["expected_cost"])) == 4 * price

    # The backfill: every partition of the range, as Dagster's backfill launches them.
    for key in estimate["to_compute_keys"] + ["support|2026-11-02", "sales|2026-11-02"]:
        assert job.execute_in_process(partition_key=key).success
    with HarnessLedger(database) as ledger:
        made = _calls(ledger)[len(history) :]
    assert len(made) == estimate["expected_calls"]  # one call per partition computed
    assert len({run_id for run_id, _, _ in made}) == estimate["to_compute"]
    assert sum(tokens for _, tokens, _ in made) == estimate["expected_tokens"]
    assert {outcome for _, _, outcome in made} == {"accepted"}

    # Spend today, with money, in runs stats; and the money of one run in runs show.
    capsys.readouterr()  # the runs' own logs
    code, out = cli(capsys, "runs", "stats", "--json")
    assert code == 0, out
    stats = json.loads(out)
    [spend] = stats["spend"]
    assert spend["calls"] == 7 and spend["tokens"] == 6 * per_run + 40
    assert spend["wasted_tokens"] == 40
    # The budgets the example's spec declared are the ledger's now, with the day's spend.
    budgets = {b["budget_id"]: b for b in stats["budgets"]}
    day = budgets["job:tokens/day:ticket-triage"]
    figures = [Decimal(day[k]) for k in ("amount", "spent", "reserved")]
    assert figures == [2_000_000, 6 * per_run + 40, 0]
    assert Decimal(budgets["subject:tokens/day:ticket-triage"]["amount"]) == 500_000
    assert Decimal(spend["cost"]) == 6 * price + Decimal(40) * Decimal("2.5") / 1_000_000
    code, out = cli(capsys, "runs", "show", made[0][0][:12])
    assert code == 0, out
    assert f"money: {float(price):,.6f} USD accepted" in out

    code, out = cli(
        capsys, "estimate", "--job", "ticket_triage", "--from", "2026-10-01", "--to", "2026-11-04"
    )
    assert code == 2 and "--from: '2026-10-01' is not a window of job ticket_triage" in out
