"""Code run in child processes by the concurrency tests (importable under ``spawn``)."""

import multiprocessing.synchronize
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from idempotent_jobs import JobConfig, RunIdentity, RunLedger, run_idempotent
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def race_run_idempotent(
    conninfo: str,
    barrier: multiprocessing.synchronize.Barrier,
    release_winner: multiprocessing.synchronize.Event,
    out: "multiprocessing.Queue[dict[str, Any]]",
) -> None:
    """Run the protocol on the shared identity; the model blocks until the parent says go."""
    model_calls = 0
    collect_calls = 0

    def collect(_: object) -> dict[str, Any]:
        nonlocal collect_calls
        collect_calls += 1
        return {"docs": [f"collected by {os.getpid()}"]}

    def transform(raw: dict[str, Any]) -> dict[str, Any]:
        nonlocal model_calls
        model_calls += 1
        out.put({"event": "model-started", "pid": os.getpid()})
        release_winner.wait(timeout=120)
        return {"summary": f"answer from {os.getpid()}"}

    with HarnessLedger(conninfo) as ledger:
        barrier.wait()
        outcome = run_idempotent(
            ledger,
            identity(),
            collect=collect,
            transform=transform,
            notifications=lambda o: {"email": {"body": o["summary"]}},
        )
    out.put(
        {
            "event": "done",
            "pid": os.getpid(),
            "executed": outcome.executed,
            "status": outcome.status,
            "model_calls": model_calls,
            "collect_calls": collect_calls,
        }
    )


def race_claim(
    conninfo: str,
    run_id: str,
    barrier: multiprocessing.synchronize.Barrier,
    out: "multiprocessing.Queue[int | None]",
) -> None:
    with HarnessLedger(conninfo) as ledger:
        barrier.wait()
        lease = ledger.claim(run_id, f"worker-{os.getpid()}", 60)
    out.put(lease.epoch if lease else None)


def hold_lease_then_hang(conninfo: str, run_id: str, lease_seconds: float) -> None:
    """Claim, print the expiry, then hang until killed (a worker that dies holding a lease)."""
    with HarnessLedger(conninfo) as ledger:
        lease = ledger.claim(run_id, f"doomed-{os.getpid()}", lease_seconds)
        assert lease is not None and lease.expires_at is not None
        sys.stdout.write(f"{lease.epoch} {lease.expires_at.isoformat()}\n")
        sys.stdout.flush()
        multiprocessing.Event().wait()


if __name__ == "__main__":
    hold_lease_then_hang(sys.argv[1], sys.argv[2], float(sys.argv[3]))


def execute_partition(
    job_name: str,
    partition_key: str,
    env: dict[str, str],
    out: "multiprocessing.Queue[dict[str, Any]]",
) -> None:
    """Run one partition of the test code location in this process (a separate Dagster run)."""
    os.environ.update(env)
    from idempotent_jobs.dagster.results import output_metadata
    from idempotent_jobs_tests.dagster_defs import defs

    result = defs.resolve_job_def(job_name).execute_in_process(
        partition_key=partition_key, raise_on_error=False
    )
    persisted = output_metadata(result).get("persist", {})
    out.put({"pid": os.getpid(), "success": result.success, "persist": persisted})


