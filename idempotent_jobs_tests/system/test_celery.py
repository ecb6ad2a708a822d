"""The job on dagster-celery's executor with two real Celery worker processes, each step a task.

The broker is RabbitMQ or Redis when one listens on 127.0.0.1 (this machine has both), else
Celery's SQLAlchemy transport on the test's PostgreSQL. A worker process is killed in the middle
of `transform`; Dagster's run retry finishes the run: one accepted result, one outbox row, one
delivery. The lease, not the broker, decides.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs_tests.dagster_defs import CELERY_SPEC
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import (
    PROJECT_ROOT,
    DagsterTestEnv,
    dagster_instance,
    launch_partition,
    run_retry_daemon,
    workspace,
)

pytestmark = [pytest.mark.slow, pytest.mark.dagster_instance]

PARTITION = "workspace-initech|2026-08-07"


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def transport(database: str) -> tuple[str, str, str]:
    """(kind, broker, backend): a broker on this machine, else PostgreSQL itself.

    ``IJ_TEST_CELERY_TRANSPORT=sqlalchemy`` forces the fallback (to check it where brokers run).
    """
    if os.environ.get("IJ_TEST_CELERY_TRANSPORT") == "sqlalchemy":
        url = dagster_storage_url(database)
        return "sqlalchemy", f"sqla+{url}", f"db+{url}"
    if listening(5672):
        return "rabbitmq", "pyamqp://guest:guest@127.0.0.1:5672//", "rpc://"
    if listening(6379):
        return "redis", "redis://127.0.0.1:6379/13", "redis://127.0.0.1:6379/14"
    url = dagster_storage_url(database)
    return "sqlalchemy", f"sqla+{url}", f"db+{url}"


def start_workers(
    home: Path, broker: str, backend: str, tmp: Path, count: int = 2
) -> list[subprocess.Popen[bytes]]:
    config_dir = tmp / "celery_config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "dagster_celery_config.py").write_text(
        f"broker_url = {broker!r}\nresult_backend = {backend!r}\n"
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(config_dir), str(PROJECT_ROOT)]),
    }
    celery = str(Path(sys.executable).with_name("celery"))
    workers = []
    for number in range(count):
        log = (tmp / f"worker-{number}.log").open("wb")
        workers.append(
            subprocess.Popen(
                [
                    celery,
                    "-A",
                    "dagster_celery.app",
                    "worker",
                    "--prefetch-multiplier=1",
                    "--loglevel",
                    "INFO",
                    "-n",
                    f"ij-test-{number}@%h",
                    "--concurrency",
                    "1",
                    "-Q",
                    "dagster",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=PROJECT_ROOT,
            )
        )
    return workers


@pytest.fixture
def celery(
    dagster_env: DagsterTestEnv, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, str]]:
    kind, broker, backend = transport(dagster_env.database)
    monkeypatch.setenv("IJ_TEST_CELERY_BROKER", broker)
    monkeypatch.setenv("IJ_TEST_CELERY_BACKEND", backend)
    from dagster_celery.make_app import make_app

    app = make_app({"broker": broker, "backend": backend})  # type: ignore[no-untyped-call]
    app.control.purge()  # nothing left over from an earlier run of the suite
    yield kind, broker, backend


def wait_for_workers(tmp: Path, workers: list[subprocess.Popen[bytes]]) -> None:
    """Each worker logs "ready." once it consumes (broadcast pings need a real broker)."""
    logs = [tmp / f"worker-{number}.log" for number in range(len(workers))]
    for _ in range(1200):  # up to 120 s
        if all(b" ready." in log.read_bytes() for log in logs if log.exists()) and all(
            log.exists() for log in logs
        ):
            return
        dead = [w for w in workers if w.poll() is not None]
        assert not dead, f"a Celery worker exited: {logs[0].read_text()[-2000:]}"
        threading.Event().wait(0.1)
    raise AssertionError("the Celery workers never became ready")


def test_celery_workers_run_the_steps_and_a_killed_worker_changes_nothing(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    celery: tuple[str, str, str],
    tmp_path: Path,
) -> None:
    kind, broker, backend = celery
    dagster_env.script("slow")
    with dagster_instance(dagster_env) as instance, workspace(instance) as context:
        home = dagster_env.tmp_path / "dagster_home"  # the instance's: workers write its events
        workers = start_workers(home, broker, backend, tmp_path)
        try:
            wait_for_workers(tmp_path, workers)
            launched: list[str] = []
            runner = threading.Thread(
                target=lambda: launched.append(
                    launch_partition(context, "celery_summary", PARTITION)
                )
            )
            runner.start()
            started = dagster_env.calls_dir / "started"
            for _ in range(6000):
                if started.exists() or not runner.is_alive():
                    break
                threading.Event().wait(0.01)
            assert started.exists(), "transform never started on a worker"
            model_pid = int((dagster_env.calls_dir / "model_calls.log").read_text().split()[0])
            assert model_pid not in (os.getpid(), *[w.pid for w in workers])
            os.kill(model_pid, signal.SIGKILL)  # the worker process running transform dies
            (dagster_env.calls_dir / "slow").unlink()
            (dagster_env.calls_dir / "go").touch()
            runner.join(timeout=180)
            assert launched, "the first run never finished"
            first = instance.get_run_by_id(launched[0])
            assert first is not None
            if first.status == dg.DagsterRunStatus.FAILURE:
                run_retry_daemon(context)  # dagster.yaml: run_retries
            runs = instance.get_runs()
            final = runs[0]
            assert final.status == dg.DagsterRunStatus.SUCCESS, [r.status for r in runs]
            starts = instance.get_records_for_run(
                final.run_id, of_type=dg.DagsterEventType.STEP_START
            ).records
            step_pids = {r.event_log_entry.dagster_event.pid for r in starts}  # type: ignore[union-attr]
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
    assert os.getpid() not in step_pids, "steps ran in Celery workers, not in the run process"
    ident = CELERY_SPEC.identity_for(PARTITION)
    record = ledger.get(ident.run_id)
    assert record is not None and record.status == "completed"
    assert len(operator.outbox(ident.run_id)) == 1 and len(dagster_env.delivered()) == 1
    assert dagster_env.model_calls() == 2, "the killed call and the one that completed"
    outcomes = [a.outcome for a in operator.attempts(ident.run_id)]
    assert outcomes[-1] == "completed" and outcomes.count("completed") == 1, outcomes
    print(f"broker={kind} runs={len(runs)} attempts={outcomes}")
