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
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from idempotent_jobs.models.answers import Reply
from idempotent_jobs.models.anthropic_messages import AnthropicMessages
from idempotent_jobs.models.errors import ProviderError, ProviderRequestError
from idempotent_jobs.models.openai_chat import OpenAIChat
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema

#: The metadata key a batch's create carries (OpenAI): the ledger's batch id.
INTENT_KEY = "idempotent_jobs_batch"
#: How far back of the marked start a listing looks (clocks of two hosts differ).
CLOCK_SKEW = timedelta(minutes=5)
#: The most requests one batch may hold, by provider (their documented limits).
OPENAI_MAX_BATCH_REQUESTS = 50_000
ANTHROPIC_MAX_BATCH_REQUESTS = 100_000


@dataclass(frozen=True)
class ProviderBatch:
    """A provider's batch as the ledger records it: ``state`` is ``submitted`` while it runs,
    then ``completed``, ``expired``, ``failed`` or ``cancelled``; ``status`` what the provider
    said (its status and counts)."""

    provider_batch_id: str
    state: str
    status: dict[str, Any]
    created_at: datetime | None = None
    requests: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ItemResult:
    """One item's result: ``reply`` (an answer), or ``error`` (a per-item error, paid or not:
    ``usage`` on the error says), or neither (``missing``: expired or cancelled unanswered)."""

    custom_id: str
    reply: Reply | None = None
    error: ProviderError | None = None

    @property
    def missing(self) -> bool:
        return self.reply is None and self.error is None


class BatchProvider(Protocol):
    """One provider's batch API."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def marks_batches(self) -> bool:
        """Whether a batch carries its intent (metadata), so :meth:`find_batches` finds only
        that intent's; else it finds every batch of the same size created since."""
        ...

    @property
    def max_batch_requests(self) -> int:
        """The most requests one batch may hold: a larger range is split into several."""
        ...

    def batch_line(
        self, custom_id: str, prompt: Prompt, schema: OutputSchema | None
    ) -> dict[str, Any]:
        """One item's request, as the batch API takes it."""
        ...

    def worst_case(self, prompt: Prompt, schema: OutputSchema | None) -> tuple[int, int | None]:
        """The most input and output tokens the item's request may take (for a budget)."""
        ...

    def create_batch(self, lines: list[dict[str, Any]], intent: str) -> ProviderBatch: ...

    def find_batches(self, intent: str, since: datetime, requests: int) -> list[ProviderBatch]:
        """The provider's batches that may be ``intent``'s, oldest first: created since
        ``since`` (less the clock skew), carrying ``intent`` where the provider keeps metadata,
        else with ``requests`` requests."""
        ...

    def retrieve_batch(self, provider_batch_id: str) -> ProviderBatch: ...

    def cancel_batch(self, provider_batch_id: str) -> ProviderBatch: ...

    def batch_results(self, batch: ProviderBatch) -> Iterator[ItemResult]: ...


def _worst(
    prompt: Prompt, schema: OutputSchema | None, max_output: int | None
) -> tuple[int, int | None]:
    extra = 2 * len(json.dumps(dict(schema.json_schema)).encode()) + 512 if schema else 0
    return prompt.max_input_tokens() + extra, max_output


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass
class OpenAIBatches(OpenAIChat):
    """OpenAI's Batch API for chat completions, on ``base_url`` with ``model``."""

    completion_window: str = "24h"
    max_batch_requests: int = OPENAI_MAX_BATCH_REQUESTS
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
            error = "; ".join(str(getattr(e, "message", e)) for e in errors.data)[:2000]
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
        from openai.types.chat import ChatCompletion

        client = self._client()
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.status.get(key)
            if not file_id:
                continue
            text = self._call(client.files.content, file_id).text
            for raw in text.splitlines():
                if not raw.strip():
                    continue
                line = json.loads(raw)
                custom_id = str(line.get("custom_id"))
                response = line.get("response") or {}
                status = response.get("status_code")
                if status == 200:
                    completion = ChatCompletion.model_validate(response["body"])
                    yield ItemResult(custom_id, reply=self.reply_of(completion, tier="batch"))
                elif status is not None:
                    yield ItemResult(custom_id, error=self._item_error(status, response))
                else:  # expired or cancelled before it was answered: no result, nothing paid
                    yield ItemResult(custom_id)

    def _item_error(self, status: int, response: dict[str, Any]) -> ProviderError:
        body = response.get("body") or {}
        error = body.get("error") or {}
        message = str(error.get("message") or body)[:500]
        return ProviderRequestError(f"batch item answered {status}: {message}", provider=self.name)


@dataclass
class AnthropicBatches(AnthropicMessages):
    """Anthropic's Message Batches, on ``base_url`` with ``model``."""

    max_batch_requests: int = ANTHROPIC_MAX_BATCH_REQUESTS
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
        results = self._call(self._client().messages.batches.results, batch.provider_batch_id)
        for entry in results:
            custom_id = str(entry.custom_id)
            result = entry.result
            if result.type == "succeeded":
                yield ItemResult(custom_id, reply=self.reply_of(result.message, tier="batch"))
            elif result.type == "errored":
                inner = getattr(result.error, "error", result.error)
                message = str(getattr(inner, "message", inner))[:500]
                yield ItemResult(
                    custom_id,
                    error=ProviderRequestError(
                        f"batch item errored: {message}", provider=self.name
                    ),
                )
            else:  # canceled, expired: never answered, nothing paid
                yield ItemResult(custom_id)
