"""Chaos trials: real worker processes, a real PostgreSQL owned by the runner, real faults.

    python -m idempotent_jobs_tests.chaos --trials 1000          # all kinds, in turn
    python -m idempotent_jobs_tests.chaos --trials 200 --kinds stop,drop --seed 7

Kinds: ``kill`` (SIGKILL at a random point of the protocol, then a recovery worker), ``stop``
(SIGSTOP the lease holder past its lease, another worker takes over, SIGCONT: the old one
writes nothing), ``drop`` (the connection is cut after the final commit reached the server),
``restart`` (PostgreSQL restarted while runs are in their model call; every other one is a crash,
``pg_ctl -m immediate``, which loses lease writes not yet flushed), ``revise`` (a holder paused
in its model call is overtaken, the run is revised with or without recollecting, maybe a worker
of the new revision is killed, then the paused one resumes and commits as ``persist`` would:
its stale answer must be refused), ``deliver`` (the receiver answers redirects, 5xx, too slowly
or by dropping the connection before it answers 200), ``prune`` (retention runs while a run is
revised), ``hostile`` (the model answers a hostile value: absurd or negative token counts, NaN,
NUL, a lone surrogate, too deep, too big, not an object, invalid, or it raises with hostile text;
its worker fails on its own, or is paused past its lease and overtaken, or a second worker is
killed in its model call; then a healthy worker recovers the run), ``answered`` (a worker
records its paid answer as Dagster's ``transform`` does, then is killed or paused past its lease
before the commit: the recovery commits that answer with no model call, the paused one is
fenced), ``provider`` (two workers on one run call a real model step, OpenAI's API, at a
provider that throttles with ``Retry-After``, fails with 5xx, cuts answers off mid-way and
answers outside the schema: every request it received is one recorded call), ``batch`` (a batch
lane driver killed at one step of a batch's life while the batch API fails, loses a create's
answer, expires or fails items: see ``batch_trials``). After each trial the
invariants are checked from the database and the receiver, among them: every paid model call is
recorded once, and no lease outlives its holder's failure. Prints ``N passed, M failed``.
"""

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.retention import RetentionPolicy, prune
from idempotent_jobs.dagster.resources import WebhookChannel
from idempotent_jobs.operator.embedded import start_embedded_postgres, stop_embedded_postgres
from idempotent_jobs_tests.chaos.batch_trials import BatchTrials
from idempotent_jobs_tests.chaos.money_trials import HOURS as MONEY_HOURS
from idempotent_jobs_tests.chaos.money_trials import MoneyTrials
from idempotent_jobs_tests.chaos.parts import (
    CHAOS_AUTHORIZATION,
    CRASH_POINTS,
    FAULTS,
    HOSTILE,
    CommitProxy,
    Receiver,
    Verdict,
    check_invariants,
    crash_embedded_postgres,
    read_results,
    run_worker,
    trial_identity,
)
from idempotent_jobs_tests.chaos.shadow_trials import ShadowTrials
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, Drop, FakeProviders, Request, Scripted, Status
from testkit.pgbouncer import PgBouncer

KINDS = (
    "kill",
    "stop",
    "drop",
    "restart",
    "revise",
    "deliver",
    "prune",
    "hostile",
    "budget",
    "answered",
    "provider",
    "batch",
    "shadow",
)
# The budget trials: two calls' worst cases fit a subject's daily budget, a third's does not.
BUDGET_TOKENS, CALL_TOKENS = 200, 80
WEBHOOK_TIMEOUT = 0.5


def RELAY() -> str:  # noqa: N802 - the proxy's default action, named like the constant it is
    return "relay"


RESTART_BATCH = 4


# A run's completion, attempts and deliveries moved 400 days back: past any retention policy.
AGE_BY_400_DAYS = (
    "UPDATE idempotent_jobs.runs SET completed_at = completed_at - interval '400 days'"
    " WHERE run_id = %s",
    "UPDATE idempotent_jobs.run_attempts SET ended_at = ended_at - interval '400 days'"
    " WHERE run_id = %s",
    "UPDATE idempotent_jobs.notification_outbox"
    " SET delivered_at = delivered_at - interval '400 days' WHERE run_id = %s",
)


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in ``/proc`` (``T``: stopped); empty once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


