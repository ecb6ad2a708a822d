"""Behaviour that lives in a Dagster instance: backfills, re-execution, run retries.

The instance is configured by the project's dagster.yaml (PostgreSQL storage, run retries);
runs are submitted through the same GraphQL mutations the UI uses and executed in process.
"""

from pathlib import Path

import dagster as dg
import psycopg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.dagster_defs import (
    FLAKY_IO_SPEC,
    LEDGER_IO_SPEC,
    MULTIPROCESS_SPEC,
    NO_RETRY_SPEC,
    SUMMARY_SPEC,
)
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import (
    DagsterTestEnv,
    dagster_instance,
    launch_backfill,
    launch_partition,
    reexecute,
    reexecute_steps,
    run_backfill_daemon,
    run_retry_daemon,
    step_metadata,
    workspace,
)

pytestmark = [pytest.mark.slow, pytest.mark.dagster_instance]

PARTITION = "workspace-acme|2026-08-07"


def status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def test_a_backfill_submitted_twice_runs_each_partition_once(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    partitions = [
        f"{subject}|{day}"
        for subject in SUMMARY_SPEC.subjects
        for day in ("2026-08-05", "2026-08-06")
    ]
    assert len(partitions) == 6
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        for _ in range(2):
            backfill_id = launch_backfill(context, "competitor_summary", partitions)
            run_backfill_daemon(context, backfill_id)
        runs = instance.get_runs()
        assert len(runs) == 12
        assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    assert dagster_env.model_calls() == 6 and dagster_env.collect_calls() == 6
    rows = db.execute("SELECT status, count(*) FROM idempotent_jobs.runs GROUP BY 1").fetchall()
    assert rows == [("completed", 6)]
    assert db.execute("SELECT count(*) FROM idempotent_jobs.notification_outbox").fetchone() == (6,)
    assert db.execute("SELECT max(lease_epoch) FROM idempotent_jobs.runs").fetchone() == (1,)
    assert len(dagster_env.delivered()) == 6
    for key in partitions:
        record = ledger.get(SUMMARY_SPEC.identity_for(key).run_id)
        assert record is not None and record.status == "completed"


def test_reexecution_from_failure_reuses_the_checkpoint_and_then_changes_nothing(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    job = "summary_without_op_retries"
    dagster_env.script("fail_next")
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        failed = launch_partition(context, job, PARTITION)
        assert status(instance, failed) == dg.DagsterRunStatus.FAILURE
        assert (dagster_env.collect_calls(), dagster_env.model_calls()) == (1, 1)

        retried = reexecute(context, failed, "FROM_FAILURE")
        assert status(instance, retried) == dg.DagsterRunStatus.SUCCESS
        assert dagster_env.collect_calls() == 1, "collect is not run again; its checkpoint is"
        assert dagster_env.model_calls() == 2
        assert step_metadata(instance, retried, "persist")["result"] == "new"

        again = reexecute(context, retried, "ALL_STEPS")
        assert status(instance, again) == dg.DagsterRunStatus.SUCCESS
        assert step_metadata(instance, again, "persist")["result"] == "reused"
    ident = NO_RETRY_SPEC.identity_for(PARTITION)
    assert (dagster_env.collect_calls(), dagster_env.model_calls()) == (1, 2)
    assert len(operator.outbox(ident.run_id)) == 1 and len(dagster_env.delivered()) == 1
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["failed", "completed"]


def test_a_run_retry_after_transform_crashes_completes_once(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    job = "summary_without_op_retries"
    dagster_env.script("fail_next")
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        failed = launch_partition(context, job, PARTITION)
        assert status(instance, failed) == dg.DagsterRunStatus.FAILURE
        run_retry_daemon(context)
        run_retry_daemon(context)  # a second pass must not retry the same run again
        runs = instance.get_runs()
        assert len(runs) == 2
        retry = next(r for r in runs if r.run_id != failed)
        assert retry.tags.get("dagster/parent_run_id") == failed
        assert retry.status == dg.DagsterRunStatus.SUCCESS
    ident = NO_RETRY_SPEC.identity_for(PARTITION)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"
    assert (dagster_env.collect_calls(), dagster_env.model_calls()) == (1, 2)
    assert len(operator.outbox(ident.run_id)) == 1 and len(dagster_env.delivered()) == 1


def test_the_multiprocess_executor_hands_the_lease_over_between_processes(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """Dagster's multiprocess executor runs each op in its own process: one claim, one epoch."""
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        run_id = launch_partition(context, "summary_multiprocess", PARTITION)
        assert status(instance, run_id) == dg.DagsterRunStatus.SUCCESS
        starts = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START)
        pids = {
            r.event_log_entry.step_key: r.event_log_entry.dagster_event.pid  # type: ignore[union-attr]
            for r in starts.records
        }
        epochs = {
            step: step_metadata(instance, run_id, step).get("lease_epoch")
            for step in ("collect", "transform", "persist")
        }
    assert len({pids[s] for s in ("collect", "transform", "persist")}) == 3, pids
    assert epochs == {"collect": 1, "transform": 1, "persist": 1}
    ident = MULTIPROCESS_SPEC.identity_for(PARTITION)
    [attempt] = operator.attempts(ident.run_id)
    # One claim (collect's), taken over by transform in another process: the attempt names the
    # last step that took it over.
    assert (attempt.lease_epoch, attempt.outcome, attempt.caller_step) == (
        1,
        "completed",
        "transform",
    )
    assert dagster_env.model_calls() == 1 and len(dagster_env.delivered()) == 1


def test_ops_in_separate_processes_hand_tickets_over_through_the_ledger_alone(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """As in a pod per step: each op in a process of its own, and what one hands the next is
    kept in the ledger (``ledger_io_manager``), never in the instance's local storage."""
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        run_id = launch_partition(context, "summary_ledger_io", PARTITION)
        assert status(instance, run_id) == dg.DagsterRunStatus.SUCCESS
        starts = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START)
        pids = {r.event_log_entry.dagster_event.pid for r in starts.records}  # type: ignore[union-attr]
        storage = Path(instance.storage_directory()) / run_id
    assert len(pids) == 4, pids
    # Dagster's filesystem IO manager would have written storage/<run>/<step>/result.
    written = [p for p in storage.rglob("*") if p.is_file() and "compute_logs" not in p.parts]
    assert written == []
    stored = db.execute(
        "SELECT step_key FROM idempotent_jobs.step_outputs WHERE dagster_run_id = %s"
        " ORDER BY step_key",
        (run_id,),
    ).fetchall()
    assert stored == [("collect",), ("persist",), ("transform",)]
    ident = LEDGER_IO_SPEC.identity_for(PARTITION)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"
    assert [c.outcome for c in ledger.model_calls(ident.run_id)] == ["accepted"]
    assert dagster_env.model_calls() == 1 and len(dagster_env.delivered()) == 1


def test_reexecution_after_storage_failed_commits_the_recorded_answer(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """``persist`` cannot load its ticket (the object store timed out): the attempt ends at
    once, the paid call is in the books, and the UI's re-execution from failure commits that
    answer with no second model call."""
    ident = FLAKY_IO_SPEC.identity_for(PARTITION)
    dagster_env.script("fail_load_once")
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        failed = launch_partition(context, "summary_flaky_storage", PARTITION)
        assert status(instance, failed) == dg.DagsterRunStatus.FAILURE
        record = ledger.get(ident.run_id)
        assert record is not None and (record.status, record.lease_owner) == ("failed", None)
        assert "step persist failed" in (record.last_error or "")
        assert [(c.outcome, c.input_tokens) for c in ledger.model_calls(ident.run_id)] == [
            ("answered", 101)
        ]
        retried = reexecute(context, failed, "FROM_FAILURE")
        assert status(instance, retried) == dg.DagsterRunStatus.SUCCESS
        assert step_metadata(instance, retried, "persist")["result"] == "new"
    assert dagster_env.model_calls() == 1
    assert [c.outcome for c in ledger.model_calls(ident.run_id)] == ["accepted"]
    assert [a.outcome for a in operator.attempts(ident.run_id)] == ["failed", "completed"]
    assert len(dagster_env.delivered()) == 1


def test_reexecuting_an_old_runs_persist_after_a_revise_commits_nothing(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    """The old run's answer was computed on revision 0: after a revise it is stale. Its
    re-executed persist claims the reopened run and is refused; nothing is stored or sent."""
    ident = NO_RETRY_SPEC.identity_for(PARTITION)
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        old = launch_partition(context, "summary_without_op_retries", PARTITION)
        assert status(instance, old) == dg.DagsterRunStatus.SUCCESS
        operator.revise(ident.run_id, "prompt fixed", channels=["report_file"], recollect=True)

        stale = reexecute_steps(context, old, ["persist", "deliver"])
        assert status(instance, stale) == dg.DagsterRunStatus.FAILURE
        record = ledger.get(ident.run_id)
        assert record is not None
        assert (record.status, record.revision, record.output, record.raw_input) == (
            "pending",
            1,
            None,
            None,
        )
        assert [o.revision for o in operator.outbox(ident.run_id)] == [0]
        attempts = operator.attempts(ident.run_id)
        assert attempts[-1].outcome == "superseded"
        assert attempts[-1].error is not None and "stale candidate" in attempts[-1].error

        fresh = launch_partition(context, "summary_without_op_retries", PARTITION)
        assert status(instance, fresh) == dg.DagsterRunStatus.SUCCESS
    record = ledger.get(ident.run_id)
    assert record is not None and (record.status, record.revision) == ("completed", 1)
    assert record.output == {"summary": "answer #2 for workspace-acme"}
    assert (dagster_env.collect_calls(), dagster_env.model_calls()) == (2, 2)
    assert [d["key"] for d in dagster_env.delivered()] == [
        f"{ident.run_id}:report_file",
        f"{ident.run_id}:report_file:r1",
    ]


def test_the_failure_drill_then_reexecution_from_failure(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's drill, with no code change: arm it (in the ledger, so the run worker sees
    it), launch, re-execute from failure."""
    from idempotent_jobs.operator.cli import main

    monkeypatch.setenv("IDEMPOTENT_JOBS_HOME", str(dagster_env.tmp_path / "home"))
    assert main(["drill", "fail-model-calls", "1"]) == 0
    assert "the next 1 model call(s) of every job will fail" in capsys.readouterr().out
    assert main(["doctor"]) == 0
    assert "failure drill armed for every job: the next 1 model call(s)" in (
        capsys.readouterr().out
    )
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        failed = launch_partition(context, "summary_without_op_retries", PARTITION)
        assert status(instance, failed) == dg.DagsterRunStatus.FAILURE
        assert operator.drills() == []  # used up
        retried = reexecute(context, failed, "FROM_FAILURE")
        assert status(instance, retried) == dg.DagsterRunStatus.SUCCESS
        assert step_metadata(instance, retried, "transform")["result"] == "model called"
    ident = NO_RETRY_SPEC.identity_for(PARTITION)
    assert (dagster_env.collect_calls(), dagster_env.model_calls()) == (1, 1)
    [failure, success] = operator.attempts(ident.run_id)
    assert failure.outcome == "drill" and failure.error is not None
    assert failure.error.startswith("ModelOutageDrill: model outage drill")
    assert success.outcome == "completed" and len(dagster_env.delivered()) == 1
    assert ledger.model_calls(ident.run_id)[0].outcome == "accepted"  # the drill is no call
    assert len(ledger.model_calls(ident.run_id)) == 1
    assert main(["drill", "off"]) == 0 and operator.drills() == []
