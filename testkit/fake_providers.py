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

from testkit.fake_batches import BadLine, BatchBackend, OddBody

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


#: What a request is answered with (``BadLine`` and ``OddBody``: a batch item's result only).
Scripted = Answer | Status | Slow | Drop | BadLine | OddBody


@dataclass
class Request:
    api: Api
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Limit:
    """A provider's own rate limit per model, as providers enforce it: a token bucket of
    ``requests`` and ``tokens`` per ``window`` seconds, full at first; a request over it is
    answered 429 with ``retry-after``. Tokens are counted as OpenAI counts them before the call:
    the prompt's (a token per 4 characters here) plus the most the answer may take."""

    requests: int | None = None
    tokens: int | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        self._levels: dict[str, tuple[float, float, float]] = {}
        self.throttled = 0
        self.refused: list[tuple[float, float, float, int]] = []
        self.admitted: list[tuple[float, str, int]] = []  # (monotonic time, model, tokens)

    @staticmethod
    def counted(body: dict[str, Any]) -> int:
        text = 0
        for message in body.get("messages", []):
            content = message.get("content")
            text += (
                len(content)
                if isinstance(content, str)
                else sum(len(part.get("text", "")) for part in content or [])
            )
        for block in body.get("system", []) if isinstance(body.get("system"), list) else []:
            text += len(block.get("text", ""))
        most = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        return text // 4 + int(most)

    def admit(self, model: str, tokens: int) -> float | None:
        """``None`` when the request fits (and is counted), else the seconds to wait."""
        now = time.monotonic()
        requests_level, tokens_level, then = self._levels.get(
            model, (float(self.requests or 0), float(self.tokens or 0), now)
        )
        elapsed = now - then
        if self.requests:
            requests_level = min(
                self.requests, requests_level + elapsed * self.requests / self.window
            )
        if self.tokens:
            tokens_level = min(self.tokens, tokens_level + elapsed * self.tokens / self.window)
        short = []
        if self.requests and requests_level < 1:
            short.append((1 - requests_level) * self.window / self.requests)
        if self.tokens and tokens_level < tokens:
            short.append((tokens - tokens_level) * self.window / self.tokens)
        if short:
            self._levels[model] = (requests_level, tokens_level, now)
            self.throttled += 1
            self.refused.append((now, requests_level, tokens_level, tokens))
            return max(short)
        self._levels[model] = (requests_level - 1, tokens_level - tokens, now)
        self.admitted.append((now, model, tokens))
        return None


@dataclass
class FakeProviders:
    """The server; ``script`` is consumed in order, then ``default(request)`` answers. With
    ``limit``, the provider's own rate limit answers 429 first."""

    default: Callable[[Request], Scripted] = field(
        default=lambda request: Answer('{"answer": "ok"}')
    )
    script: list[Scripted] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    limit: Limit | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: The batch endpoints of both APIs (:mod:`testkit.fake_batches`), and their knobs.
        self.batches = BatchBackend(answer=self._item_answer, render=self._item_reply)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _batch(self, method: str, raw: bytes) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                base = f"http://127.0.0.1:{fake.server.server_address[1]}"
                status, reply_headers, data = fake.batches.handle(
                    method, self.path, headers, raw, base
                )
                self.send_response(status)
                for name, value in reply_headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._batch("GET", b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if fake.batches.handles(self.path):
                    self._batch("POST", raw)
                    return
                body = json.loads(raw or b"{}")
                api: Api = "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"
                request = Request(
                    api, self.path, body, {k.lower(): v for k, v in self.headers.items()}
                )
                with fake._lock:
                    fake.requests.append(request)
                    wait = (
                        fake.limit.admit(str(body.get("model")), Limit.counted(body))
                        if fake.limit is not None
                        else None
                    )
                    scripted = fake.script.pop(0) if fake.script and wait is None else None
                if wait is not None:
                    scripted = Status(
                        429, "Rate limit reached", "rate_limit_exceeded", f"{wait:.3f}"
                    )
                if scripted is None:
                    scripted = fake.default(request)
                if isinstance(scripted, Slow):
                    time.sleep(scripted.seconds)
                    scripted = scripted.then
                dropped = isinstance(scripted, Drop)
                if isinstance(scripted, Drop):
                    scripted = scripted.then
                if isinstance(scripted, (BadLine, OddBody)):  # online: a 200 that is no answer
                    scripted = Status(502, "bad gateway")
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

    def _item_answer(self, api: str, body: dict[str, Any]) -> Answer | Status | BadLine | OddBody:
        """A batch item's answer: as the online endpoint would answer its body."""
        path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
        request = Request("anthropic" if api == "anthropic" else "openai", path, body, {})
        with self._lock:
            self.requests.append(request)
            scripted = self.script.pop(0) if self.script else None
        if scripted is None:
            scripted = self.default(request)
        while isinstance(scripted, (Slow, Drop)):  # a batch has no client waiting
            scripted = scripted.then
        return scripted

    def _item_reply(
        self, api: str, body: dict[str, Any], scripted: Answer | Status
    ) -> tuple[int, dict[str, Any]]:
        request = Request("anthropic" if api == "anthropic" else "openai", "", body, {})
        status, _, payload = self._reply(request.api, request, scripted)
        return status, payload

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
