"""One answer from a provider: requests retried while the error may pass, the answer checked
against the output schema, and a bounded number of repair turns; every request that reached the
provider accounted for in the ledger as it ends (:mod:`idempotent_jobs.core.calls`).

A request that returned an answer is never sent again for a transport reason: from the moment
the answer is in hand, only a repair turn (a new, paid request that shows the model its answer
and what was wrong with it) follows.
"""

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from idempotent_jobs.core.calls import CallBook, current_calls
from idempotent_jobs.core.error_text import redact_known
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.rate_limits import RateRequest
from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.models.errors import (
    ContentFilteredError,
    OutputSchemaError,
    ProviderError,
    ProviderTimeoutError,
    RefusalError,
)
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema, SchemaMismatch

Finish = Literal["stop", "length", "refusal", "content_filter"]


@dataclass(frozen=True)
class Reply:
    """A provider's answer to one request: its text, what it cost, and why it stopped."""

    text: str | None
    usage: ModelUsage
    finish: Finish = "stop"
    refusal: str | None = None


class Provider(Protocol):
    """One provider's request, made on a prompt, with the output schema when there is one;
    raises a :class:`~idempotent_jobs.models.errors.ProviderError` for what went wrong."""

    @property
    def name(self) -> str: ...

    def send(self, prompt: Prompt, schema: OutputSchema | None) -> Reply: ...

    def ready(self) -> None:
        """Make what a request needs before it can leave (the SDK imported, its client made),
        so the request leaves as soon as its place under a rate limit is taken: a fresh
        process's first request would otherwise arrive seconds after its place."""
        ...

    def rate_request(self, prompt: Prompt) -> RateRequest:
        """What sending ``prompt`` takes under the provider's rate limits (the model asked
        for, the API key's name, the tokens: the prompt's and the most the answer may have)."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """How often a transient provider error is retried inside the attempt, and how long to
    wait: the provider's ``Retry-After`` when it gives one (a wait above ``max_wait_seconds``
    ends the attempt instead), else an exponential backoff with jitter."""

    max_retries: int = 3
    max_wait_seconds: float = 60.0
    backoff_seconds: float = 1.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not 0 <= self.max_retries <= 20:
            raise InvalidInputError("max_retries", f"must be 0 to 20, got {self.max_retries!r}")
        if not 0 <= self.max_wait_seconds <= 3600:
            raise InvalidInputError(
                "max_wait_seconds", f"must be 0 to 3600, got {self.max_wait_seconds!r}"
            )

    def wait_for(self, retry: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``retry`` (from 0); ``None``: do not retry."""
        if retry >= self.max_retries:
            return None
        if retry_after is not None:
            return float(retry_after) if retry_after <= self.max_wait_seconds else None
        backoff = self.backoff_seconds * 2**retry
        return float(min(self.max_wait_seconds, backoff * (0.5 + random.random() / 2)))  # noqa: S311


def send_with_retries(
    provider: Provider,
    prompt: Prompt,
    schema: OutputSchema | None,
    retry: RetryPolicy,
    book: CallBook,
) -> Reply:
    """``provider.send``, retried on a transient error as ``retry`` says; each failed request
    is recorded before the next (the last one's error propagates, and its attempt records it)."""
    rate = provider.rate_request(prompt)
    if schema is not None and rate.max_input_tokens is not None:  # the schema is input too
        schema_bytes = len(json.dumps(dict(schema.json_schema)).encode())
        rate = replace(rate, max_input_tokens=rate.max_input_tokens + 2 * schema_bytes + 512)
    for attempt in range(retry.max_retries + 1):
        provider.ready()  # the slow part of a first request, before its place is taken
        book.before_request(rate)
        try:
            return provider.send(prompt, schema)
        except ProviderError as exc:
            exc.usage = error_usage(exc, rate)
            _redact_echoes(exc, provider, prompt)
            wait = retry.wait_for(attempt, exc.retry_after) if exc.transient else None
            if wait is None:
                raise
            book.paid(exc.usage, "failed", exc)
            retry.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _redact_echoes(exc: ProviderError, provider: Provider, prompt: Prompt) -> None:
    """:func:`redact_echoes` of what ``provider`` was sent: its key and ``prompt``."""
    redact_echoes(exc, getattr(provider, "api_key", None), prompt_texts(prompt))


def prompt_texts(prompt: Prompt) -> list[str]:
    """The texts a request of ``prompt`` carries (its system blocks and messages)."""
    return [block.text for block in prompt.system] + [m.content for m in prompt.messages]


def redact_echoes(exc: ProviderError, key: object, sent: Sequence[str]) -> None:
    """Take out of ``exc``'s text what the request carried that a provider or a proxy may echo
    in its error body: the API key ``key`` (``****``) and the texts ``sent`` (``[prompt]``:
    a prompt's texts, a raw input as JSON, each JSON text's strings too), before the text is
    stored or shown anywhere, and drop the SDK's error it was made from (which holds the same
    text). The prompt holds the run's raw input, which never belongs in an error text. The
    online call does it for each failed request; the batch lane for a batch's refusal and for
    each item's error."""
    try:
        text = redact_known(str(exc), [key] if isinstance(key, str) else [])
        exc.args = (redact_known(text, [*sent, *_json_strings(list(sent))], "[prompt]"),)
        # The SDK's own error, chained as the cause, holds the same text unredacted, and an
        # error's causes reach Dagster's event log and every traceback: the chain ends here.
        exc.__cause__ = None
        exc.__context__ = None
        exc.__suppress_context__ = True
    except Exception:  # noqa: S110 - the error is raised as it is; describe_error redacts keys
        pass


