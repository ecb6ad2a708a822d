"""Reconciliation finds each planted inconsistency between the ledger and Dagster, and nothing
in a clean pair."""

import dataclasses
import logging
import warnings

import dagster as dg
import psycopg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.health import dagster_findings, drift_findings, ledger_findings
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC, RecordingModel, defs
from idempotent_jobs_tests.helpers import expire_lease, identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import (
    DagsterTestEnv,
    dagster_instance,
    launch_partition,
    run_retry_daemon,
    workspace,
)

TWICE = "workspace-acme|2026-08-05"
REOPENED = "workspace-globex|2026-08-05"


def findings(operator: LedgerAdmin, instance: dg.DagsterInstance) -> set[tuple[str, str | None]]:
    found = dagster_findings(operator, instance, [SUMMARY_SPEC]) + ledger_findings(
        operator, outbox_older_than_seconds=600, max_attempts=3
    )
    return {(f.kind, f.run_id) for f in found}


@pytest.mark.dagster_instance
def test_reconcile_finds_each_planted_inconsistency(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    db: psycopg.Connection,
) -> None:
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        launch_partition(context, "competitor_summary", TWICE)
        launch_partition(context, "competitor_summary", REOPENED)
        assert findings(operator, instance) == set(), "a clean ledger and Dagster agree"
        job, _ = build_reconciliation_job([SUMMARY_SPEC])
        resources = {
            "ledger": ledger,
            "model": RecordingModel(calls_dir=str(dagster_env.calls_dir)),
        }
        clean = job.execute_in_process(instance=instance, resources=resources)
        assert clean.success

        launch_partition(context, "competitor_summary", TWICE)  # informational duplicate
        reopened = SUMMARY_SPEC.identity_for(REOPENED).run_id
        operator.revise(reopened, "planted: Dagster says success, the ledger has no result")
        stuck = identity("stuck-co")
        ledger.register(stuck)
        assert ledger.claim(stuck.run_id, "vanished-worker", 600) is not None
        expire_lease(db, stuck.run_id)
        db.execute(
            "UPDATE idempotent_jobs.notification_outbox SET delivered_at = NULL,"
            " created_at = now() - interval '1 hour' WHERE run_id = %s",
            (SUMMARY_SPEC.identity_for(TWICE).run_id,),
        )
        found = dagster_findings(operator, instance, [SUMMARY_SPEC])
        several = [f for f in found if f.kind == "several_dagster_runs"]
        assert len(several) == 1 and several[0].severity == "info"
        assert several[0].partition == TWICE and len(several[0].dagster_run_ids) == 2
        assert findings(operator, instance) == {
            ("several_dagster_runs", SUMMARY_SPEC.identity_for(TWICE).run_id),
            ("success_without_result", reopened),
            ("expired_lease", stuck.run_id),
            ("undelivered_outbox", SUMMARY_SPEC.identity_for(TWICE).run_id),
        }

        result = job.execute_in_process(
            instance=instance, resources=resources, raise_on_error=False
        )
        assert not result.success, "problems make the reconciliation run fail (red in the UI)"
        failure = result.failure_data_for_node("reconcile_ledger")
        assert failure is not None
        metadata = failure.user_failure_data.metadata  # type: ignore[union-attr]
        assert metadata["problems"].value == 3 and metadata["informational"].value == 1
        assert "success_without_result" in str(metadata["findings"].value)


