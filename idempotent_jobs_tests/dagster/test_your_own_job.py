"""The second job of docs/your-own-job.md (ticket triage), run as written: twice, one model call.

The example is imported from ``docs/examples/ticket_triage.py``, the file the document shows, and
talks to a helpdesk API and a webhook receiver served here on 127.0.0.1.
"""

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, urlparse

import pytest

from idempotent_jobs import RunLedger
from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs_tests.chaos.parts import Receiver

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ticket_triage.py"
PARTITION = "support|2026-11-02"
TICKETS = [
    {"id": 1, "text": "Error 500 when saving"},
    {"id": 2, "text": "Where is my invoice?"},
    {"id": 3, "text": "How do I export?"},
]


class Helpdesk:
    """A helpdesk API answering the queue's tickets of a day; counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[dict[str, list[str]]] = []
        helpdesk = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                helpdesk.asked.append(parse_qs(urlparse(self.path).query))
                body = json.dumps(TICKETS).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tickets"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def triage(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModuleType, Helpdesk, Receiver]]:
    helpdesk, receiver = Helpdesk(), Receiver()
    monkeypatch.setenv("IDEMPOTENT_JOBS_DATABASE_URL", database)
    monkeypatch.setenv("HELPDESK_TICKETS_URL", helpdesk.url)
    monkeypatch.setenv("TRIAGE_WEBHOOK_URL", receiver.url)
    spec = importlib.util.spec_from_file_location("ticket_triage_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module, helpdesk, receiver
    finally:
        helpdesk.close()
        receiver.close()


def test_the_second_job_runs_twice_with_one_model_call(
    triage: tuple[ModuleType, Helpdesk, Receiver], ledger: RunLedger
) -> None:
    example, helpdesk, receiver = triage
    job = example.defs.resolve_job_def("ticket_triage")
    first = job.execute_in_process(partition_key=PARTITION)
    second = job.execute_in_process(partition_key=PARTITION)
    assert first.success and second.success

    identity = example.TRIAGE.identity_for(PARTITION)
    record = ledger.get(identity.run_id)
    assert record is not None and record.status == "completed"
    assert record.output == {"labels": {"1": "bug", "2": "billing", "3": "question"}}
    calls = ledger.model_calls(identity.run_id)
    assert [(c.outcome, c.model_name, c.caller_step) for c in calls] == [
        ("accepted", "keyword-triage", "transform")
    ]
    assert helpdesk.asked == [{"queue": ["support"], "day": ["2026-11-02"]}]
    key = f"{identity.run_id}:triage_webhook"
    assert dict(receiver.effects) == {key: 1} and dict(receiver.requests) == {key: 1}
    [delivered] = receiver.seen
    assert json.loads(delivered.body) == {
        "queue": "support",
        "day": "2026-11-02",
        "labels": {"1": "bug", "2": "billing", "3": "question"},
    }
    assert output_metadata(first)["persist"]["result"] == "new"
    assert {output_metadata(second)[s]["result"] for s in ("collect", "transform", "persist")} == {
        "reused"
    }


def test_the_document_shows_the_example_file_as_it_is() -> None:
    document = (EXAMPLE.parents[1] / "your-own-job.md").read_text(encoding="utf-8")
    shown = document.split("```python\n", 1)[1].split("```\n", 1)[0]
    body = EXAMPLE.read_text(encoding="utf-8").split('"""\n', 2)[2].lstrip("\n")
    assert shown == body