def run_deployment(
    name: str,
    tmp: str,
    env: dict[str, str],
    tick_iso: str,
    barrier: multiprocessing.synchronize.Barrier,
    out: "multiprocessing.Queue[dict[str, Any]]",
) -> None:
    """One Dagster deployment: its own DAGSTER_HOME and storage, the shared ledger. Evaluate the
    schedule's tick and launch what it requests (through the UI's mutation)."""
    os.environ.update(env)
    from datetime import datetime
    from pathlib import Path

    import dagster as dg

    from idempotent_jobs_tests.dagster_defs import defs
    from testkit.dagster_harness import (
        DagsterTestEnv,
        dagster_instance,
        launch_partition,
        step_metadata,
        workspace,
    )

    deployment = DagsterTestEnv(env["IDEMPOTENT_JOBS_DATABASE_URL"], Path(tmp) / name)
    deployment.tmp_path.mkdir(parents=True, exist_ok=True)
    schedule = defs.resolve_schedule_def("competitor_summary_schedule")
    with dagster_instance(deployment) as instance, workspace(instance) as context:
        tick = schedule.evaluate_tick(
            dg.build_schedule_context(
                instance=instance, scheduled_execution_time=datetime.fromisoformat(tick_iso)
            )
        )
        requests = list(tick.run_requests or [])
        barrier.wait()  # both deployments launch the same tick at once
        runs = {}
        for request in requests:
            run_id = launch_partition(context, "competitor_summary", str(request.partition_key))
            run = instance.get_run_by_id(run_id)
            runs[str(request.partition_key)] = {
                "status": run.status.value if run else "missing",
                "result": step_metadata(instance, run_id, "persist").get("result"),
                "run_key": request.run_key,
            }
        out.put({"deployment": name, "runs": runs, "dagster_runs": len(instance.get_runs())})


def live_runs_while_pruning(
    conninfo: str,
    subject: str,
    started: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    out: "multiprocessing.Queue[dict[str, Any]]",
) -> None:
    """New runs of the current windows, one after another, until ``stop`` (at least five);
    reports how many runs it completed and executed."""
    done = executed = 0
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    with RunLedger(conninfo) as ledger:
        hour = 0
        while not stop.is_set() or hour < 5:
            outcome = run_idempotent(
                ledger,
                RunIdentity("competitor-summary", subject, now + timedelta(hours=hour), "v1"),
                collect=lambda _: {"documents": [f"live document of {subject}"]},
                transform=lambda raw: {"summary": f"live answer for {subject}"},
                notifications=lambda o: {"email": {"body": o["summary"]}},
            )
            done += outcome.status == "completed"
            executed += outcome.executed
            hour += 1
            started.set()
    out.put({"subject": subject, "done": done, "executed": executed})


def spend_until_refused(
    conninfo: str,
    worker: int,
    budget: Any,
    call_tokens: int,
    start: multiprocessing.synchronize.Barrier,
    in_flight: multiprocessing.synchronize.Barrier | None,
    out: "multiprocessing.Queue[dict[str, Any]]",
    max_tokens_per_call: int | None = None,
    model: str = "m",
) -> None:
    """Run new runs of one job (a subject per run) until a budget refuses one.

    Each model call reports ``call_tokens``. ``max_tokens_per_call``: the step's declared
    worst case, reserved before each call. With ``in_flight``, the first call of every worker
    waits there until all workers are inside their calls (each admitted before any has
    recorded its spend)."""
    from idempotent_jobs import BudgetExceededError, ModelAnswer, ModelUsage

    calls = 0

    def transform(raw: dict[str, Any]) -> ModelAnswer:
        nonlocal calls
        calls += 1
        if in_flight is not None and calls == 1:
            in_flight.wait(timeout=120)
        usage = ModelUsage(model_name=model, input_tokens=call_tokens - 1, output_tokens=1)
        return ModelAnswer({"summary": f"call {calls} of worker {worker}"}, usage)

    refused: dict[str, Any] | None = None
    with HarnessLedger(conninfo) as ledger:
        start.wait(timeout=120)
        for n in range(10_000):
            ident = RunIdentity(
                "budgeted-job", f"w{worker}-{n}", datetime(2026, 8, 7, 9, tzinfo=UTC), "v1"
            )
            try:
                run_idempotent(
                    ledger,
                    ident,
                    collect=lambda i: {"s": i.subject_id},
                    transform=transform,
                    budget=budget,
                    max_tokens_per_call=max_tokens_per_call,
                    config=JobConfig.of(prompt="", model=model, validator=""),
                )
            except BudgetExceededError as exc:
                refused = {
                    "spent": str(exc.spent),
                    "budget": str(exc.budget),
                    "run_id": ident.run_id,
                }
                break
            except Exception as exc:  # told to the test at once, not found by its timeout
                out.put({"worker": worker, "error": repr(exc)})
                raise
    out.put({"worker": worker, "calls": calls, "refused": refused})
