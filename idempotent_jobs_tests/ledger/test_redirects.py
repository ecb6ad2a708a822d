"""A model call follows no redirect: a 307/308 would POST the prompt (and the key) to another
host and take its answer as the model's paid answer; a 301-303 would turn it into a GET. The
call fails at once with a typed error naming the host, nothing reaches the other host, and the
call is recorded as answered with an error (not billed)."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from idempotent_jobs import run_idempotent
from idempotent_jobs.models import AnthropicMessages, OpenAIChat, Prompt, RetryPolicy, answer
from idempotent_jobs.models.errors import RedirectRefusedError
from idempotent_jobs_tests.helpers import identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.fake_providers import Answer, FakeProviders


class _Redirecting(BaseHTTPRequestHandler):
    status = 307
    target = ""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.status)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def other_host() -> Iterator[FakeProviders]:
    """The host a redirect points at: a provider that would answer (and count the request)."""
    with FakeProviders(default=lambda request: Answer('{"label": "from elsewhere"}')) as fake:
        yield fake


def _redirector(status: int, target: str) -> ThreadingHTTPServer:
    handler = type("Handler", (_Redirecting,), {"status": status, "target": target})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_redirect_is_refused_naming_the_host_and_nothing_reaches_it(
    api: str,
    status: int,
    other_host: FakeProviders,
    ledger: HarnessLedger,
    db: psycopg.Connection,
) -> None:
    target = other_host.openai_url if api == "openai" else other_host.anthropic_url
    origin = target.split("/v1")[0]
    server = _redirector(status, origin)
    base = f"http://127.0.0.1:{server.server_address[1]}" + ("/v1" if api == "openai" else "")
    try:
        model: Any = (
            OpenAIChat(model="gpt-4o", api_key="sk-test", base_url=base)
            if api == "openai"
            else AnthropicMessages(model="claude-x", api_key="sk-ant", base_url=base)
        )
        ident = identity(f"redirect-{api}-{status}")
        with pytest.raises(RedirectRefusedError) as refused:
            run_idempotent(
                ledger,
                ident,
                collect=lambda i: {"x": 1},
                transform=lambda raw: answer(
                    model, Prompt.of(user=json.dumps(raw)), None, retry=RetryPolicy(max_retries=3)
                ),
            )
    finally:
        server.shutdown()
    assert refused.value.final and not refused.value.transient
    assert origin.removeprefix("http://") in str(refused.value)
    assert other_host.requests == []  # the prompt never went to the other host
    calls = db.execute(
        "SELECT outcome, input_tokens, billing FROM idempotent_jobs.model_calls WHERE run_id = %s",
        (ident.run_id,),
    ).fetchall()
    assert calls == [("failed", 0, "unbilled")]  # one request: not retried
