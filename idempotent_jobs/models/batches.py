"""The providers' batch APIs beside their online ones, with the real SDKs: OpenAI's Batch API
(a JSONL file uploaded, ``/v1/batches``, the output and error files) and Anthropic's Message
Batches (``/v1/messages/batches``, the results JSONL). A batch item's request is the online
request's body, under a ``custom_id``; its answer is read back as the online answer would be
(:class:`~idempotent_jobs.models.answers.Reply`), with its usage at the ``batch`` tier.

Neither provider deduplicates a create: finding a batch whose create answer was lost is the
caller's (:mod:`idempotent_jobs.batches`). :meth:`BatchProvider.find` looks: OpenAI by the
metadata the create carried, Anthropic (whose batches carry none) by listing the batches
created since, with the same number of requests.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from idempotent_jobs.core.error_text import redact_known
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.models.anthropic_messages import AnthropicMessages
from idempotent_jobs.models.batch_api import (
    ANTHROPIC_MAX_BATCH_BYTES,
    ANTHROPIC_MAX_BATCH_REQUESTS,
    CLOCK_SKEW,
    INTENT_KEY,
    OPENAI_MAX_BATCH_BYTES,
    OPENAI_MAX_BATCH_REQUESTS,
    BatchProvider,
    ItemResult,
    ProviderBatch,
    _json_lines,
    _not_an_answer,
    _time,
    _unbilled,
    _unread,
    _worst,
    answer_of,
)
from idempotent_jobs.models.errors import ProviderError, ProviderRequestError
from idempotent_jobs.models.openai_chat import OpenAIChat
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema


@dataclass
class OpenAIBatches(OpenAIChat):
    """OpenAI's Batch API for chat completions, on ``base_url`` with ``model``."""

    completion_window: str = "24h"
    max_batch_requests: int = OPENAI_MAX_BATCH_REQUESTS
    max_batch_bytes: int = OPENAI_MAX_BATCH_BYTES
    marks_batches: bool = field(default=True, init=False)

    def batch_line(
        self, custom_id: str, prompt: Prompt, schema: OutputSchema | None
    ) -> dict[str, Any]:
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": self.request_body(prompt, schema),
        }

    def worst_case(self, prompt: Prompt, schema: OutputSchema | None) -> tuple[int, int | None]:
        return _worst(prompt, schema, self.max_tokens)

    def _batch(self, made: Any) -> ProviderBatch:
        status = str(made.status)
        state = {
            "completed": "completed",
            "expired": "expired",
            "failed": "failed",
            "cancelled": "cancelled",
        }.get(status, "submitted")
        counts = made.request_counts
        errors = getattr(made, "errors", None)
        error = None
        if errors is not None and getattr(errors, "data", None):
            error = "; ".join(str(getattr(e, "message", e)) for e in errors.data)
            error = redact_known(error, [self.api_key])[:2000]
        return ProviderBatch(
            provider_batch_id=str(made.id),
            state=state,
            status={
                "status": status,
                "total": getattr(counts, "total", None),
                "completed": getattr(counts, "completed", None),
                "failed": getattr(counts, "failed", None),
                "output_file_id": made.output_file_id,
                "error_file_id": made.error_file_id,
            },
            created_at=_time(made.created_at),
            requests=getattr(counts, "total", None),
            metadata=dict(made.metadata or {}),
            error=error,
        )

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import openai

        try:
            return fn(*args, **kwargs)
        except openai.APIError as exc:
            raise self._error(exc) from None

    def create_batch(self, lines: list[dict[str, Any]], intent: str) -> ProviderBatch:
        client = self._client()
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        uploaded = self._call(client.files.create, file=("batch.jsonl", content), purpose="batch")
        made = self._call(
            client.batches.create,
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window=self.completion_window,
            metadata={INTENT_KEY: intent},
        )
        return self._batch(made)

    def find_batches(self, intent: str, since: datetime, requests: int) -> list[ProviderBatch]:
        client = self._client()
        found = []
        for made in self._call(client.batches.list, limit=100):  # newest first, paged by the SDK
            batch = self._batch(made)
            if batch.created_at is not None and batch.created_at < since - CLOCK_SKEW:
                break
            if batch.metadata.get(INTENT_KEY) == intent:
                found.append(batch)
        return sorted(found, key=lambda b: (b.created_at or since, b.provider_batch_id))

    def retrieve_batch(self, provider_batch_id: str) -> ProviderBatch:
        return self._batch(self._call(self._client().batches.retrieve, provider_batch_id))

    def cancel_batch(self, provider_batch_id: str) -> ProviderBatch:
        return self._batch(self._call(self._client().batches.cancel, provider_batch_id))

    def batch_results(self, batch: ProviderBatch) -> Iterator[ItemResult]:
        client = self._client()
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.status.get(key)
            if not file_id:
                continue
            text = self._call(client.files.content, file_id).text
            for raw, line in _json_lines(text.splitlines()):
                result = self._result(line) if isinstance(line, dict) else None
                result = result or _unread(self.name, raw, str(line))
                if result is not None:
                    yield result

    def _result(self, line: dict[str, Any]) -> ItemResult | None:
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str):
            return None
        response = line.get("response") or {}
        status = response.get("status_code") if isinstance(response, dict) else None
        if status is None:  # expired or cancelled before it was answered: nothing paid
            return ItemResult(custom_id)
        body = response.get("body")
        if status != 200:
            return ItemResult(custom_id, error=self._item_error(status, body))
        from openai.types.chat import ChatCompletion

        try:
            reply = self.reply_of(ChatCompletion.model_validate(body), tier="batch")
        except Exception as exc:  # noqa: BLE001 - this item's answer, not the batch's
            keys = ("prompt_tokens", "completion_tokens")
            return _not_an_answer(self.name, self.model, custom_id, body, keys, exc)
        return ItemResult(custom_id, reply=reply)

    def _item_error(self, status: Any, body: Any) -> ProviderError:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return ProviderRequestError(
            f"batch item answered {status}: "
            + redact_known(str(message or body), [self.api_key])[:500],
            provider=self.name,
            status=status if isinstance(status, int) else None,
            usage=_unbilled(self.name, self.model),
        )

    def item_answer(self, result: ItemResult, schema: OutputSchema | None) -> ModelAnswer:
        return answer_of(self.name, result, schema)


