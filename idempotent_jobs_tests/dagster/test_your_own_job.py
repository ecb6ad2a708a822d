"""The second job of docs/your-own-job.md (ticket triage), run as written: twice, one model call.

The example is imported from ``docs/examples/ticket_triage.py``, the file the document shows, and
talks to a helpdesk API and a webhook receiver served here on 127.0.0.1.
"""

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs_tests.chaos.parts import Receiver
from idempotent_jobs_tests.helpers import JsonApi
from idempotent_jobs_tests.ledgers import HarnessLedger

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ticket_triage.py"
PARTITION = "support|2026-11-02"
TICKETS = [
    {"id": 1, "text": "Error 500 when saving"},
    {"id": 2, "text": "Where is my invoice?"},
    {"id": 3, "text": "How do I export?"},
]


def Helpdesk() -> JsonApi:  # noqa: N802 - stands for the helpdesk it serves
    """The helpdesk API: the queue's tickets of a day, whatever is asked; counts the asks."""
    return JsonApi(TICKETS, "/tickets")


@pytest.fixture
def triage(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModuleType, JsonApi, Receiver]]:
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
    triage: tuple[ModuleType, JsonApi, Receiver], ledger: HarnessLedger
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


def test_the_document_points_to_the_example_file() -> None:
    """The quickstart's own blocks are built by test_quickstart.py; this second example is the
    file the page links to, run above as it is."""
    document = (EXAMPLE.parents[1] / "your-own-job.md").read_text(encoding="utf-8")
    assert "](examples/ticket_triage.py)" in document and EXAMPLE.is_file()