class Chaos:
    def __init__(
        self, workdir: Path, lease_seconds: float, seed: int, use_pgbouncer: bool = False
    ) -> None:
        self.workdir = workdir
        self.lease = lease_seconds
        self.rng = random.Random(seed)
        self.provider_rng = random.Random(seed + 1)  # the provider's faults, on its own thread
        self.provider_lock = threading.Lock()
        self.restarts = 0
        self.killed_in_commit: set[int] = set()  # workers SIGKILLed as their commit went out
        self.pgdata = workdir / "pgdata"
        self.url = start_embedded_postgres(self.pgdata)
        LedgerAdmin(self.url).migrate()
        params = psycopg.conninfo.conninfo_to_dict(self.url)
        self.socket_path = f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"
        # Workers (and the fault proxy) reach the ledger through PgBouncer in transaction mode
        # when asked; the runner's own checks and operator calls go direct.
        self.bouncer = PgBouncer(self.url).start() if use_pgbouncer else None
        self.worker_url = self.url
        if self.bouncer is not None:
            self.worker_url = self.bouncer.url("postgres")
            self.socket_path = f"{self.bouncer.socket_dir}/.s.PGSQL.{self.bouncer.port}"
        self.faulty = FakeProviders(default=self.faulty_answer)
        self.trap = Receiver()  # where redirects point: it must never see a request
        self.receiver = Receiver(trap=self.trap, slow_seconds=WEBHOOK_TIMEOUT * 3)
        self.proxy = CommitProxy(self.socket_path, RELAY)
        self.proxy_url = make_conninfo(
            "", host="127.0.0.1", port=self.proxy.port, user="postgres", dbname="postgres"
        )
        self._batch_trials: BatchTrials | None = None
        self._money_trials: MoneyTrials | None = None
        self._shadow_trials: ShadowTrials | None = None
        self.ctx = multiprocessing.get_context("forkserver")
        # The SDKs the batch and shadow drivers call, imported once: a driver starts in a
        # fraction of a second instead of seconds.
        self.ctx.set_forkserver_preload(
            [
                "idempotent_jobs",
                "idempotent_jobs_tests.chaos.parts",
                "idempotent_jobs_tests.chaos.shadow_trials",
                "idempotent_jobs.shadows",
                "idempotent_jobs.models.batches",
                "openai",
                "anthropic",
            ]
        )

    def close(self) -> None:
        if self._batch_trials is not None:
            self._batch_trials.close()
        if self._money_trials is not None:
            self._money_trials.close()
        if self._shadow_trials is not None:
            self._shadow_trials.close()
        self.faulty.close()
        if self.bouncer is not None:
            self.bouncer.stop()
        self.proxy.close()
        self.receiver.close()
        self.trap.close()
        stop_embedded_postgres(self.pgdata)

    # -- helpers ------------------------------------------------------------------------------

    def spec(self, trial: int, **extra: Any) -> dict[str, Any]:
        return {
            "trial": trial,
            "database_url": self.worker_url,
            "lease_seconds": self.lease,
            "receiver_url": self.receiver.url,
            "results": str(self.workdir / f"results-{trial}.jsonl"),
            **extra,
        }

    def start(self, spec: dict[str, Any]) -> Any:
        process = self.ctx.Process(target=run_worker, args=(spec,))
        process.start()
        return process

    def recover(self, trial: int, **extra: Any) -> None:
        """A healthy worker on the same logical run, as a scheduler's retry would start."""
        process = self.start(self.spec(trial, wait_seconds=self.lease * 6, **extra))
        process.join(timeout=120)

    def conn(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True)

    def wait_for(self, condition: Any, what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)

    def wait_for_lease_expiry(self, run_id: str) -> None:
        with self.conn() as conn:
            self.wait_for(
                lambda: (
                    conn.execute(
                        "SELECT lease_expires_at < now() FROM idempotent_jobs.runs"
                        " WHERE run_id = %s",
                        (run_id,),
                    ).fetchone()
                    == (True,)
                ),
                "the paused holder's lease to expire",
            )

    def verdict(self, trial: int, kind: str) -> Verdict:
        with self.conn() as conn:
            verdict = check_invariants(
                conn,
                trial,
                kind,
                self.receiver,
                self.workdir / f"results-{trial}.jsonl",
                frozenset(self.killed_in_commit),
            )
        if sum(self.trap.requests.values()):
            verdict.problems.append(f"a redirect was followed: {dict(self.trap.requests)}")
        if self.receiver.unauthorised:
            verdict.problems.append(f"{self.receiver.unauthorised} requests without credentials")
        return verdict

    def pause_in_model_call(self, trial: int, **extra: Any) -> tuple[Any, str]:
        """A worker stopped (SIGSTOP) in its model call until its lease has expired by the
        database clock. Returns the process and the marker that lets it go on."""
        marker = str(self.workdir / f"pause-{trial}")
        process = self.start(self.spec(trial, pause_marker=marker, **extra))
        try:
            self.wait_for(lambda: Path(marker).exists(), "the model call")
            os.kill(process.pid, signal.SIGSTOP)
            self.wait_for(lambda: process_state(process.pid) == "T", "the holder to stop")
            self.wait_for_lease_expiry(trial_identity(trial).run_id)
            if process_state(process.pid) != "T":
                raise RuntimeError("the paused holder was resumed before its lease expired")
        except BaseException:
            process.kill()  # never leave a paused worker behind to renew its lease
            process.join(timeout=60)
            raise
        return process, marker

    def resume(self, process: Any, marker: str) -> None:
        Path(marker + ".go").touch()
        os.kill(process.pid, signal.SIGCONT)
        process.join(timeout=60)

    def first_attempt_lost(self, trial: int, verdict: Verdict) -> None:
        with self.conn() as conn:
            outcome = conn.execute(
                "SELECT outcome FROM idempotent_jobs.attempts WHERE run_id = %s"
                " AND lease_epoch = 1",
                (trial_identity(trial).run_id,),
            ).fetchone()
        if outcome != ("lease_lost",):
            verdict.problems.append(f"the paused worker's attempt ended {outcome}")

    def killed_worker(self, trial: int, point: str) -> list[str]:
        """A worker SIGKILLed at ``point``; returns what went wrong with the kill itself."""
        crash = "" if point == "commit_sent" else point
        victim: list[Any] = []

        def kill_before_answer() -> str:
            self.wait_for(lambda: bool(victim), "the worker handle")
            os.kill(victim[0].pid, signal.SIGKILL)  # the commit is in; its answer is never read
            return "drop"

        if point == "commit_sent":
            self.proxy.on_commit_answer = kill_before_answer
        process = self.start(self.spec(trial, crash=crash, database_url=self.proxy_url))
        victim.append(process)
        if point == "commit_sent":
            self.killed_in_commit.add(process.pid)
        process.join(timeout=60)
        self.proxy.on_commit_answer = RELAY
        if process.exitcode != -signal.SIGKILL:
            return [f"worker did not die at {point} (exit {process.exitcode})"]
        return []

    # -- trials -------------------------------------------------------------------------------

    def kill(self, trial: int) -> Verdict:
        point = self.rng.choice(CRASH_POINTS)
        problems = self.killed_worker(trial, point)
        self.recover(trial)
        verdict = self.verdict(trial, f"kill:{point}")
        verdict.problems += problems
        if point in ("checkpoint_in_flight", "during_model"):
            verdict.problems += self.collected_once(trial, point)
        return verdict

    def collected_once(self, trial: int, point: str) -> list[str]:
        """The checkpoint the run ended on: the killed worker's when the lease renewer had
        stored it (``during_model``), a later collection's when it was still travelling with
        the call (``checkpoint_in_flight``)."""
        events = read_results(Path(self.spec(trial)["results"]))
        collected = [e["input"] for e in events if e.get("event") == "collected"]
        with self.conn() as conn:
            row = conn.execute(
                "SELECT raw_input FROM idempotent_jobs.runs WHERE run_id = %s",
                (trial_identity(trial).run_id,),
            ).fetchone()
        stored = row[0]["documents"][0] if row and row[0] else None
        if point == "during_model" and collected != [stored]:
            return [f"collected {collected}; the run ended on {stored}, not the first"]
        if point == "checkpoint_in_flight" and (len(collected) != 2 or stored != collected[1]):
            return [f"collected {collected}; the run ended on {stored}, not the second"]
        return []

    def stop(self, trial: int) -> Verdict:
        process, marker = self.pause_in_model_call(trial)
        self.recover(trial)
        self.resume(process, marker)
        verdict = self.verdict(trial, "stop")
        stale = [
            r for r in read_results(Path(self.spec(trial)["results"])) if r["pid"] == process.pid
        ]
        if any(r.get("executed") for r in stale):
            verdict.problems.append("the paused worker's result was accepted")
            verdict.duplicates += 1
        self.first_attempt_lost(trial, verdict)
        return verdict

    def answered(self, trial: int) -> Verdict:
        """A paid answer recorded by ``transform`` whose worker then dies (SIGKILL), or is
        paused past its lease (SIGSTOP) before its commit: the recovery commits the recorded
        answer without a model call, and the resumed worker is fenced."""
        fault = self.rng.choice(["kill", "stop"])
        process = None
        marker = str(self.workdir / f"answered-{trial}")
        if fault == "kill":
            first = self.start(self.spec(trial, answered="kill"))
            first.join(timeout=60)
            self.wait_for_lease_expiry(trial_identity(trial).run_id)
        else:
            process = self.start(self.spec(trial, answered="stop", answer_marker=marker))
            try:
                self.wait_for(lambda: Path(marker).exists(), "the recorded answer")
                os.kill(process.pid, signal.SIGSTOP)
                self.wait_for(lambda: process_state(process.pid) == "T", "the holder to stop")
                self.wait_for_lease_expiry(trial_identity(trial).run_id)
            except BaseException:
                process.kill()
                process.join(timeout=60)
                raise
        self.recover(trial, answered="")
        if process is not None:
            self.resume(process, marker)
        verdict = self.verdict(trial, f"answered:{fault}")
        paid = [
            r
            for r in read_results(Path(self.spec(trial)["results"]))
            if r.get("event") == "paid_call"
        ]
        with self.conn() as conn:
            calls = conn.execute(
                "SELECT outcome FROM idempotent_jobs.model_calls WHERE run_id = %s",
                (trial_identity(trial).run_id,),
            ).fetchall()
        if len(paid) != 1 or calls != [("accepted",)]:
            verdict.problems.append(
                f"{len(paid)} paid call(s), recorded as {calls}: the recovery paid again or "
                "the recorded answer was not the one accepted"
            )
        if process is not None:
            self.first_attempt_lost(trial, verdict)
        return verdict

    def budget(self, trial: int) -> Verdict:
        """A subject's budget under a paused holder: its call is in flight (not yet recorded),
        its worst case held, so the recovering worker's call is admitted only because both
        worst cases fit. The resumed holder is fenced and its paid call recorded as
        ``lease_lost``, settling its hold. A later run of the subject that day does not fit and
        is refused before its call: its attempt ends ``budget``, its lease is free, and no call
        is recorded. Spend never passes the budget, and the budget's counter is what
        ``model_calls`` records, with nothing left held."""
        extra = {"budget": BUDGET_TOKENS, "tokens": CALL_TOKENS}
        process, marker = self.pause_in_model_call(trial, **extra)
        self.recover(trial, **extra)
        self.resume(process, marker)
        verdict = self.verdict(trial, "budget")
        self.first_attempt_lost(trial, verdict)
        refused = trial_identity(trial, hour=10)
        later = self.spec(trial, hour=10, results=str(self.workdir / f"later-{trial}.jsonl"))
        worker = self.start({**later, **extra})
        worker.join(timeout=60)
        events = [e for e in read_results(Path(later["results"])) if e["event"] != "collected"]
        if [e["event"] for e in events] != ["error"] or "BudgetExceeded" not in events[0]["error"]:
            verdict.problems.append(f"the later run was not refused by the budget: {events}")
        with self.conn() as conn:
            state = conn.execute(
                "SELECT r.status, r.lease_owner IS NULL,"
                " (SELECT array_agg(outcome) FROM idempotent_jobs.run_attempts a"
                "  WHERE a.run_id = r.run_id),"
                " (SELECT count(*) FROM idempotent_jobs.model_calls c WHERE c.run_id = r.run_id)"
                " FROM idempotent_jobs.runs r WHERE r.run_id = %s",
                (refused.run_id,),
            ).fetchone()
            spent = conn.execute(
                "SELECT sum(c.input_tokens + c.output_tokens) FROM idempotent_jobs.model_calls c"
                " JOIN idempotent_jobs.runs r USING (run_id) WHERE r.subject_id = %s",
                (refused.subject_id,),
            ).fetchone()
            counter = conn.execute(
                "SELECT spent, reserved FROM idempotent_jobs.budget_counters WHERE subject_id = %s",
                (refused.subject_id,),
            ).fetchone()
        if state != ("failed", True, ["budget"], 0):
            verdict.problems.append(f"the refused run is {state}, not failed/free/budget/0")
        if spent is None or spent[0] is None or not spent[0] <= BUDGET_TOKENS:
            verdict.problems.append(f"the subject spent {spent} tokens of {BUDGET_TOKENS}")
        elif counter is None or (int(counter[0]), int(counter[1])) != (spent[0], 0):
            verdict.problems.append(f"the budget counts {counter}, model_calls {spent[0]}")
        # The budget is the ledger's now, for every later run of the job: an operator clears it
        # (the other kinds' calls report no usage, which a budget holds in doubt).
        with LedgerAdmin(self.url) as admin:
            admin.clear_budget("subject:tokens/day:" + refused.job_name)
        self.money(trial, verdict)
        return verdict

    def money(self, trial: int, verdict: Verdict) -> None:
        """Money budget, faulty provider, prices changed mid-call (see
        :mod:`~idempotent_jobs_tests.chaos.money_trials`)."""
        if self._money_trials is None:
            self._money_trials = MoneyTrials(self.url, self.rng.randrange(2**32))
        money = self._money_trials
        budget_id, before = money.prepare(trial)
        processes = [
            self.start(
                self.spec(
                    trial,
                    hour=hour,
                    results=str(self.workdir / f"money-{trial}-{hour}.jsonl"),
                    **money.extra(),
                )
            )
            for hour in MONEY_HOURS
        ]
        for process in processes:
            process.join(timeout=120)
        money.check(trial, budget_id, before, verdict)

    def revise(self, trial: int) -> Verdict:
        """Revision 0 is overtaken from a paused holder, revised, maybe half-recomputed by a
        worker that is killed; then the paused holder resumes and commits as ``persist`` does
        (claim again, commit the paid-for answer on its basis): it must be refused."""
        run_id = trial_identity(trial).run_id
        process, marker = self.pause_in_model_call(trial, fallback=True)
        self.recover(trial)
        recollect = self.rng.random() < 0.5
        with LedgerAdmin(self.url) as operator:
            operator.revise(run_id, "chaos: recompute", channels=["hook"], recollect=recollect)
        # Without recollect the checkpoint is kept: the new revision never calls collect.
        points = [p for p in CRASH_POINTS if recollect or p != "during_collect"]
        point = self.rng.choice(["paused-only", *points])
        problems = [] if point == "paused-only" else self.killed_worker(trial, point)
        self.resume(process, marker)
        self.recover(trial)
        shape = f"revise:{'recollect' if recollect else 'keep-input'}+{point}"
        verdict = self.verdict(trial, shape)
        verdict.problems += problems
        stale = [
            r for r in read_results(Path(self.spec(trial)["results"])) if r["pid"] == process.pid
        ]
        if any(r.get("executed") for r in stale) or not stale:
            verdict.problems.append(f"the paused worker's answer was accepted or lost: {stale}")
            verdict.duplicates += 1
        with self.conn() as conn:
            revision = conn.execute(
                "SELECT revision, status, last_error FROM idempotent_jobs.runs WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        if revision is None or revision[:2] != (1, "completed"):
            verdict.problems.append(f"the revision was not recomputed: {revision}")
            verdict.lost += 1
        self.first_attempt_lost(trial, verdict)
        return verdict

    def deliver(self, trial: int) -> Verdict:
        """The receiver fails the first 1-3 requests (a redirect, a 5xx, an answer too slow, a
        dropped connection); passes of the outbox deliverer follow until a 2xx."""
        run_id = trial_identity(trial).run_id
        faults = [self.rng.choice(FAULTS) for _ in range(self.rng.randint(1, 3))]
        self.receiver.faults = list(faults)
        process = self.start(self.spec(trial, webhook_timeout=WEBHOOK_TIMEOUT))
        process.join(timeout=60)
        channel = WebhookChannel(
            url=self.receiver.url,
            authorization=CHAOS_AUTHORIZATION,
            timeout_seconds=WEBHOOK_TIMEOUT,
        )
        with HarnessLedger(self.url) as ledger, LedgerAdmin.beside(ledger) as operator:
            for _ in range(len(faults) + 2):  # the CLI's `outbox deliver`, or the op's retries
                if not operator.outbox(run_id, pending_only=True):
                    break
                ledger.deliver_outbox(channel.send, run_id=run_id)
            [row] = operator.outbox(run_id)
        left, self.receiver.faults = self.receiver.faults, []
        verdict = self.verdict(trial, "deliver:" + "+".join(faults))
        if left:
            verdict.problems.append(f"faults never reached: {left}")
        if row.delivered_at is None or row.delivery_attempts != len(faults) + 1:
            verdict.problems.append(
                f"delivered={row.delivered_at is not None} after {row.delivery_attempts} tries "
                f"for {len(faults)} faults"
            )
        return verdict

    def prune(self, trial: int) -> Verdict:
        """A completed, delivered run aged past its retention is pruned (in a thread, batch by
        batch) while a worker invokes the run again; half the time the run is revised (with
        recollect) meanwhile and a worker of the new revision may be killed at any point. The
        reused run must not be redone, the revision must be computed on its own checkpoint and
        keep its payloads, and nothing may be sent twice."""
        run_id = trial_identity(trial).run_id
        self.recover(trial)  # revision 0: completed and delivered
        with self.conn() as conn:
            for statement in AGE_BY_400_DAYS:
                conn.execute(statement, (run_id,))
        revise = self.rng.random() < 0.5
        point = self.rng.choice(["none", *CRASH_POINTS]) if revise else "none"
        reports: list[Any] = []

        def prune_now() -> None:
            with LedgerAdmin(self.url) as pruner:
                policy = RetentionPolicy.of_days(
                    raw_input=30, output=30, attempts=30, delivered_payloads=30
                )
                reports.append(prune(pruner, "chaos", policy, apply=True, batch_size=50))

        pruning = threading.Thread(target=prune_now)
        pruning.start()
        problems: list[str] = []
        if revise:
            with LedgerAdmin(self.url) as operator:
                operator.revise(run_id, "chaos: recompute", channels=["hook"], recollect=True)
            if point != "none":
                problems = self.killed_worker(trial, point)
        else:
            self.start(self.spec(trial)).join(timeout=60)  # invoked again: must reuse
        pruning.join(timeout=120)
        self.recover(trial)
        verdict = self.verdict(trial, f"prune:{'revise' if revise else 'reuse'}+{point}")
        verdict.problems += problems
        if not reports:
            verdict.problems.append("the prune did not finish")
        with self.conn() as conn:
            row = conn.execute(
                "SELECT status, revision, output IS NULL, raw_input IS NULL,"
                " output_pruned_at IS NOT NULL FROM idempotent_jobs.runs WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        if revise and row != ("completed", 1, False, False, False):
            verdict.problems.append(f"the revision lost its payloads or was not recomputed: {row}")
            verdict.lost += 1
        if not revise and row != ("completed", 0, True, True, True):
            verdict.problems.append(f"the aged run was redone or not pruned: {row}")
            verdict.duplicates += row is None or row[:2] != ("completed", 0)
        return verdict

    def drop(self, trial: int) -> Verdict:
        dropped: list[bool] = []

        def drop_once() -> str:
            if dropped:
                return "relay"
            dropped.append(True)
            return "drop"

        self.proxy.on_commit_answer = drop_once
        process = self.start(self.spec(trial, database_url=self.proxy_url))
        process.join(timeout=60)
        self.proxy.on_commit_answer = RELAY
        verdict = self.verdict(trial, "drop")
        outcomes = [
            r for r in read_results(Path(self.spec(trial)["results"])) if r["event"] == "outcome"
        ]
        if not dropped:
            verdict.problems.append("the commit's connection was never dropped")
        if len(outcomes) != 1 or not outcomes[0]["executed"]:
            verdict.problems.append(
                f"the retried commit did not resolve to one outcome: {outcomes}"
            )
        return verdict

    def hostile(self, trial: int) -> Verdict:
        """A hostile model's answer fails its attempt: the lease must be free at once (the next
        worker claims now, not after the lease expires), the stored errors safe, and the call
        recorded, also when its worker was paused past its lease and overtaken meanwhile."""
        value = self.rng.choice(HOSTILE)
        mode = self.rng.choice(["fails", "paused", "then-killed"])
        run_id = trial_identity(trial).run_id
        problems: list[str] = []
        if mode == "paused":
            process, marker = self.pause_in_model_call(trial, hostile=value)
            self.recover(trial)
            self.resume(process, marker)
        else:
            process = self.start(self.spec(trial, hostile=value))
            process.join(timeout=60)
            with self.conn() as conn:
                row = conn.execute(
                    "SELECT status, lease_owner FROM idempotent_jobs.runs WHERE run_id = %s",
                    (run_id,),
                ).fetchone()
            if row != ("failed", None):
                problems.append(f"after the hostile answer the run is {row}, not failed and free")
            if mode == "then-killed":
                problems += self.killed_worker(trial, "during_model")
            self.recover(trial)
        verdict = self.verdict(trial, f"hostile:{value}+{mode}")
        verdict.problems += problems
        with self.conn() as conn:
            errors = conn.execute(
                "SELECT error FROM idempotent_jobs.attempts WHERE run_id = %(id)s"
                " UNION ALL SELECT error FROM idempotent_jobs.model_calls WHERE run_id = %(id)s"
                " UNION ALL SELECT last_error FROM idempotent_jobs.runs WHERE run_id = %(id)s",
                {"id": run_id},
            ).fetchall()
        for (error,) in errors:
            if error is not None and ("\x00" in error or len(error) > 4000):
                verdict.problems.append(f"an unsafe error was stored: {error[:80]!r}")
        return verdict

    def faulty_answer(self, request: Request) -> Scripted:
        """The provider trials' provider: throttled, failing, cutting answers off, answering
        outside the schema, or answering well (the input echoed, as the checker reads it)."""
        asked = json.loads(request.body["messages"][1]["content"])
        good = json.dumps({"summary": f"trial {asked['trial']}", "input": asked["documents"][0]})
        with self.provider_lock:
            roll = self.provider_rng.random()
        if roll < 0.25:
            return Status(429, "Rate limit reached", "rate_limit_exceeded", retry_after="0.05")
        if roll < 0.35:
            return Status(500, "The server had an error", "server_error")
        if roll < 0.50:
            return Drop(Answer(good, 120, 30))
        if roll < 0.62:
            return Answer(json.dumps({"summary": ""}), 120, 10)  # outside the schema
        return Answer(good, 120, 30)

    def provider(self, trial: int) -> Verdict:
        """Two workers at once on one run, then recovery until it is done: every request the
        provider received is one recorded model call, one answer accepted and delivered."""
        extra = {"provider_url": self.faulty.openai_url, "wait_seconds": self.lease * 2}
        processes = [self.start(self.spec(trial, **extra)) for _ in range(2)]
        for process in processes:
            process.join(timeout=120)
        run_id = trial_identity(trial).run_id
        for _ in range(6):  # every worker may have spent its retries: a scheduler retries
            with self.conn() as conn:
                row = conn.execute(
                    "SELECT status FROM idempotent_jobs.runs WHERE run_id = %s", (run_id,)
                ).fetchone()
            if row == ("completed",):
                break
            self.recover(trial, provider_url=self.faulty.openai_url)
        received = sum(
            1
            for r in self.faulty.requests
            if json.loads(r.body["messages"][1]["content"]).get("trial") == trial
        )
        results = self.workdir / f"results-{trial}.jsonl"
        with results.open("a") as handle:  # each request received was paid for
            handle.writelines(
                json.dumps({"event": "paid_call", "pid": 0}) + "\n" for _ in range(received)
            )
        return self.verdict(trial, "provider")

    def batch(self, trial: int) -> Verdict:
        """A batch lane driver killed at one step of a batch's life, a provider failing on
        the way (see :mod:`~idempotent_jobs_tests.chaos.batch_trials`)."""
        if self._batch_trials is None:
            self._batch_trials = BatchTrials(self)
        return self._batch_trials.trial(trial)

    def shadow(self, trial: int) -> Verdict:
        """A shadow of a new version killed at one point of its life, then taken up again
        (see :mod:`~idempotent_jobs_tests.chaos.shadow_trials`)."""
        if self._shadow_trials is None:
            self._shadow_trials = ShadowTrials(self)
        return self._shadow_trials.trial(trial)

    def restart(self, trial: int) -> Verdict:
        trials = [trial * 1000 + i for i in range(RESTART_BATCH)]
        markers = [str(self.workdir / f"pause-{t}") for t in trials]
        processes = [
            self.start(self.spec(t, pause_marker=m)) for t, m in zip(trials, markers, strict=True)
        ]
        self.wait_for(lambda: all(Path(m).exists() for m in markers), "runs in flight")
        self.restarts += 1
        crash = self.restarts % 2 == 0  # every other restart a crash: unflushed writes are lost
        if crash:
            crash_embedded_postgres(self.pgdata)
        else:
            stop_embedded_postgres(self.pgdata)
        start_embedded_postgres(self.pgdata)
        for marker in markers:
            Path(marker + ".go").touch()
        for process in processes:
            process.join(timeout=120)
        verdict = Verdict(trial, "restart:crash" if crash else "restart:clean")
        for t in trials:
            with self.conn() as conn:
                status = conn.execute(
                    "SELECT status FROM idempotent_jobs.runs WHERE run_id = %s",
                    (trial_identity(t).run_id,),
                ).fetchone()
            if status != ("completed",):
                self.recover(t)
            part = self.verdict(t, "restart")
            verdict.problems += [f"run {t}: {p}" for p in part.problems]
            verdict.duplicates += part.duplicates
            verdict.lost += part.lost
        return verdict


def run(
    trials: int, kinds: list[str], seed: int, lease_seconds: float, use_pgbouncer: bool = False
) -> list[Verdict]:
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="ij-chaos-") as tmp:
        chaos = Chaos(Path(tmp), lease_seconds, seed, use_pgbouncer)
        try:
            for number in range(1, trials + 1):
                kind = kinds[(number - 1) % len(kinds)]
                try:
                    verdict = getattr(chaos, kind)(number)
                except Exception as exc:  # a trial that cannot finish is a failed trial
                    verdict = Verdict(number, kind, [f"{type(exc).__name__}: {exc}"])
                verdicts.append(verdict)
                if verdict.problems:
                    print(f"trial {number} ({verdict.kind}) FAILED: {verdict.problems}", flush=True)
        finally:
            chaos.close()
    return verdicts


def summary(verdicts: list[Verdict]) -> str:
    failed = [v for v in verdicts if v.problems]
    kinds = Counter(v.kind.split(":")[0] for v in verdicts)
    points = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("kill:"))
    restarts = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("restart:"))
    revisions = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("revise:"))
    prunes = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("prune:"))
    batch = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("batch:"))
    shadow = Counter(v.kind.split(":")[1] for v in verdicts if v.kind.startswith("shadow:"))
    money: Counter[str] = Counter()
    for v in verdicts:
        if v.kind.startswith("budget:"):
            for part in v.kind.split(":", 1)[1].split("+"):
                name, _, count = part.partition("=")
                money[name or "nothing to count"] += int(count or 1)
    hostile = Counter(
        part
        for v in verdicts
        if v.kind.startswith("hostile:")
        for part in v.kind.split(":")[1].split("+")
    )
    faults = Counter(
        f for v in verdicts if v.kind.startswith("deliver:") for f in v.kind[8:].split("+")
    )
    lines = [
        "trials by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())),
        "kill points: " + ", ".join(f"{k}={n}" for k, n in sorted(points.items())),
        "restarts: " + ", ".join(f"{k}={n}" for k, n in sorted(restarts.items())),
        "revisions: " + ", ".join(f"{k}={n}" for k, n in sorted(revisions.items())),
        "delivery faults: " + ", ".join(f"{k}={n}" for k, n in sorted(faults.items())),
        "prunes: " + ", ".join(f"{k}={n}" for k, n in sorted(prunes.items())),
        "hostile answers and modes: " + ", ".join(f"{k}={n}" for k, n in sorted(hostile.items())),
        "batch providers and kill points: "
        + ", ".join(f"{k}={n}" for k, n in sorted(batch.items())),
        "shadow providers, kill points and promotions: "
        + ", ".join(f"{k}={n}" for k, n in sorted(shadow.items())),
        "money (calls unbilled, in doubt, runs refused, prices changed mid-call): "
        + ", ".join(f"{k}={n}" for k, n in sorted(money.items())),
        f"duplicates={sum(v.duplicates for v in verdicts)} lost={sum(v.lost for v in verdicts)}",
        f"{len(verdicts) - len(failed)} passed, {len(failed)} failed",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idempotent_jobs_tests.chaos")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lease", type=float, default=0.6, help="lease seconds in the trials")
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="workers reach the ledger through PgBouncer in transaction pooling mode",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds: {sorted(unknown)}")
    started = time.monotonic()
    verdicts = run(args.trials, kinds, args.seed, args.lease, args.pgbouncer)
    print(summary(verdicts))
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 1 if any(v.problems for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