@dataclass
class AnthropicBatches(AnthropicMessages):
    """Anthropic's Message Batches, on ``base_url`` with ``model``."""

    max_batch_requests: int = ANTHROPIC_MAX_BATCH_REQUESTS
    max_batch_bytes: int = ANTHROPIC_MAX_BATCH_BYTES
    marks_batches: bool = field(default=False, init=False)

    def batch_line(
        self, custom_id: str, prompt: Prompt, schema: OutputSchema | None
    ) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": self.request_params(prompt, schema)}

    def worst_case(self, prompt: Prompt, schema: OutputSchema | None) -> tuple[int, int | None]:
        return _worst(prompt, schema, self.max_tokens)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import anthropic

        try:
            return fn(*args, **kwargs)
        except anthropic.APIError as exc:
            raise self._error(exc) from None

    def _batch(self, made: Any) -> ProviderBatch:
        counts = made.request_counts
        numbers = {
            kind: int(getattr(counts, kind, 0) or 0)
            for kind in ("processing", "succeeded", "errored", "canceled", "expired")
        }
        state = "submitted"
        if made.processing_status == "ended":
            state = "completed"
            if numbers["expired"]:
                state = "expired"
            if numbers["canceled"] or getattr(made, "cancel_initiated_at", None):
                state = "cancelled"
        return ProviderBatch(
            provider_batch_id=str(made.id),
            state=state,
            status={"status": str(made.processing_status), **numbers},
            created_at=_time(made.created_at),
            requests=sum(numbers.values()),
        )

    def create_batch(self, lines: list[dict[str, Any]], intent: str) -> ProviderBatch:
        # No metadata and no idempotency key: a lost answer is found by find_batches.
        return self._batch(self._call(self._client().messages.batches.create, requests=lines))

    def find_batches(self, intent: str, since: datetime, requests: int) -> list[ProviderBatch]:
        found = []
        for made in self._call(self._client().messages.batches.list, limit=100):
            batch = self._batch(made)
            if batch.created_at is not None and batch.created_at < since - CLOCK_SKEW:
                break
            if batch.requests == requests:
                found.append(batch)
        return sorted(found, key=lambda b: (b.created_at or since, b.provider_batch_id))

    def retrieve_batch(self, provider_batch_id: str) -> ProviderBatch:
        return self._batch(self._call(self._client().messages.batches.retrieve, provider_batch_id))

    def cancel_batch(self, provider_batch_id: str) -> ProviderBatch:
        return self._batch(self._call(self._client().messages.batches.cancel, provider_batch_id))

    def batch_results(self, batch: ProviderBatch) -> Iterator[ItemResult]:
        # The SDK's decoder stops at the first line it cannot read; the lines are read here,
        # one by one, so a bad line is only its own item's error.
        results = self._call(self._client().messages.batches.results, batch.provider_batch_id)
        response = results.http_response
        try:
            for raw, line in _json_lines(response.iter_lines()):
                result = self._result(line) if isinstance(line, dict) else None
                result = result or _unread(self.name, raw, str(line))
                if result is not None:
                    yield result
        finally:
            response.close()

    def _result(self, line: dict[str, Any]) -> ItemResult | None:
        from anthropic.types import Message

        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str):
            return None
        result = line.get("result")
        kind = result.get("type") if isinstance(result, dict) else None
        if kind == "succeeded":
            assert isinstance(result, dict)
            body = result.get("message")
            try:
                reply = self.reply_of(Message.model_validate(body), tier="batch")
            except Exception as exc:  # noqa: BLE001 - this item's answer, not the batch's
                keys = ("input_tokens", "output_tokens")
                return _not_an_answer(self.name, self.model, custom_id, body, keys, exc)
            return ItemResult(custom_id, reply=reply)
        if kind == "errored":
            assert isinstance(result, dict)
            inner = result.get("error")
            if isinstance(inner, dict) and isinstance(inner.get("error"), dict):
                inner = inner["error"]
            message = inner.get("message") if isinstance(inner, dict) else inner
            refused = ProviderRequestError(
                "batch item errored: " + redact_known(str(message), [self.api_key])[:500],
                provider=self.name,
                usage=_unbilled(self.name, self.model),
            )
            return ItemResult(custom_id, error=refused)
        if kind in ("canceled", "expired"):  # never answered, nothing paid
            return ItemResult(custom_id)
        unknown = ProviderError(f"its result has no known type: {kind!r}", provider=self.name)
        return ItemResult(custom_id, error=unknown)

    def item_answer(self, result: ItemResult, schema: OutputSchema | None) -> ModelAnswer:
        return answer_of(self.name, result, schema)


__all__ = [
    "AnthropicBatches",
    "BatchProvider",
    "ItemResult",
    "OpenAIBatches",
    "ProviderBatch",
]
