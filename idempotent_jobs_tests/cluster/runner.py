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
``persist``; the other deployment takes over, committing the answer the first one recorded in
``transform`` without paying again), ``restart`` (PostgreSQL restarted, or crashed with
``pg_ctl -m immediate``, during a model call), ``clock`` (a run on a skewed worker: its lease
expires by the database clock). After each trial the chaos runner's invariants are checked, and
for every kind: each attempt's lease ran by the database clock, whatever the worker's.
Prints ``N passed, M failed`` last.
"""

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from idempotent_jobs_tests.chaos.parts import Verdict, check_invariants, read_results
from idempotent_jobs_tests.cluster.hosts import (
    DEPLOYMENTS,
    SKEW,
    Hosts,
    exit_if_terminated,
    exit_on_sigterm,
)
from idempotent_jobs_tests.cluster.location import LEASE_SECONDS, partition_of

KINDS = ("worker", "broker", "deployment", "restart", "clock")
SKEW_SECONDS = {"w1": 3 * 3600, "w2": -3 * 3600}
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


class Cluster(Hosts):
    """The trials: each a fault injected into the hosts, then the invariants."""

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
            exit_if_terminated()
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

    def fenced(self, trial: int, verdict: Verdict, *, answer_recorded: bool = False) -> None:
        """The partitioned holder was fenced. Partitioned in its model call, its takeover pays
        for a call of its own; partitioned in ``persist`` (``answer_recorded``), its answer was
        recorded in ``transform``, and the takeover commits that one without paying again."""
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
        if answer_recorded:
            outcomes = self.query(
                "SELECT outcome FROM idempotent_jobs.model_calls WHERE run_id = %s",
                self.run_id(trial),
            )
            if len(calls) != 1 or outcomes != [("accepted",)]:
                verdict.problems.append(
                    f"{len(calls)} paid calls, recorded as {outcomes}: the takeover paid again "
                    "instead of committing the recorded answer"
                )
        elif len(calls) < 2:
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
        self.fenced(trial, verdict, answer_recorded=True)
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
            up = time.monotonic()
            cluster.start()
            print(f"cluster up in {time.monotonic() - up:.0f}s: trial 1 starts", flush=True)
            for number in range(1, trials + 1):
                exit_if_terminated()
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
    exit_on_sigterm()
    started = time.monotonic()
    verdicts = run(args.trials, kinds, args.seed, args.pgbouncer, args.keep)
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(summary(verdicts), flush=True)
    return 1 if any(v.problems for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
