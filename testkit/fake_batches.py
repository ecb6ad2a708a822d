"""The batch APIs of the fake providers (:mod:`testkit.fake_providers`), faithful to their
documented formats: OpenAI's Batch API (``POST /v1/files`` with a JSONL file, ``/v1/batches``,
the output and error files at ``/v1/files/{id}/content``) and Anthropic's Message Batches
(``/v1/messages/batches``, results JSONL at ``results_url``). Both list batches newest first.

Each item is answered as the online endpoint would answer its body (the server's ``script``
then ``default``): an ``Answer`` is a succeeded line, a ``Status`` a per-item error. Knobs: how
many status reads a batch stays in progress (``polls_to_complete``), expiry with only the first
``expire_after_items`` done, cancellation, an error status on any endpoint (``fail_next``: a
status, or a status and its message), a create that makes the batch but answers 500
(``lose_next_creates``: the window where a retry would submit twice), and the most requests a
create takes (``max_requests``, the providers' limits by default). ``created`` counts every
batch made, per API.
"""

import email.parser
import email.policy
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

Endpoint = str  # "upload", "create", "retrieve", "list", "cancel", "results"


@dataclass(frozen=True)
class BadLine:
    """An item whose result line is not JSON: cut mid-way after its ``custom_id`` (``named``),
    or garbage that names no item."""

    named: bool = True


@dataclass(frozen=True)
class OddBody:
    """An item answered 200 with ``body``, which is not a chat completion (or a message)."""

    body: dict[str, Any]


def _raw(entry: dict[str, Any]) -> str | None:
    raw = entry.get("__raw__")
    return raw if isinstance(raw, str) else None


@dataclass
class FakeBatch:
    api: str
    batch_id: str
    requests: list[tuple[str, dict[str, Any]]]
    metadata: dict[str, str]
    created_at: float
    polls_left: int
    state: str = "in_progress"  # in_progress, cancelling, ended
    outcome: str = ""  # completed, expired, cancelled
    results: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass
