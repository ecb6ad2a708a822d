"""Small shared helpers for the tests."""

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import psycopg

from idempotent_jobs import Lease, RunIdentity
from idempotent_jobs.core.records import OutboxRecord
from idempotent_jobs_tests.ledgers import HarnessLedger


def identity(subject: str = "workspace-acme", hour: int = 9) -> RunIdentity:
    return RunIdentity("competitor-summary", subject, datetime(2026, 8, 7, hour, tzinfo=UTC), "v1")


def sent_statements(ledger: HarnessLedger, monkeypatch: "pytest.MonkeyPatch") -> list[str]:
    """The names of the statements ``ledger`` sends from now on, in order."""
    sent: list[str] = []
    fetch = ledger._db.fetch

    def counted(name: str, params: Any, row_factory: Any) -> Any:
        sent.append(name)
        return fetch(name, params, row_factory)

    monkeypatch.setattr(ledger._db, "fetch", counted)
    return sent


def wait_for_checkpoint(ledger: HarnessLedger, run_id: str) -> dict[str, Any]:
    """The run's checkpoint once it is stored (a model call's lease renewer stores the one
    travelling with it a moment into the call); fails after 30 s."""
    deadline = time.monotonic() + 30
    while (record := ledger.get(run_id)) is None or record.raw_input is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the checkpoint of run {run_id} was never stored")
        time.sleep(0.005)
    return record.raw_input


def expire_lease(db: psycopg.Connection, run_id: str) -> None:
    """Move the lease's expiry into the past by the database clock (time passing, without sleep)."""
    db.execute(
        "UPDATE idempotent_jobs.runs SET lease_expires_at = now() - interval '1 millisecond'"
        " WHERE run_id = %s AND lease_owner IS NOT NULL",
        (run_id,),
    )


def take_over(ledger: HarnessLedger, db: psycopg.Connection, run_id: str, worker: str) -> Lease:
    """Another worker takes the run over: its lease expired (:func:`expire_lease`), then
    claimed by ``worker``. The holder's heartbeat may renew the lease between the two; each
    such renewal is followed by another expiry, so the takeover lands whatever the heartbeat's
    interval (a handful of tries at most, not a wait)."""
    for _ in range(50):
        expire_lease(db, run_id)
        lease = ledger.claim(run_id, worker, 30)
        if lease is not None:
            return lease
    raise AssertionError(f"{worker} could not take {run_id} over in 50 tries")


def count(db: psycopg.Connection, table: str, run_id: str) -> int:
    row = db.execute(
        f"SELECT count(*) FROM idempotent_jobs.{table} WHERE run_id = %s",  # noqa: S608
        (run_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


class Collector:
    """A collector that counts its calls and returns a fresh document list each time."""

    def __init__(self) -> None:
        self.calls = 0
        self.value: dict[str, Any] | None = None  # the last value returned

    def __call__(self, ident: RunIdentity) -> dict[str, Any]:
        self.calls += 1
        self.value = {
            "subject": ident.subject_id,
            "documents": [f"doc seen on collect #{self.calls}"],
        }
        return self.value


def email(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"email": {"body": output["summary"]}}


def claimed(
    ledger: HarnessLedger, ident: RunIdentity, worker: str = "w", lease: float = 30
) -> Lease:
    """Register the run and take its lease (which must succeed)."""
    ledger.register(ident)
    taken = ledger.claim(ident.run_id, worker, lease)
    assert taken is not None, f"{worker} could not claim {ident.run_id}"
    return taken


def backdate(db: psycopg.Connection, run_id: str, days: int) -> None:
    """Make a run look completed (and its attempts ended, notifications delivered) long ago."""
    ago = f"{days} days"
    db.execute(
        "UPDATE idempotent_jobs.runs SET completed_at = completed_at - %s::interval"
        " WHERE run_id = %s",
        (ago, run_id),
    )
    db.execute(
        "UPDATE idempotent_jobs.run_attempts SET ended_at = ended_at - %s::interval"
        " WHERE run_id = %s",
        (ago, run_id),
    )
    db.execute(
        "UPDATE idempotent_jobs.notification_outbox SET delivered_at = delivered_at - %s::interval"
        " WHERE run_id = %s AND delivered_at IS NOT NULL",
        (ago, run_id),
    )


def deliver_all(ledger: HarnessLedger) -> list[OutboxRecord]:
    sent: list[OutboxRecord] = []
    ledger.deliver_outbox(lambda row: sent.append(row))
    return sent


class JsonApi:
    """A JSON API on 127.0.0.1 (a helpdesk, a CRM) answering ``payload`` to every GET at
    ``path``; ``asked`` holds each request's query parameters, in order."""

    def __init__(self, payload: Any, path: str = "/api") -> None:
        self.asked: list[dict[str, list[str]]] = []
        api = self
        body = json.dumps(payload).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.asked.append(parse_qs(urlparse(self.path).query))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from idempotent_jobs.models.batches import BatchProvider
    from testkit.fake_providers import FakeProviders


def batch_provider(api: str, fake: "FakeProviders") -> "BatchProvider":
    """The batch API of ``api`` (``openai`` or ``anthropic``) on the fake provider ``fake``."""
    from idempotent_jobs.models.batches import AnthropicBatches, OpenAIBatches

    if api == "openai":
        return OpenAIBatches(model="gpt-4o-mini", api_key="k", base_url=fake.openai_url)
    return AnthropicBatches(model="claude-x", api_key="k", base_url=fake.anthropic_url)


def doc_example(script: str, page: str, database: str, home: "Path") -> tuple[list[str], list[str]]:
    """Run ``docs/examples/<script>`` in a process of its own, from ``home`` (outside the
    repository) on the ledger ``database``; return its printed lines and the lines its page
    ``docs/<page>`` shows under ``<!-- printed -->``, both with ids, times and column padding
    taken out."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from idempotent_jobs.core.constants import DATABASE_URL_ENV

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, DATABASE_URL_ENV: database, "IDEMPOTENT_JOBS_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, str(root / "docs" / "examples" / script)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def stable(text: str) -> list[str]:
        text = re.sub(r"\bsh-[0-9a-f]{12}\b", "<shadow>", text)
        text = re.sub(r"\b[0-9a-f]{32}\b", "<batch>", text)
        text = re.sub(r"\b[0-9a-f]{12}\b", "<run>", text)
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d UTC)?", "<time>", text)
        return [re.sub(r"\s+", " ", line).strip() for line in text.splitlines() if line.strip()]

    shown_page = (root / "docs" / page).read_text()
    [shown] = re.findall(r"<!-- printed -->\n```text\n(.*?)```", shown_page, re.S)
    return stable(done.stdout), stable(shown)
