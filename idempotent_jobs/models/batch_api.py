"""What the lane asks of a provider's batch API (:class:`BatchProvider`), and how a batch's
result lines are read whatever the provider: one line at a time, a line that is not JSON or
names no item kept apart, a body that is not an answer refused with its usage. The providers'
own classes are :mod:`idempotent_jobs.models.batches`'."""

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.models.answers import Reply, reply_answer
from idempotent_jobs.models.errors import ProviderError
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema

#: The metadata key a batch's create carries (OpenAI): the ledger's batch id.
INTENT_KEY = "idempotent_jobs_batch"
#: How far back of the marked start a listing looks (clocks of two hosts differ).
CLOCK_SKEW = timedelta(minutes=5)
#: The most requests one batch may hold, by provider (their documented limits).
OPENAI_MAX_BATCH_REQUESTS = 50_000
ANTHROPIC_MAX_BATCH_REQUESTS = 100_000
#: The most bytes of requests one batch may hold, by provider (OpenAI: its input file, 200 MB;
#: Anthropic: the create's body, 256 MB).
OPENAI_MAX_BATCH_BYTES = 200_000_000
ANTHROPIC_MAX_BATCH_BYTES = 256_000_000


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

    @property
    def max_batch_bytes(self) -> int:
        """The most bytes of requests (JSON lines) one batch may hold: a range whose requests
        are larger is split into several, as by :attr:`max_batch_requests`."""
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

    def batch_results(self, batch: ProviderBatch) -> Iterator[ItemResult]:
        """Each item's result. A line that cannot be read is that item's error (named by its
        ``custom_id`` when the line still shows one), never the end of the iteration."""
        ...

    def item_answer(self, result: ItemResult, schema: OutputSchema | None) -> ModelAnswer:
        """An answered item as its online model step's answer (the output of ``schema``, or
        ``{"text": ...}``), or the error that step would raise for it, carrying its usage."""
        ...


#: A ``custom_id`` as the lane writes them, found in a result line that is not JSON.
_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')


def _unread(provider: str, raw: str, why: str) -> ItemResult | None:
    """A result line that could not be read: the error of the item it names (its cost unknown:
    the call is in doubt until settled), or ``None`` when it names none."""
    found = _CUSTOM_ID.search(raw)
    if found is None:
        return None
    error = ProviderError(f"its batch result could not be read: {why}"[:500], provider=provider)
    return ItemResult(found.group(1), error=error)


def _json_lines(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """Each non-blank line with its JSON value (``None`` and the error text when it is not
    JSON, or not an object)."""
    for raw in lines:
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            yield raw, f"the line is not JSON ({exc})"
            continue
        yield raw, value if isinstance(value, dict) else "the line is not a JSON object"


def _unbilled(provider: str, model: str) -> ModelUsage:
    """What an item the provider answered with an error costs: nothing billed (0 tokens)."""
    return ModelUsage(None, 0, 0, requested_model=model, provider_name=provider, tier="batch")


def _usage_in(body: Any, model: str, provider: str, keys: tuple[str, str]) -> ModelUsage | None:
    """The token counts a body that is not a well-formed answer still reports, if any."""
    used = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(used, dict):
        return None
    counts = [used.get(key) for key in keys]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return None
    return ModelUsage(
        None, counts[0], counts[1], requested_model=model, provider_name=provider, tier="batch"
    )


def _not_an_answer(
    provider: str,
    model: str,
    custom_id: str,
    body: Any,
    keys: tuple[str, str],
    exc: Exception,
) -> ItemResult:
    """An item answered 200 with a body that is not an answer the SDK can read: its error, with
    whatever usage the body still reports (a ``rejected`` call then, paid; else in doubt)."""
    usage = _usage_in(body, model, provider, keys)
    error = ProviderError(
        f"its answer is not one the provider's SDK reads: {exc}"[:500],
        provider=provider,
        usage=usage,
        answered=usage is not None,
    )
    return ItemResult(custom_id, error=error)


def answer_of(provider: str, result: ItemResult, schema: OutputSchema | None) -> ModelAnswer:
    """The lane's answer for an item: its error raised, or its reply read as the online model
    step reads a final reply (refusals, the schema)."""
    if result.error is not None:
        raise result.error
    if result.reply is None:
        raise ProviderError("the batch ended with no result for it", provider=provider)
    return reply_answer(provider, result.reply, schema)


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
