"""``idempotent-jobs launch`` with no Dagster daemon takes its own runs off the run queue, and
only those: two launches at once on one instance never start each other's runs, so each run has
one run worker (a second worker, finding the run started, would mark it failed while the first
completes it)."""

import dagster as dg

from idempotent_jobs.operator.ui_launch import dequeue, submit
from idempotent_jobs_tests.dagster_defs import SUMMARY_SPEC
from testkit.dagster_harness import LOCATION, DagsterTestEnv, dagster_instance, workspace

QUEUED, SUCCESS = dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.SUCCESS


def test_a_launch_dequeues_its_own_runs_only(dagster_env: DagsterTestEnv) -> None:
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:

        def status(run_id: str) -> dg.DagsterRunStatus:
            run = instance.get_run_by_id(run_id)
            assert run is not None
            return run.status

        # Two launches' runs, queued on one instance (as two `launch` commands at once).
        mine = submit(context, LOCATION, SUMMARY_SPEC, "workspace-acme|2026-08-07", {})
        theirs = submit(context, LOCATION, SUMMARY_SPEC, "workspace-globex|2026-08-07", {})
        assert (mine.status, theirs.status) == (QUEUED, QUEUED)
        dequeue(context, [mine])  # here the launcher runs a run as it is dequeued
        assert (status(mine.run_id), status(theirs.run_id)) == (SUCCESS, QUEUED)
        assert dagster_env.model_calls() == 1
        dequeue(context, [theirs])  # the other launch takes its own
        assert status(theirs.run_id) == SUCCESS
        assert dagster_env.model_calls() == 2


def test_another_launchs_runs_queued_ahead_take_no_place_under_the_queue_limit(
    dagster_env: DagsterTestEnv,
) -> None:
    """A run queue that starts one run at a time, and another launch's run queued ahead (its
    launch died, or has not dequeued yet): this launch's run still starts, and the other's stays
    queued for its own launch."""
    with (
        dagster_instance(dagster_env, run_queue={"max_concurrent_runs": 1}) as instance,
        workspace(instance) as context,
    ):
        theirs = submit(context, LOCATION, SUMMARY_SPEC, "workspace-globex|2026-08-07", {})
        mine = submit(context, LOCATION, SUMMARY_SPEC, "workspace-acme|2026-08-07", {})
        assert (theirs.status, mine.status) == (QUEUED, QUEUED)
        dequeue(context, [mine])
        statuses = {r.run_id: r.status for r in instance.get_runs()}
        assert (statuses[mine.run_id], statuses[theirs.run_id]) == (SUCCESS, QUEUED)
        assert dagster_env.model_calls() == 1