class BatchBackend:
    """The batch endpoints' state and knobs; ``answer(api, body)`` answers one item."""

    answer: Callable[[str, dict[str, Any]], Any]
    render: Callable[[str, dict[str, Any], Any], tuple[int, dict[str, Any]]]
    polls_to_complete: int = 0
    expire_after_items: int | None = None
    fail_next: dict[Endpoint, list[int | tuple[int, str]]] = field(default_factory=dict)
    lose_next_creates: int = 0
    #: The most requests a create takes, per API (the providers' documented limits); more is
    #: refused with a 400, as the providers do.
    max_requests: dict[str, int] = field(
        default_factory=lambda: {"openai": 50_000, "anthropic": 100_000}
    )
    created: dict[str, list[str]] = field(default_factory=lambda: {"openai": [], "anthropic": []})
    calls: list[tuple[str, Endpoint]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, FakeBatch] = {}

    # -- routing ------------------------------------------------------------------------------

    def handles(self, path: str) -> bool:
        path = path.split("?")[0]
        return path.startswith(("/v1/files", "/v1/batches", "/v1/messages/batches"))

    def handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes, base: str
    ) -> tuple[int, dict[str, str], bytes]:
        route, _, query = path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        parts = route.strip("/").split("/")
        api = "anthropic" if parts[1] == "messages" else "openai"
        endpoint = self._endpoint(method, parts)
        with self._lock:
            self.calls.append((api, endpoint))
            failing = self.fail_next.get(endpoint)
            fault = failing.pop(0) if failing else None
        if fault is not None:  # a status, or a status and the error's message
            status, message = fault if isinstance(fault, tuple) else (fault, f"{endpoint} failed")
            return self._error(api, status, message)
        if api == "openai":
            return self._openai(method, parts, params, headers, raw, base)
        return self._anthropic(method, parts, params, raw, base)

    @staticmethod
    def _endpoint(method: str, parts: list[str]) -> Endpoint:
        if parts[1] == "files":
            return "upload" if method == "POST" else "results"
        tail = parts[3:] if parts[1] == "messages" else parts[2:]
        if method == "POST":
            return "cancel" if tail[-1:] == ["cancel"] else "create"
        if tail[-1:] == ["results"]:
            return "results"
        return "retrieve" if tail else "list"

    # -- OpenAI -------------------------------------------------------------------------------

    def _openai(
        self,
        method: str,
        parts: list[str],
        params: dict[str, str],
        headers: dict[str, str],
        raw: bytes,
        base: str,
    ) -> tuple[int, dict[str, str], bytes]:
        if parts[1] == "files" and method == "POST":
            content, purpose = _multipart_file(headers.get("content-type", ""), raw)
            file_id = f"file-{next(self._ids)}"
            with self._lock:
                self.files[file_id] = content
            return _json(
                200,
                {
                    "id": file_id,
                    "object": "file",
                    "bytes": len(content),
                    "created_at": int(time.time()),
                    "filename": "batch.jsonl",
                    "purpose": purpose,
                },
            )
        if parts[1] == "files":  # GET /v1/files/{id}/content
            data = self.files.get(parts[2])
            if data is None:
                return self._error("openai", 404, f"no file {parts[2]}")
            return 200, {"Content-Type": "application/octet-stream"}, data
        if method == "POST" and len(parts) == 2:
            body = json.loads(raw or b"{}")
            uploaded = self.files.get(str(body.get("input_file_id")))
            if uploaded is None:
                return self._error("openai", 400, "input_file_id is not an uploaded file")
            lines = [json.loads(line) for line in uploaded.decode().splitlines() if line.strip()]
            requests = [(str(line["custom_id"]), dict(line["body"])) for line in lines]
            refused = self._too_many("openai", requests)
            if refused is not None:
                return refused
            batch = self._create("openai", requests, dict(body.get("metadata") or {}))
            batch.input_file_id = str(body["input_file_id"])
            return self._created("openai", batch, lambda: self._openai_batch(batch))
        if method == "POST":  # cancel
            return self._cancel("openai", parts[2], lambda b: self._openai_batch(b))
        if len(parts) == 2:  # list
            return self._list("openai", params, "after", lambda b: self._openai_batch(b))
        batch_or_error = self._read("openai", parts[2])
        if isinstance(batch_or_error, tuple):
            return batch_or_error
        return _json(200, self._openai_batch(batch_or_error))

    def _openai_batch(self, batch: FakeBatch) -> dict[str, Any]:
        status = {
            "in_progress": "in_progress",
            "cancelling": "cancelling",
            "ended": {"completed": "completed", "expired": "expired", "cancelled": "cancelled"}.get(
                batch.outcome, "completed"
            ),
        }[batch.state]
        done = len([r for r in batch.results if _raw(r) or r["response"]["status_code"] == 200])
        return {
            "id": batch.batch_id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": int(batch.created_at),
            "expires_at": int(batch.created_at + 86400),
            "request_counts": {
                "total": len(batch.requests),
                "completed": done,
                "failed": len(batch.results) - done + len(batch.errors),
            },
            "metadata": batch.metadata,
        }

    # -- Anthropic ----------------------------------------------------------------------------

    def _anthropic(
        self, method: str, parts: list[str], params: dict[str, str], raw: bytes, base: str
    ) -> tuple[int, dict[str, str], bytes]:
        def render(b: FakeBatch) -> dict[str, Any]:
            return self._anthropic_batch(b, base)

        if method == "POST" and len(parts) == 3:
            body = json.loads(raw or b"{}")
            requests = [(str(r["custom_id"]), dict(r["params"])) for r in body["requests"]]
            refused = self._too_many("anthropic", requests)
            if refused is not None:
                return refused
            batch = self._create("anthropic", requests, {})
            return self._created("anthropic", batch, lambda: render(batch))
        if method == "POST":
            return self._cancel("anthropic", parts[3], render)
        if len(parts) == 3:
            return self._list("anthropic", params, "after_id", render)
        batch_or_error = self._read("anthropic", parts[3])
        if isinstance(batch_or_error, tuple):
            return batch_or_error
        batch = batch_or_error
        if parts[-1] == "results":
            if batch.state != "ended":
                return self._error("anthropic", 400, "the batch is still processing")
            return 200, {"Content-Type": "application/binary"}, _jsonl(batch.results)
        return _json(200, render(batch))

    def _anthropic_batch(self, batch: FakeBatch, base: str) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if batch.state != "ended":
            counts["processing"] = len(batch.requests)
        for result in batch.results:
            counts["succeeded" if _raw(result) else result["result"]["type"]] += 1
        ended = batch.state == "ended"
        return {
            "id": batch.batch_id,
            "type": "message_batch",
            "processing_status": batch.state if batch.state != "cancelling" else "canceling",
            "request_counts": counts,
            "ended_at": _iso(time.time()) if ended else None,
            "created_at": _iso(batch.created_at),
            "expires_at": _iso(batch.created_at + 86400),
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"{base}/v1/messages/batches/{batch.batch_id}/results"
            if ended
            else None,
        }

    # -- shared ---------------------------------------------------------------------------------

    def _too_many(
        self, api: str, requests: list[tuple[str, dict[str, Any]]]
    ) -> tuple[int, dict[str, str], bytes] | None:
        most = self.max_requests[api]
        if len(requests) <= most:
            return None
        return self._error(api, 400, f"a batch takes at most {most} requests, not {len(requests)}")

    def _create(
        self, api: str, requests: list[tuple[str, dict[str, Any]]], metadata: dict[str, str]
    ) -> FakeBatch:
        n = next(self._ids)
        batch_id = f"batch_{n:08d}" if api == "openai" else f"msgbatch_{n:08d}"
        batch = FakeBatch(api, batch_id, requests, metadata, time.time(), self.polls_to_complete)
        with self._lock:
            self.batches[batch_id] = batch
            self.created[api].append(batch_id)
        return batch

    def _created(
        self, api: str, batch: FakeBatch, render: Callable[[], dict[str, Any]]
    ) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            lose = self.lose_next_creates > 0
            self.lose_next_creates -= int(lose)
        if lose:  # made, but the answer never says so
            return self._error(api, 500, "internal error")
        return _json(200, render())

    def _read(self, api: str, batch_id: str) -> FakeBatch | tuple[int, dict[str, str], bytes]:
        batch = self.batches.get(batch_id)
        if batch is None or batch.api != api:
            return self._error(api, 404, f"no batch {batch_id}")
        with self._lock:
            if batch.state != "ended":
                if batch.polls_left > 0:
                    batch.polls_left -= 1
                else:
                    self._finish(batch, "cancelled" if batch.state == "cancelling" else "")
        return batch

    def _cancel(
        self, api: str, batch_id: str, render: Callable[[FakeBatch], dict[str, Any]]
    ) -> tuple[int, dict[str, str], bytes]:
        batch = self.batches.get(batch_id)
        if batch is None or batch.api != api:
            return self._error(api, 404, f"no batch {batch_id}")
        with self._lock:
            if batch.state == "in_progress":
                batch.state = "cancelling"
        return _json(200, render(batch))

    def _list(
        self,
        api: str,
        params: dict[str, str],
        cursor: str,
        render: Callable[[FakeBatch], dict[str, Any]],
    ) -> tuple[int, dict[str, str], bytes]:
        newest_first = [b for b in reversed(self.batches.values()) if b.api == api]
        after = params.get(cursor)
        if after:
            ids = [b.batch_id for b in newest_first]
            newest_first = newest_first[ids.index(after) + 1 :] if after in ids else []
        limit = int(params.get("limit", "20"))
        page = newest_first[:limit]
        body: dict[str, Any] = {
            "data": [render(b) for b in page],
            "has_more": len(newest_first) > limit,
            "first_id": page[0].batch_id if page else None,
            "last_id": page[-1].batch_id if page else None,
        }
        if api == "openai":
            body["object"] = "list"
        return _json(200, body)

    def _finish(self, batch: FakeBatch, outcome: str) -> None:
        """End ``batch``: each item answered (or, past an expiry or a cancel, not)."""
        expired = outcome != "cancelled" and self.expire_after_items is not None
        outcome = outcome or ("expired" if expired else "completed")
        done = len(batch.requests)
        if outcome == "cancelled":
            done = 0
        elif expired:
            done = min(done, self.expire_after_items or 0)
        batch.state, batch.outcome = "ended", outcome
        for n, (custom_id, body) in enumerate(batch.requests):
            if n < done:
                answer = self.answer(batch.api, body)
                if isinstance(answer, BadLine):
                    cut = json.dumps({"custom_id": custom_id, "response": {}})[:-3]
                    batch.results.append({"__raw__": cut if answer.named else "<html>502"})
                    continue
                if isinstance(answer, OddBody):
                    status, payload = 200, answer.body
                else:
                    status, payload = self.render(batch.api, body, answer)
                batch.results.append(_result_line(batch.api, custom_id, status, payload, n))
            elif batch.api == "anthropic":
                kind = "canceled" if outcome == "cancelled" else "expired"
                batch.results.append({"custom_id": custom_id, "result": {"type": kind}})
            else:
                code = "batch_cancelled" if outcome == "cancelled" else "batch_expired"
                batch.errors.append(
                    {
                        "id": f"batch_req_{n}",
                        "custom_id": custom_id,
                        "response": None,
                        "error": {"code": code, "message": f"the batch was {outcome}"},
                    }
                )
        if batch.api == "openai":
            answered = [r for r in batch.results if _raw(r) or r["response"]["status_code"] == 200]
            failed = [r for r in batch.results if not _raw(r) and r not in answered]
            if answered:
                batch.output_file_id = f"file-{next(self._ids)}"
                self.files[batch.output_file_id] = _jsonl(answered)
            if failed or batch.errors:
                batch.error_file_id = f"file-{next(self._ids)}"
                self.files[batch.error_file_id] = _jsonl(failed + batch.errors)

    def _error(self, api: str, status: int, message: str) -> tuple[int, dict[str, str], bytes]:
        if api == "openai":
            return _json(status, {"error": {"message": message, "type": "api_error"}})
        return _json(status, {"type": "error", "error": {"type": "api_error", "message": message}})


def _result_line(
    api: str, custom_id: str, status: int, payload: dict[str, Any], n: int
) -> dict[str, Any]:
    if api == "openai":
        return {
            "id": f"batch_req_{n}",
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"req_{n}", "body": payload},
            "error": None,
        }
    if status == 200:
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": payload}}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": payload}}


def _multipart_file(content_type: str, raw: bytes) -> tuple[bytes, str]:
    """The file part and the ``purpose`` field of a multipart/form-data upload."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw
    )
    content, purpose = b"", ""
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "file":
            content = data
        elif name == "purpose":
            purpose = data.decode()
    return content, purpose


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join((_raw(line) or json.dumps(line)) + "\n" for line in lines).encode()


def _json(status: int, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _iso(seconds: float) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).isoformat()
