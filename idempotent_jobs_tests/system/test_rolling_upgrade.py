"""A rolling upgrade: the previous release's workers and today's run one job on one ledger.

The previous release is the newest one whose CHANGELOG section names its release commit; it is
checked out in a git worktree and installed, with today's code, each into a virtualenv of its
own. Every Dagster run worker is a new process (``idempotent-jobs launch``), as Dagster's are, so
each run checks the ledger's schema when its resources are set up; a long-lived worker of the
previous release keeps its ledger open (and its statements prepared) across the ``migrate``.

When today's code ships no migration the release lacks (right after a release is cut), today's
code is given the next release's kind of change, one additive migration (a column on ``runs``,
which invalidates the previous release's prepared statements, and a table), so the ``migrate``
always moves the schema under the old workers.

Two orders: ``migrate`` while both old workers are mid-run (their model calls held until it is
done), then each old worker replaced by a new one; and new code deployed first, its runs waiting
for the ``migrate`` that follows. Each ends with every partition's run completed once: one
model call and one notification per run, every paid call recorded, no launch failed.
"""

import json
import os
import queue
import re
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from idempotent_jobs.operator.dagster_home import dagster_storage_url
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.installed_wheel import CHECKOUT, install_wheel

pytestmark = [pytest.mark.dagster_instance, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parents[1] / "upgrade"  # the release fixtures
SECTION = re.compile(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d)\)\n(.*?)(?=^## |\Z)", re.M | re.S)
RELEASE_COMMIT = re.compile(r"^Release commit: `([0-9a-f]{40})`", re.M)
MIGRATIONS = Path("idempotent_jobs") / "core" / "migrations"
JOB = "fleet_digest"
WAITING = "waiting up to"


def previous_release() -> tuple[str, str]:
    """The newest release whose CHANGELOG section names its commit: (version, commit)."""
    for version, _, body in SECTION.findall((CHECKOUT / "CHANGELOG.md").read_text("utf-8")):
        named = RELEASE_COMMIT.search(body)
        if named:
            return version, named[1]
    raise AssertionError("no CHANGELOG section names a release commit")


def git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def migration_files(tree: Path) -> set[str]:
    return {p.name for p in (tree / MIGRATIONS).glob("[0-9][0-9][0-9][0-9]_*.sql")}


def todays_code(root: Path, release_tree: Path) -> Path:
    """Today's code as it would ship: the checkout itself, or, when it ships no migration the
    release lacks, a copy of it with the next release's additive migration added."""
    if migration_files(CHECKOUT) - migration_files(release_tree):
        return CHECKOUT
    copy = root / "today-with-next-migration"
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for name in filter(None, listed):
        source = CHECKOUT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    newest = max(int(name[:4]) for name in migration_files(CHECKOUT))
    (copy / MIGRATIONS / f"{newest + 1:04d}_rolling_upgrade_probe.sql").write_text(
        "-- change: additive\n"
        "-- The next release's kind of change (the rolling-upgrade test's): a nullable column\n"
        "-- on the busiest table and a new table.\n"
        "ALTER TABLE {schema}.runs ADD COLUMN rolling_note text;\n"
        "CREATE TABLE {schema}.rolling_notes (run_id text PRIMARY KEY, note text NOT NULL);\n",
        encoding="utf-8",
    )
    return copy


@dataclass(frozen=True)
class Release:
    """One release's code, installed in a virtualenv of its own."""

    name: str
    bin: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.bin / "idempotent-jobs"), *args]


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Release, Release]]:
    root = tmp_path_factory.mktemp("rolling-upgrade")
    version, commit = previous_release()
    tree = root / f"release-{version}"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        old = install_wheel(root / "old", checkout=tree, extras="dagster", tools=())
        today = todays_code(root, tree)
        new = install_wheel(root / "new", checkout=today, extras="dagster", tools=())
        yield Release(version, old), Release("today", new)
    finally:
        git("worktree", "remove", "--force", str(tree))


