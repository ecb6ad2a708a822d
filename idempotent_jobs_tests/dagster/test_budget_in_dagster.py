"""A token budget in Dagster: the step whose model call the budget refuses fails at once,
without the op's retries, with the spend and the budget as metadata; the ledger state is the
one the protocol leaves; the reconciliation job shows spend against budget."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
import psycopg

from idempotent_jobs import (
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    TokenBudget,
    run_idempotent,
)
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import RunLedgerResource, build_idempotent_job
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel, ModelStep, StepContext
from idempotent_jobs_tests.dagster.test_failure_parity import ledger_state
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.specs import job_spec


class OneDocument(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"documents": [identity.subject_id]}


class PaidModel(ModelStep):
    @property
    def model_name(self) -> str:
        return "paid-model"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        return ModelAnswer({"summary": "ok"}, ModelUsage(self.model_name, 10, 5))


SPEC = job_spec(
    "budgeted_summary",
    subjects=["first", "refused", "via-protocol"],
    wait_seconds=0.0,
    model_retry=dg.RetryPolicy(max_retries=3, delay=0.1),  # must not be used when refused
    budget=TokenBudget(tokens_per_day=10),
)
JOB, _ = build_idempotent_job(SPEC)
RECONCILE, _ = build_reconciliation_job([SPEC])


def _defs(env: DagsterTestEnv) -> dg.Definitions:
    return dg.Definitions(
        jobs=[JOB, RECONCILE],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "model": PaidModel(),
            "collector": OneDocument(),
            "report_file": JsonLinesChannel(path=str(env.notifications)),
        },
    )


def test_a_refused_step_fails_without_retry_with_spend_and_budget(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    defs = _defs(dagster_env)
    job = defs.resolve_job_def(SPEC.name)
    operator.set_price("paid-model", "2", "10", effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    first = job.execute_in_process(partition_key="first|2026-08-07")
    assert first.success  # 15 of 10 spent
    [called] = [
        e
        for e in first.all_events
        if e.step_key == "transform" and e.event_type_value == "STEP_OUTPUT"
    ]
    shown = called.step_output_data.metadata
    # Priced as it was recorded: 10 input tokens at 2 and 5 output at 10 per million.
    assert shown["model_cost"].value == "0.00007 USD"
    assert (shown["input_tokens"].value, shown["output_tokens"].value) == (10, 5)

    result = job.execute_in_process(partition_key="refused|2026-08-07", raise_on_error=False)
    assert not result.success
    transform = [e for e in result.all_events if e.step_key and "transform" in e.step_key]
    kinds = [e.event_type_value for e in transform]
    assert "STEP_UP_FOR_RETRY" not in kinds and kinds.count("STEP_FAILURE") == 1
    [failure] = [e for e in transform if e.event_type_value == "STEP_FAILURE"]
    user_failure = failure.step_failure_data.user_failure_data
    assert user_failure is not None
    metadata = {k: getattr(v, "value", v) for k, v in user_failure.metadata.items()}
    assert metadata["budget_spent"] == 15 and metadata["budget_amount"] == 10
    assert metadata["budget"] == f"job:tokens/day:{SPEC.identity_job_name}"
    assert metadata["budget_scope"] == "job" and metadata["result"] == "refused by budget"
    assert "15 of 10 tokens spent" in (user_failure.description or "")

    # The same refusal through the protocol leaves the same ledger state.
    via_protocol = SPEC.identity_for("via-protocol|2026-08-07")
    try:
        run_idempotent(
            ledger,
            via_protocol,
            collect=lambda ident: {"documents": [ident.subject_id]},
            transform=lambda raw: ModelAnswer({"summary": "x"}, ModelUsage("paid-model", 1, 1)),
            budget=SPEC.budget,
        )
        raise AssertionError("the budget should have refused the call")
    except Exception as exc:  # noqa: BLE001 - checked just below
        assert type(exc).__name__ == "BudgetExceededError"
    refused = ledger_state(db, SPEC.identity_for("refused|2026-08-07").run_id)
    protocol = ledger_state(db, via_protocol.run_id)
    # Each stored its checkpoint (the subjects differ, so do the inputs and their fingerprints).
    assert refused.pop("checkpoint") and protocol.pop("checkpoint")
    assert refused == protocol
    assert refused["model_calls"] == [] and refused["status"] == "failed"
    assert [a[1] for a in refused["attempts"]] == ["budget"]

    # The reconciliation job shows spend against budget, and the spent budget is a problem.
    check = defs.resolve_job_def("ledger_reconciliation").execute_in_process(raise_on_error=False)
    assert not check.success
    [failed] = [e for e in check.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failed.step_failure_data.user_failure_data
    assert data is not None
    findings = str(data.metadata["findings"].value)
    assert "budget_spent" in findings and "15 tokens spent" in findings
    assert "of 10 tokens since" in findings
    spend = str(data.metadata["spend_today"].value)
    assert "| budgeted-summary | 1 | 15 | 0 |" in spend
    # Spend against each budget in force, as every worker enforces it.
    budget = f"job:tokens/day:{SPEC.identity_job_name}"
    assert f"| {budget} | budgeted-summary |" in spend and "| yes |" in spend