def _json_strings(texts: list[str]) -> list[str]:
    """The strings inside each of ``texts`` that is JSON (a prompt that carries the raw input
    as JSON: an echo quotes its values, not the document)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for text in texts:
        try:
            walk(json.loads(text))
        except (ValueError, RecursionError):  # not JSON, or too deep to walk: as it is
            continue
    return found


def error_usage(exc: ProviderError, rate: RateRequest) -> ModelUsage:
    """What a failed request cost, as providers bill it, with the model it asked for and its
    provider (the ledger prices it by them):

    - usage the provider reported, as it is;
    - the provider answered with an error status (a 4xx including 429, a 5xx) and reported no
      usage, or the connection could not be made (nothing was sent): nothing was billed, so 0
      tokens (the ledger records it ``unbilled``, money 0);
    - no answer at all (a timeout after the request was sent, a connection cut): no usage
      known (``None``; the ledger records it ``in_doubt`` until an operator settles it).
    """
    usage = exc.usage
    if usage is not None and not usage.unknown:
        return replace(
            usage,
            requested_model=usage.requested_model or rate.model,
            provider_name=usage.provider_name or rate.provider or exc.provider,
        )
    answered = exc.status is not None and not isinstance(exc, ProviderTimeoutError)
    tokens = 0 if answered or not exc.sent else None
    return ModelUsage(
        None,
        tokens,
        tokens,
        requested_model=rate.model,
        provider_name=rate.provider or exc.provider,
        tier=usage.tier if usage is not None else None,
    )


def answer(
    provider: Provider,
    prompt: Prompt,
    schema: OutputSchema | None,
    *,
    repair_turns: int = 1,
    retry: RetryPolicy | None = None,
) -> ModelAnswer:
    """The provider's answer to ``prompt`` as the job's output: the JSON object of ``schema``
    (with up to ``repair_turns`` repair turns for an answer outside it), or ``{"text": ...}``
    without a schema. A refusal or a filtered answer is not repaired."""
    retry = retry or RetryPolicy()
    book = current_calls()
    turn = prompt
    for repair in range(repair_turns + 1):
        reply = send_with_retries(provider, turn, schema, retry, book)
        _refuse_refusals(provider.name, reply)
        try:
            output = _output_of(reply, schema)
        except SchemaMismatch as mismatch:
            problems = _problems(reply, mismatch)
            if repair == repair_turns:
                raise _outside(provider.name, schema, problems, reply, repair_turns) from None
            book.paid(reply.usage, "rejected", f"outside the schema: {'; '.join(problems)}")
            turn = turn.repaired(reply.text, problems)
            continue
        return ModelAnswer(output, reply.usage)
    raise AssertionError("unreachable")  # pragma: no cover


def reply_answer(provider: str, reply: Reply, schema: OutputSchema | None) -> ModelAnswer:
    """A final reply (no repair turn can follow it: a batch item's) as the job's output, or the
    error :func:`answer` raises for it (a refusal, a filtered answer, an answer outside
    ``schema``), carrying its usage."""
    _refuse_refusals(provider, reply)
    try:
        return ModelAnswer(_output_of(reply, schema), reply.usage)
    except SchemaMismatch as mismatch:
        raise _outside(provider, schema, _problems(reply, mismatch), reply, 0) from None


def _problems(reply: Reply, mismatch: SchemaMismatch) -> list[str]:
    if reply.finish == "length":
        return ["the answer was cut off at the token limit", *mismatch.problems]
    return list(mismatch.problems)


def _outside(
    provider: str, schema: OutputSchema | None, problems: list[str], reply: Reply, turns: int
) -> OutputSchemaError:
    return OutputSchemaError(
        f"the answer is outside the schema {schema.name if schema else ''} after "
        f"{turns} repair turn(s): {'; '.join(problems)[:500]}",
        provider=provider,
        usage=reply.usage,
        answered=True,
    )


def _refuse_refusals(provider: str, reply: Reply) -> None:
    if reply.finish == "refusal" or reply.refusal:
        raise RefusalError(
            f"the model refused: {(reply.refusal or reply.text or '')[:300]}",
            provider=provider,
            usage=reply.usage,
            answered=True,
        )
    if reply.finish == "content_filter":
        raise ContentFilteredError(
            "the content filter stopped the answer",
            provider=provider,
            usage=reply.usage,
            answered=True,
        )


def _output_of(reply: Reply, schema: OutputSchema | None) -> dict[str, Any]:
    if schema is not None:
        return schema.check(reply.text)
    if not reply.text or not reply.text.strip():
        raise SchemaMismatch(["the answer is empty"])
    return {"text": reply.text.strip()}