class FakeProvider:
    """The model provider, on 127.0.0.1: counts the calls per (job, region, day), and holds
    the next ``hold`` calls of the fleet's job until :meth:`release` (a barrier between the
    workers' processes and the test, not a sleep)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.held = threading.Semaphore(0)
        self._hold = 0
        self._gate = threading.Event()
        self._gate.set()
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = (asked["job"], asked["region"], asked["day"])
                with provider._lock:
                    provider.calls[key] += 1
                    n = provider.calls[key]
                    hold = asked["job"] == "fleet-digest" and provider._hold > 0
                    if hold:
                        provider._hold -= 1
                if hold:
                    provider.held.release()
                    provider._gate.wait(300)
                body = json.dumps(
                    {"summary": f"{key} answer {n}", "input_tokens": 40, "output_tokens": 8}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/answer"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold_next(self, calls: int) -> None:
        with self._lock:
            self._hold = calls
            self._gate.clear()

    def wait_held(self, calls: int) -> None:
        for _ in range(calls):
            assert self.held.acquire(timeout=240), "a worker's model call never arrived"

    def release(self) -> None:
        self._gate.set()

    def close(self) -> None:
        self._gate.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Launch:
    """One Dagster run worker process of one release: ``idempotent-jobs launch`` of some
    partitions. ``waiting`` is set when it says it waits for ``migrate``."""

    release: Release
    keys: tuple[str, ...]
    proc: subprocess.Popen[str]
    err: list[str] = field(default_factory=list)
    waiting: threading.Event = field(default_factory=threading.Event)

    rows: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            if WAITING in line:
                self.waiting.set()

    def finish(self) -> list[dict[str, Any]]:
        """Wait for the process; its ``launch --json`` rows (it must have exited 0)."""
        if self.rows is None:
            assert self.proc.stdout is not None
            out = self.proc.stdout.read()
            self.proc.wait(timeout=300)
            self._reader.join(timeout=60)
            said = f"{out}{''.join(self.err)[-3000:]}"
            assert self.proc.returncode == 0, f"{self.release.name} launch {self.keys}: {said}"
            self.rows = json.loads(out)
        return self.rows


@dataclass
class Fleet:
    """The hosts of one deployment: releases, the environment they share, what they did."""

    project: Path
    env: dict[str, str]
    launches: list[Launch] = field(default_factory=list)

    def launch(self, release: Release, *keys: str) -> Launch:
        proc = subprocess.Popen(
            # Today's launch returns once its runs are started; it waits for them when told.
            release.command(
                "-f",
                "fleet_job.py",
                "launch",
                "--json",
                *(["--wait"] if release.name == "today" else []),
                "--job",
                JOB,
                *keys,
            ),
            cwd=self.project,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started = Launch(release, keys, proc)
        self.launches.append(started)
        return started

    def run(self, release: Release, *args: str) -> str:
        done = subprocess.run(
            release.command(*args),
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{release.name} {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr


class LongLived:
    """The previous release's long-lived worker (``long_lived_worker.py``)."""

    def __init__(self, release: Release, fleet: Fleet) -> None:
        self.proc = subprocess.Popen(
            [str(release.bin / "python"), str(HERE / "long_lived_worker.py")],
            cwd=fleet.project,
            env=fleet.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        assert self.answer() == {"ready": True}

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(json.loads(line))

    def answer(self) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=120)
        except queue.Empty:
            raise AssertionError(f"the long-lived worker said nothing: {self.stop()}") from None

    def run(self, subject: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(subject + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def stop(self) -> str:
        _, err = self.proc.communicate(timeout=60)
        return err


@pytest.fixture
def fleet(
    releases: tuple[Release, Release], fresh_database: str, tmp_path: Path
) -> Iterator[tuple[Fleet, FakeProvider, Receiver]]:
    provider, receiver = FakeProvider(), Receiver()
    project = tmp_path / "fleet"
    project.mkdir()
    shutil.copy(HERE / "fleet_job.py", project / "fleet_job.py")
    home = project / "dagster_home"
    home.mkdir()
    # Each host launches its own runs as it submits them (no run queue): a launch of the
    # previous release takes every queued run of the instance off the queue, its own or not,
    # and two hosts starting one run make its second worker mark it failed. What this test
    # proves is the ledger's schema under a rolling upgrade, not Dagster's queue.
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url:\n      env: IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL\n"
        "run_coordinator:\n  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n",
        encoding="utf-8",
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IDEMPOTENT_JOBS_DATABASE_URL": fresh_database,
        "IDEMPOTENT_JOBS_DAGSTER_STORAGE_URL": dagster_storage_url(fresh_database),
        "DAGSTER_HOME": str(home),
        "FLEET_MODEL_URL": provider.url,
        "FLEET_HOOK_URL": receiver.url,
    }
    _create_dagster_storage(home, env)
    try:
        yield Fleet(project, env), provider, receiver
    finally:
        provider.close()
        receiver.close()


def _create_dagster_storage(home: Path, env: dict[str, str]) -> None:
    """Dagster's own tables, made once before the fleet starts, as a deployment makes them
    (`dagster instance migrate`, or its first process): processes of both releases starting at
    once on an empty database race in Dagster's table creation ("type snapshots already
    exists"), which is Dagster's, not the ledger's."""
    import dagster as dg

    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.get_runs(limit=1)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def key(region: str, day: int) -> str:
    return f"{region}|2026-11-{day:02d}"


def check_the_promise(
    fleet: Fleet, provider: FakeProvider, receiver: Receiver, partitions: set[str]
) -> None:
    """Every partition's run completed once: one run row, one paid call (recorded), one
    notification; the long-lived worker's runs likewise; no launch failed."""
    results = [row for launch in fleet.launches for row in launch.finish()]
    assert all(row["success"] for row in results), results
    assert {row["partition"] for row in results} == partitions
    with psycopg.connect(fleet.env["IDEMPOTENT_JOBS_DATABASE_URL"]) as conn:
        runs = conn.execute(
            "SELECT r.job_name, r.subject_id, to_char(r.scheduled_at, 'YYYY-MM-DD'), r.status,"
            " (SELECT count(*) FROM idempotent_jobs.model_calls m WHERE m.run_id = r.run_id),"
            " (SELECT count(*) FROM idempotent_jobs.notification_outbox o"
            "   WHERE o.run_id = r.run_id AND o.delivered_at IS NOT NULL)"
            " FROM idempotent_jobs.runs r"
        ).fetchall()
    fleet_runs = {f"{row[1]}|{row[2]}": row for row in runs if row[0] == "fleet-digest"}
    assert set(fleet_runs) == partitions, "one run per partition, none lost"
    for partition, (_, region, day, status, calls, delivered) in fleet_runs.items():
        assert status == "completed", partition
        assert provider.calls[("fleet-digest", region, day)] == 1, f"{partition}: paid twice"
        assert calls == 1, f"{partition}: the paid call is recorded once"
        assert delivered == 1, partition
    long_lived = [row for row in runs if row[0] == "long-lived"]
    assert long_lived and all(r[3] == "completed" and r[4] == 1 for r in long_lived), long_lived
    assert sum(provider.calls.values()) == len(fleet_runs) + len(long_lived)
    assert sorted(receiver.effects.values()) == [1] * len(partitions)
    assert sorted(receiver.requests.values()) == [1] * len(partitions), "each posted once"


def test_migrate_while_the_old_fleet_runs_then_replace_it_worker_by_worker(
    releases: tuple[Release, Release], fleet: tuple[Fleet, FakeProvider, Receiver]
) -> None:
    old, new = releases
    hosts, provider, receiver = fleet
    hosts.run(old, "migrate")
    long_lived = LongLived(old, hosts)
    assert long_lived.run("ll-before") == {
        "subject": "ll-before",
        "status": "completed",
        "executed": True,
    }
    # Both old workers are mid-run, leases held, when the migrate comes.
    provider.hold_next(2)
    w1 = hosts.launch(old, key("emea", 1))
    w2 = hosts.launch(old, key("amer", 1))
    provider.wait_held(2)
    migrated = hosts.run(new, "migrate")
    assert "applied" in migrated, migrated
    # The mixed window, as the previous release's doctor sees it.
    assert "schema_ahead" in hosts.run(old, "doctor")
    provider.release()
    w1.finish()
    # w1's host is replaced by today's code; w2 stays on the old release for another run.
    n1 = hosts.launch(new, key("apac", 1), key("emea", 1))
    w2.finish()
    w2 = hosts.launch(old, key("emea", 2), key("amer", 1))
    assert long_lived.run("ll-after") == {
        "subject": "ll-after",
        "status": "completed",
        "executed": True,
    }
    assert long_lived.run("ll-before")["executed"] is False  # reused across the migrate
    n1.finish()
    w2.finish()
    # w2's host is replaced too: the window is over.
    n2 = hosts.launch(new, key("amer", 2), key("apac", 1))
    n1 = hosts.launch(new, key("apac", 2), key("emea", 2))
    n2.finish()
    n1.finish()
    long_lived.stop()
    assert "schema_ahead" not in hosts.run(new, "doctor")
    days = (key(r, d) for r in ("emea", "amer", "apac") for d in (1, 2))
    check_the_promise(hosts, provider, receiver, set(days))


def test_new_code_deployed_first_waits_for_the_migrate_that_follows(
    releases: tuple[Release, Release], fleet: tuple[Fleet, FakeProvider, Receiver]
) -> None:
    old, new = releases
    hosts, provider, receiver = fleet
    hosts.run(old, "migrate")
    long_lived = LongLived(old, hosts)
    assert long_lived.run("ll-before")["status"] == "completed"
    w1 = hosts.launch(old, key("emea", 1))
    w2 = hosts.launch(old, key("amer", 1))
    w1.finish()
    # w1's host gets today's code before anyone migrates: its run waits for the migrate.
    n1 = hosts.launch(new, key("apac", 1), key("emea", 1))
    assert n1.waiting.wait(240), "".join(n1.err)
    w2.finish()
    w2 = hosts.launch(old, key("emea", 2))  # the old release goes on meanwhile
    w2.finish()
    assert n1.proc.poll() is None, "today's worker ran on a schema its code lacks"
    hosts.run(new, "migrate")
    n1.finish()
    assert any("is migrated: going on" in line for line in n1.err), n1.err
    w2 = hosts.launch(old, key("amer", 2), key("apac", 1))  # the mixed window
    assert long_lived.run("ll-after")["status"] == "completed"
    w2.finish()
    n2 = hosts.launch(new, key("apac", 2), key("amer", 1))
    n2.finish()
    long_lived.stop()
    days = {key("emea", 1), key("amer", 1), key("apac", 1), key("emea", 2)}
    check_the_promise(hosts, provider, receiver, days | {key("amer", 2), key("apac", 2)})
