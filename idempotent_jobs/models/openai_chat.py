"""OpenAI's chat completions (and servers that speak them: Azure OpenAI, vLLM, Ollama,
llama.cpp) as a :class:`~idempotent_jobs.models.answers.Provider`, with the ``openai`` SDK.

Structured output is ``response_format={"type": "json_schema", ...}``. The usage recorded is
the response's: the dated model that answered (``gpt-4o-2024-08-06``) beside the one asked for.
The SDK's own retries are off: a retry is this package's, recorded (``answers``).
"""

import json
from dataclasses import dataclass, field, replace
from typing import Any

from idempotent_jobs.core.error_text import redact_known
from idempotent_jobs.core.rate_limits import RateRequest
from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.models.answers import Finish, Reply
from idempotent_jobs.models.errors import (
    ContentFilteredError,
    ContextTooLongError,
    ProviderError,
    ProviderRequestError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RateLimitedError,
    never_sent,
    redirect_error,
)
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a response asks for: ``retry-after-ms``, else ``retry-after`` in seconds (an
    HTTP date is not followed: the backoff applies)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def strict_json_schema(schema: Any) -> Any:
    """``schema`` as OpenAI's strict structured output accepts it, made by the OpenAI SDK's own
    transform (the one its ``parse`` helpers apply to a pydantic model): every object closed
    (``additionalProperties: false``), every property required, references with siblings
    inlined. The answer is still checked against the schema as given."""
    from openai.lib._pydantic import _ensure_strict_json_schema

    copied = json.loads(json.dumps(schema))  # the SDK's transform changes what it is given
    return _ensure_strict_json_schema(copied, path=(), root=copied)


@dataclass
class OpenAIChat:
    """Chat completions at ``base_url`` with ``model``."""

    model: str
    api_key: str = field(repr=False)
    base_url: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_seconds: float = 60.0
    #: The API key's name under the ledger's rate limits (a label, never the key).
    key_name: str = ""
    _made: Any = field(default=None, init=False, repr=False, compare=False)
    strict_schema: bool = True
    name: str = "openai"

    def rate_request(self, prompt: Prompt) -> RateRequest:
        # The client is made (the SDK imported) before a place is reserved, not after: the
        # request then goes at its place, as the provider's bucket expects it.
        self._client()
        return RateRequest(
            self.name,
            self.model,
            prompt.estimated_tokens() + (self.max_tokens or 1024),
            self.key_name,
            max_input_tokens=prompt.max_input_tokens(),
            max_output_tokens=self.max_tokens,
        )

    def _client(self) -> Any:
        """The SDK's client, made once (it keeps its connection pool between requests)."""
        import openai

        if self._made is None:
            self._made = openai.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.timeout_seconds,
                max_retries=0,
                # A redirect is refused (redirect_error), never followed to another host.
                http_client=openai.DefaultHttpxClient(follow_redirects=False),
            )
        return self._made

    def request_body(self, prompt: Prompt, schema: OutputSchema | None) -> dict[str, Any]:
        """The chat completion request's body (online, and as a batch line's ``body``)."""
        messages: list[Any] = (
            [{"role": "system", "content": "\n\n".join(b.text for b in prompt.system)}]
            if prompt.system
            else []
        )
        messages += [{"role": m.role, "content": m.content} for m in prompt.messages]
        options: dict[str, Any] = {}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.max_tokens is not None:
            options["max_completion_tokens"] = self.max_tokens
        if schema is not None:
            options["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": schema.wire_name,
                    "schema": strict_json_schema(dict(schema.json_schema))
                    if self.strict_schema
                    else dict(schema.json_schema),
                    "strict": self.strict_schema,
                },
            }
        return {"model": self.model, "messages": messages, **options}

    def ready(self) -> None:
        """The SDK imported and its client made, with the resource a request goes through
        (the SDK loads it on first use)."""
        self._client().chat.completions  # noqa: B018 - loaded now, not after the place

    def send(self, prompt: Prompt, schema: OutputSchema | None) -> Reply:
        import openai

        client = self._client()
        try:
            response = client.chat.completions.create(**self.request_body(prompt, schema))
        except openai.APIError as exc:
            raise self._error(exc) from None
        return self.reply_of(response)

    def reply_of(self, response: Any, tier: str | None = None) -> Reply:
        """A chat completion (the SDK's object) as a :class:`Reply`; ``tier`` overrides the
        response's service tier (a batch's answers are priced at the batch tier)."""
        used = openai_usage(response, self.model, self.name)
        if tier is not None:
            used = replace(used, tier=tier)
        if not response.choices:
            return Reply(None, used)
        choice = response.choices[0]
        finish: Finish = (
            choice.finish_reason if choice.finish_reason in ("length", "content_filter") else "stop"
        )
        refusal = getattr(choice.message, "refusal", None)
        return Reply(choice.message.content, used, "refusal" if refusal else finish, refusal)

    def _error(self, exc: Exception) -> ProviderError:
        import openai

        text = redact_known(str(exc), [self.api_key])[:500]  # a proxy may echo the key
        if isinstance(exc, openai.APIConnectionError) and never_sent(exc):  # timeouts too
            return ProviderUnavailableError(
                f"could not connect: {text}", provider=self.name, sent=False
            )
        if isinstance(exc, openai.APITimeoutError):
            return ProviderTimeoutError(
                f"no answer within {self.timeout_seconds:g}s", provider=self.name
            )
        if isinstance(exc, openai.APIConnectionError):
            return ProviderUnavailableError(f"connection failed: {text}", provider=self.name)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if 300 <= status < 400:
                return redirect_error(self.name, status, exc.response.headers.get("location"))
            after = retry_after_seconds(exc.response.headers)
            code = getattr(exc, "code", None) or ""
            if status == 429:
                return RateLimitedError(text, provider=self.name, status=status, retry_after=after)
            if status >= 500:
                return ProviderUnavailableError(
                    text, provider=self.name, status=status, retry_after=after
                )
            if code == "context_length_exceeded" or "maximum context length" in text:
                return ContextTooLongError(text, provider=self.name, status=status)
            if code == "content_filter" or "content management policy" in text:
                return ContentFilteredError(text, provider=self.name, status=status)
            return ProviderRequestError(text, provider=self.name, status=status)
        return ProviderRequestError(text, provider=self.name)


#: OpenAI's name for its standard tier (``auto`` resolves to it); recorded as no tier.
_STANDARD_TIERS = {None, "default", "auto", "standard"}


def openai_usage(response: Any, requested: str, provider: str = "openai") -> ModelUsage:
    """A chat completion's usage as the provider reports it: ``prompt_tokens`` (cached ones
    included, ``prompt_tokens_details.cached_tokens`` of them read from the cache),
    ``completion_tokens`` (``completion_tokens_details.reasoning_tokens`` of them reasoning),
    and the response's ``service_tier`` (``flex``, ``priority``; ``default`` is standard)."""
    usage = getattr(response, "usage", None)
    prompt = getattr(usage, "prompt_tokens_details", None)
    completion = getattr(usage, "completion_tokens_details", None)
    tier = getattr(response, "service_tier", None)
    return ModelUsage(
        getattr(response, "model", None) or requested,
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        requested_model=requested,
        cache_read_tokens=getattr(prompt, "cached_tokens", None),
        reasoning_tokens=getattr(completion, "reasoning_tokens", None),
        provider_name=provider,
        tier=None if tier in _STANDARD_TIERS else str(tier),
    )