def test_configuration_drift_is_reported_never_silent(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """The prompt changes without a version bump: completed runs are reused (the identity is
    deliberately job, subject, window, version), but every report says so."""
    job = defs.resolve_job_def("competitor_summary")
    assert job.execute_in_process(partition_key=TWICE).success
    record = ledger.get(SUMMARY_SPEC.identity_for(TWICE).run_id)
    assert record is not None
    assert record.config_parts == dict(SUMMARY_SPEC.config("recording-model").parts)

    reworded = dataclasses.replace(SUMMARY_SPEC, prompt="Summarise, in French.")
    reworded_job, _ = build_idempotent_job(reworded, executor_def=dg.in_process_executor)
    again = dg.Definitions(jobs=[reworded_job], resources=defs.resources).resolve_job_def(
        "competitor_summary"
    )
    result = again.execute_in_process(partition_key=TWICE)
    assert result.success and dagster_env.model_calls() == 1, "reused, no second model call"
    reported = {s: m["result"] for s, m in output_metadata(result).items() if "result" in m}
    assert reported == {
        "collect": "reused (config changed: prompt)",
        "transform": "reused (config changed: prompt)",
        "persist": "reused (config changed: prompt)",
    }

    [drift] = drift_findings(
        operator, [reworded], {reworded.name: reworded.config("recording-model")}
    )
    assert (drift.kind, drift.severity, drift.run_id) == ("config_drift", "info", record.run_id)
    assert "another prompt" in drift.detail and "revise" in drift.detail
    assert "bump version 'v1'" in drift.detail
    assert (
        drift_findings(
            operator,
            [SUMMARY_SPEC],
            {SUMMARY_SPEC.name: SUMMARY_SPEC.config("recording-model")},
        )
        == []
    )
    [model_drift] = drift_findings(
        operator, [SUMMARY_SPEC], {SUMMARY_SPEC.name: SUMMARY_SPEC.config("other-model")}
    )
    assert "another model" in model_drift.detail
    assert drift_findings(operator, [reworded], {}) == [], "no known model step: not compared"

    with dagster_instance(dagster_env) as instance:
        check, _ = build_reconciliation_job([reworded])
        resources = {
            "ledger": ledger,
            "model": RecordingModel(calls_dir=str(dagster_env.calls_dir)),
        }
        verdict = check.execute_in_process(instance=instance, resources=resources)
    assert verdict.success, "drift is informational"
    metadata = output_metadata(verdict)["reconcile_ledger"]
    assert metadata["informational"] == 1 and "config_drift" in metadata["findings"]


@pytest.mark.dagster_instance
def test_a_failed_reconciliation_is_not_retried(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """dagster.yaml retries failed runs twice; a standing problem must still give one red run
    per check, not three."""
    stuck = identity("stuck-co")
    ledger.register(stuck)
    assert ledger.claim(stuck.run_id, "vanished-worker", 600) is not None
    expire_lease(db, stuck.run_id)
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        failed = launch_partition(context, "ledger_reconciliation", None)
        run = instance.get_run_by_id(failed)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        assert run.tags.get("dagster/max_retries") == "0"
        run_retry_daemon(context)
        run_retry_daemon(context)
        assert [r.run_id for r in instance.get_runs()] == [failed], "no retry was launched"


def test_many_drifted_runs_are_listed_up_to_a_cap(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    from datetime import UTC, datetime

    from idempotent_jobs import RunIdentity
    from idempotent_jobs.dagster.health import MAX_DRIFT_FINDINGS

    config = SUMMARY_SPEC.config("recording-model")
    for n in range(MAX_DRIFT_FINDINGS + 1):
        ident = RunIdentity(
            "competitor-summary", f"subject-{n}", datetime(2026, 8, 7, tzinfo=UTC), "v1"
        )
        lease = ledger.begin(ident, "w", 30)[1]
        assert lease is not None
        ledger.complete(lease, {"summary": "s"}, config=config)
    found = drift_findings(
        operator, [SUMMARY_SPEC], {SUMMARY_SPEC.name: SUMMARY_SPEC.config("other-model")}
    )
    assert len(found) == MAX_DRIFT_FINDINGS + 1
    assert all(f.run_id for f in found[:-1]) and found[-1].run_id is None
    assert f"more than {MAX_DRIFT_FINDINGS} runs" in found[-1].detail
    assert (
        drift_findings(
            operator,
            [SUMMARY_SPEC],
            {SUMMARY_SPEC.name: SUMMARY_SPEC.config("recording-model")},
        )
        == []
    )


def test_a_workspace_leaves_the_process_logging_as_it_found_it(
    dagster_env: DagsterTestEnv,
) -> None:
    """Dagster's daemon workspace configures its loggers on the ``sys.stdout`` of the moment
    (this test's capture) and its own ``warnings.showwarning``: both are put back as it ends, or
    a later test in this process that logs through Dagster gets a closed stream."""
    dagster_logger = logging.getLogger("dagster")
    before = (dagster_logger.handlers[:], dagster_logger.level, warnings.showwarning)
    with dagster_instance(dagster_env) as instance, workspace(instance):
        assert dagster_logger.handlers != before[0]  # configured for the daemon meanwhile
    assert (dagster_logger.handlers, dagster_logger.level, warnings.showwarning) == before
