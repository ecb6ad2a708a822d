"""A local stand-in for the model providers, faithful to their documented wire formats: OpenAI's
chat completions (``POST /v1/chat/completions``) and Anthropic's Messages (``POST
/v1/messages``), on one HTTP server on 127.0.0.1. No test reaches a real provider.

It answers from a script, one entry per request, then from ``default``: an :class:`Answer`
(text, usage with cached and reasoning tokens, the dated model that answered, how it stopped),
a :class:`Status` (a 429 with ``Retry-After``, a 5xx or 529, a 400 such as a context too long),
a :class:`Slow` answer (sent after the client's timeout), or a :class:`Drop` (cut mid-answer).
Every request is kept, parsed.
"""

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Api = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Answer:
    """A model's answer; ``model``: the dated name that answered (the request's otherwise)."""

    text: str
    input_tokens: int = 100
    output_tokens: int = 20
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    model: str | None = None
    stop: Literal["stop", "length", "refusal", "content_filter"] = "stop"


@dataclass(frozen=True)
class Status:
    """An error answer: ``status`` (429, 500, 529, 400...), ``kind`` as each API names it."""

    status: int
    message: str = "error"
    kind: str = ""
    retry_after: str | None = None


@dataclass(frozen=True)
class Slow:
    """``then`` after ``seconds`` (longer than the client's timeout: it gives up first)."""

    seconds: float
    then: Answer


@dataclass(frozen=True)
class Drop:
    """``then``'s headers and half its body, then the connection closed: the answer was made
    (and billed) but never arrived whole."""

    then: Answer


Scripted = Answer | Status | Slow | Drop


@dataclass
class Request:
    api: Api
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeProviders:
    """The server; ``script`` is consumed in order, then ``default(request)`` answers."""

    default: Callable[[Request], Scripted] = field(
        default=lambda request: Answer('{"answer": "ok"}')
    )
    script: list[Scripted] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                api: Api = "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"
                request = Request(
                    api, self.path, body, {k.lower(): v for k, v in self.headers.items()}
                )
                with fake._lock:
                    fake.requests.append(request)
                    scripted = fake.script.pop(0) if fake.script else None
                if scripted is None:
                    scripted = fake.default(request)
                if isinstance(scripted, Slow):
                    time.sleep(scripted.seconds)
                    scripted = scripted.then
                dropped = isinstance(scripted, Drop)
                if isinstance(scripted, Drop):
                    scripted = scripted.then
                status, headers, payload = fake._reply(api, request, scripted)
                data = json.dumps(payload).encode()
                if dropped:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    self.send_response(status)
                    for name, value in {**headers, "Content-Type": "application/json"}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (Slow)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        #: ``base_url`` for OpenAI's SDK, and for Anthropic's.
        self.openai_url = f"http://127.0.0.1:{port}/v1"
        self.anthropic_url = f"http://127.0.0.1:{port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeProviders":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reply(
        self, api: Api, request: Request, scripted: Answer | Status
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        if isinstance(scripted, Status):
            headers = {"retry-after": scripted.retry_after} if scripted.retry_after else {}
            if api == "openai":
                error = {"message": scripted.message, "type": scripted.kind or "api_error"}
                error["code"] = scripted.kind or None  # type: ignore[assignment]
                return scripted.status, headers, {"error": error}
            kind = scripted.kind or "api_error"
            body = {"type": "error", "error": {"type": kind, "message": scripted.message}}
            return scripted.status, headers, body
        model = scripted.model or str(request.body.get("model", ""))
        n = next(self._ids)
        if api == "openai":
            return 200, {}, _openai_completion(n, model, scripted)
        return 200, {}, _anthropic_message(n, model, scripted)


def _openai_completion(n: int, model: str, answer: Answer) -> dict[str, Any]:
    refused = answer.stop == "refusal"
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None if refused else answer.text,
                    "refusal": answer.text if refused else None,
                },
                "logprobs": None,
                "finish_reason": "stop" if refused else answer.stop,
            }
        ],
        "usage": {
            "prompt_tokens": answer.input_tokens,
            "completion_tokens": answer.output_tokens,
            "total_tokens": answer.input_tokens + answer.output_tokens,
            "prompt_tokens_details": {"cached_tokens": answer.cached_input_tokens},
            "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
        },
    }


def _anthropic_message(n: int, model: str, answer: Answer) -> dict[str, Any]:
    stop = {"stop": "end_turn", "length": "max_tokens", "refusal": "refusal"}.get(
        answer.stop, "end_turn"
    )
    uncached = answer.input_tokens - answer.cached_input_tokens - answer.cache_write_tokens
    return {
        "id": f"msg_{n:024d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": answer.text}],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(0, uncached),
            "output_tokens": answer.output_tokens,
            "cache_creation_input_tokens": answer.cache_write_tokens,
            "cache_read_input_tokens": answer.cached_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": answer.cache_write_tokens,
                "ephemeral_1h_input_tokens": 0,
            },
        },
    }
