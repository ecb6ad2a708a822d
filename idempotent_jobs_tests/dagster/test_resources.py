"""The real resource implementations against small local HTTP servers on 127.0.0.1."""

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from idempotent_jobs import RunIdentity
from idempotent_jobs.core.records import OutboxRecord
from idempotent_jobs.dagster.resources import (
    FeedCollector,
    JsonLinesChannel,
    LocalExtractiveSummarizer,
    OpenAICompatibleSummaryModel,
    SampleDocumentsCollector,
    StepContext,
    WebhookChannel,
)
from idempotent_jobs_tests.helpers import claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger

Handler = Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, Any] | str]]


@contextmanager
def http_server(handle: Handler) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serve ``handle`` on 127.0.0.1; yield the base URL and the requests seen."""
    seen: list[dict[str, Any]] = []

    class RequestHandler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
            status, answer = handle(self, body)
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), RequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def chat_completions(handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, Any]]:
    request = json.loads(body)
    docs = request["messages"][1]["content"]
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": f"  Summary of {docs.count('- ')} docs. ",
                },
            }
        ],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    }


def test_the_openai_compatible_summary_model_speaks_chat_completions() -> None:
    with http_server(chat_completions) as (url, seen):
        model = OpenAICompatibleSummaryModel(
            base_url=f"{url}/v1", model="llama3", api_key="sk-test-key"
        )
        answer = model.summarize(
            "Summarise.", {"documents": ["one.", {"title": "t", "text": "two."}]}
        )
    assert answer.output == {"summary": "Summary of 2 docs."}
    assert (answer.usage.model_name, answer.usage.input_tokens, answer.usage.output_tokens) == (
        "llama3",
        42,
        7,
    )
    [request] = seen
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test-key"
    sent = json.loads(request["body"])
    assert sent["messages"][0] == {"role": "system", "content": "Summarise."}
    assert "sk-test-key" not in repr(model)


def test_the_prompt_template_is_configuration_and_part_of_the_recorded_config() -> None:
    identity = RunIdentity("triage", "support", datetime(2026, 11, 2, tzinfo=UTC), "v1")
    context = StepContext(identity, "Label the tickets.", identity.run_id)
    template = "You triage the {subject} queue for {window_start}. {instructions}"
    with http_server(chat_completions) as (url, seen):
        model = OpenAICompatibleSummaryModel(
            base_url=f"{url}/v1", model="m", prompt_template=template
        )
        model.generate({"documents": ["x."]}, context)
    system = json.loads(seen[0]["body"])["messages"][0]["content"]
    assert system == (
        "You triage the support queue for 2026-11-02T00:00:00+00:00. Label the tickets."
    )
    plain = OpenAICompatibleSummaryModel(base_url="http://unused/v1", model="m")
    assert plain.settings() == {} and set(model.settings()) == {"prompt_template"}
    reworded = OpenAICompatibleSummaryModel(
        base_url="http://unused/v1", model="m", prompt_template="{instructions} Be brief."
    )
    assert reworded.settings() != model.settings()
    with pytest.raises(ValueError, match="prompt_template"):
        OpenAICompatibleSummaryModel(
            base_url="http://unused/v1", model="m", prompt_template="{unknown}"
        ).generate({"documents": ["x."]}, context)


def test_the_openai_compatible_summary_model_refuses_an_empty_answer() -> None:
    def empty(handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, Any]]:
        status, answer = chat_completions(handler, body)
        answer["choices"][0]["message"]["content"] = "   "
        return status, answer

    with http_server(empty) as (url, _):
        model = OpenAICompatibleSummaryModel(base_url=f"{url}/v1", model="m")
        with pytest.raises(ValueError, match="empty answer"):
            model.summarize("p", {"documents": ["x."]})


def test_the_openai_compatible_summary_model_surfaces_server_errors() -> None:
    with http_server(lambda h, b: (500, {"error": {"message": "overloaded"}})) as (url, seen):
        model = OpenAICompatibleSummaryModel(base_url=f"{url}/v1", model="m")
        with pytest.raises(Exception, match="overloaded"):
            model.summarize("p", {"documents": ["x."]})
    assert len(seen) == 1  # no hidden SDK retries: the op's RetryPolicy decides


def outbox_row(channel: str = "hook") -> OutboxRecord:
    return OutboxRecord(
        run_id="a" * 64,
        channel=channel,
        payload={"summary": "s"},
        created_at=datetime.now(UTC),
        delivered_at=None,
        delivery_attempts=0,
        last_error=None,
    )


def test_webhook_sends_the_idempotency_key() -> None:
    with http_server(lambda h, b: (202, "accepted")) as (url, seen):
        WebhookChannel(url=f"{url}/hook", authorization="Bearer t0ken").send(outbox_row())
    [request] = seen
    assert request["headers"]["Idempotency-Key"] == f"{'a' * 64}:hook"
    assert request["headers"]["Authorization"] == "Bearer t0ken"
    assert json.loads(request["body"]) == {"summary": "s"}


def test_webhook_errors_are_recorded_and_the_retry_reuses_the_key(ledger: HarnessLedger) -> None:
    answers = iter([500, 200])
    lease = claimed(ledger, identity(), "w", 30)
    ledger.complete(lease, {"summary": "s"}, {"hook": {"summary": "s"}})
    with http_server(lambda h, b: (next(answers), "")) as (url, seen):
        channel = WebhookChannel(url=f"{url}/hook")
        first = ledger.deliver_outbox(channel.send)
        second = ledger.deliver_outbox(channel.send)
        third = ledger.deliver_outbox(channel.send)
    assert [reason for _, reason in first.failed] == ["ConnectionError: webhook answered HTTP 500"]
    assert len(second.delivered) == 1 and third.delivered == [] and third.failed == []
    keys = [r["headers"]["Idempotency-Key"] for r in seen]
    assert keys == [f"{identity().run_id}:hook"] * 2


def test_webhook_timeout_is_a_failure_not_a_hang() -> None:
    release = threading.Event()

    def stall(handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str]:
        release.wait(5)
        return 200, ""

    with http_server(stall) as (url, _):
        with pytest.raises(TimeoutError):
            WebhookChannel(url=f"{url}/hook", timeout_seconds=0.3).send(outbox_row())
        release.set()


def test_json_lines_channel_writes_each_key_once(tmp_path: Any) -> None:
    channel = JsonLinesChannel(path=str(tmp_path / "out" / "n.jsonl"))
    for _ in range(3):
        channel.send(outbox_row("file"))
    channel.send(outbox_row("other"))
    lines = [json.loads(x) for x in (tmp_path / "out" / "n.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [f"{'a' * 64}:file", f"{'a' * 64}:other"]


def test_feed_collector_keeps_the_items_of_the_window() -> None:
    rss = """<?xml version="1.0"?><rss version="2.0"><channel>
      <item><title>In window</title><description>Globex cut prices.</description>
        <pubDate>Fri, 07 Aug 2026 10:00:00 GMT</pubDate></item>
      <item><title>Too late</title><pubDate>Sat, 08 Aug 2026 10:00:00 GMT</pubDate></item>
      <item><title>Too early</title><pubDate>Thu, 06 Aug 2026 23:59:59 GMT</pubDate></item>
    </channel></rss>"""
    ident = identity(hour=0)
    with http_server(lambda h, b: (200, rss)) as (url, seen):
        collected = FeedCollector(url_template=f"{url}/feeds/{{subject}}.xml").collect(ident)
    assert seen[0]["path"] == "/feeds/workspace-acme.xml"
    assert [d["title"] for d in collected["documents"]] == ["In window"]
    assert collected["window_start"] == "2026-08-07T00:00:00+00:00"


def test_offline_defaults_are_deterministic() -> None:
    raw = SampleDocumentsCollector().collect(identity())
    assert raw["subject"] == "workspace-acme" and len(raw["documents"]) == 3
    model = LocalExtractiveSummarizer(max_sentences=2)
    first, second = model.summarize("p", raw), model.summarize("p", raw)
    assert first == second
    assert first.output["sentences"] == 2 and first.output["summary"]
    assert first.usage.model_name == "local-extractive" and (first.usage.input_tokens or 0) > 0
    with pytest.raises(ValueError, match="documents"):
        model.summarize("p", {"documents": "not a list"})
