"""The Dagster job executed in process against a real ledger: twice, with op retries."""

import psycopg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs_tests.dagster_defs import NO_RETRY_SPEC, SUMMARY_SPEC, defs
from idempotent_jobs_tests.helpers import backdate, count
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv

PARTITION = "workspace-acme|2026-08-07"


def test_one_partition_executed_twice_does_the_work_once(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    job = defs.resolve_job_def("competitor_summary")
    first = job.execute_in_process(partition_key=PARTITION)
    second = job.execute_in_process(partition_key=PARTITION)
    assert first.success and second.success

    ident = SUMMARY_SPEC.identity_for(PARTITION)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"
    assert record.output == {"summary": "answer #1 for workspace-acme"}
    assert count(db, "runs", ident.run_id) == 1
    assert count(db, "notification_outbox", ident.run_id) == 1
    assert dagster_env.model_calls() == 1 and dagster_env.collect_calls() == 1
    assert [d["key"] for d in dagster_env.delivered()] == [f"{ident.run_id}:report_file"]

    done, again = output_metadata(first), output_metadata(second)
    assert done["persist"]["result"] == "new"
    assert (done["persist"]["ledger_run_id"], done["persist"]["lease_epoch"]) == (ident.run_id, 1)
    assert (done["persist"]["model"], done["persist"]["input_tokens"]) == ("recording-model", 101)
    assert done["deliver"]["delivered_now"] == 1
    assert {again[step]["result"] for step in ("collect", "transform", "persist")} == {"reused"}
    assert again["deliver"]["delivered_now"] == 0
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["completed"]


def test_a_transient_model_error_is_retried_by_the_op_retry_policy(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    dagster_env.script("fail_next")
    result = defs.resolve_job_def("competitor_summary").execute_in_process(partition_key=PARTITION)
    assert result.success
    ident = SUMMARY_SPEC.identity_for(PARTITION)
    assert dagster_env.model_calls() == 2 and dagster_env.collect_calls() == 1
    attempts = operator.attempts(ident.run_id)
    assert [a.outcome for a in attempts] == ["failed", "completed"]
    assert attempts[0].error == "TimeoutError: scripted model timeout on call 1"
    record = ledger.get(ident.run_id)
    assert record is not None and record.output == {"summary": "answer #2 for workspace-acme"}
    assert len(operator.outbox(ident.run_id)) == 1 and len(dagster_env.delivered()) == 1


def test_without_op_retries_the_failure_is_recorded_and_the_next_run_completes(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    dagster_env.script("fail_next")
    job = defs.resolve_job_def("summary_without_op_retries")
    failed = job.execute_in_process(partition_key=PARTITION, raise_on_error=False)
    assert not failed.success
    ident = NO_RETRY_SPEC.identity_for(PARTITION)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "failed"
    assert record.raw_input is not None and record.output is None
    assert operator.outbox(ident.run_id) == []

    retried = job.execute_in_process(partition_key=PARTITION)
    assert retried.success
    assert dagster_env.collect_calls() == 1, "the stored raw input is reused"
    assert dagster_env.model_calls() == 2
    assert output_metadata(retried)["collect"]["result"] == "reused input"
    assert len(dagster_env.delivered()) == 1


def test_the_retention_job_prunes_and_a_pruned_run_is_reused_not_redone(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """The location's ledger_retention job prunes by its specs' policies (competitor-summary:
    raw input 30 days, output 365, attempts 90, delivered payloads 30); the job run again
    reports `reused (output pruned)`, calls no model and sends nothing."""
    from idempotent_jobs.location.definitions import defs as location_defs

    job = defs.resolve_job_def("competitor_summary")
    assert job.execute_in_process(partition_key=PARTITION).success
    ident = SUMMARY_SPEC.identity_for(PARTITION)
    backdate(db, ident.run_id, 400)

    retention = location_defs.resolve_job_def("ledger_retention")
    pruned = retention.execute_in_process()
    assert pruned.success
    [metadata] = output_metadata(pruned).values()
    assert metadata["rows_pruned"] == 4  # raw input, output, one attempt, one payload
    record = ledger.get(ident.run_id)
    assert record is not None and record.output is None and record.output_pruned_at

    again = job.execute_in_process(partition_key=PARTITION)
    assert again.success
    steps = output_metadata(again)
    assert steps["persist"]["result"] == "reused (output pruned)"
    assert steps["deliver"]["delivered_now"] == 0
    assert dagster_env.model_calls() == 1 and len(dagster_env.delivered()) == 1
