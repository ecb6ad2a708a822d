"""Anthropic's Messages API as a :class:`~idempotent_jobs.models.answers.Provider`, with the
``anthropic`` SDK.

Structured output is ``output_config={"format": {"type": "json_schema", ...}}``. A system block
or message marked ``cache`` gets a cache breakpoint (``cache_control``), so the prompt up to
there is read back from the cache on the next call. The SDK's own retries are off: a retry is
this package's, recorded (``answers``). The input tokens recorded are all the input the call
read: uncached, written to the cache, and read from it.
"""

import json
from dataclasses import dataclass, field, replace
from typing import Any

from idempotent_jobs.core.error_text import redact_known
from idempotent_jobs.core.rate_limits import RateRequest
from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.models.answers import Reply
from idempotent_jobs.models.errors import (
    ContextTooLongError,
    ProviderError,
    ProviderRequestError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RateLimitedError,
    never_sent,
    redirect_error,
)
from idempotent_jobs.models.openai_chat import retry_after_seconds
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema

_CACHE = {"type": "ephemeral"}


def anthropic_json_schema(schema: OutputSchema) -> dict[str, Any]:
    """The output schema as Anthropic's structured output accepts it, made by the Anthropic SDK's
    own transform (``anthropic.transform_schema``, what its ``parse`` helper sends): objects
    closed, and the constraints the API does not take (``maxItems``, ``maxLength``, ``minimum``
    ...) moved into the description. The answer is still checked against the schema as given."""
    import anthropic

    return anthropic.transform_schema(json.loads(json.dumps(dict(schema.json_schema))))


@dataclass
class AnthropicMessages:
    """Messages with ``model``; ``max_tokens`` is required by the API."""

    model: str
    api_key: str = field(repr=False)
    max_tokens: int = 1024
    base_url: str | None = None
    temperature: float | None = None
    timeout_seconds: float = 60.0
    #: The API key's name under the ledger's rate limits (a label, never the key).
    key_name: str = ""
    _made: Any = field(default=None, init=False, repr=False, compare=False)
    name: str = "anthropic"

    def rate_request(self, prompt: Prompt) -> RateRequest:
        # The client is made (the SDK imported) before a place is reserved, not after: the
        # request then goes at its place, as the provider's bucket expects it.
        self._client()
        return RateRequest(
            self.name,
            self.model,
            prompt.estimated_tokens() + self.max_tokens,
            self.key_name,
            max_input_tokens=prompt.max_input_tokens(),
            max_output_tokens=self.max_tokens,
        )

    def _client(self) -> Any:
        """The SDK's client, made once (it keeps its connection pool between requests)."""
        import anthropic

        if self._made is None:
            self._made = anthropic.Anthropic(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.timeout_seconds,
                max_retries=0,
                # A redirect is refused (redirect_error), never followed to another host.
                http_client=anthropic.DefaultHttpxClient(follow_redirects=False),
            )
        return self._made

    def request_params(self, prompt: Prompt, schema: OutputSchema | None) -> dict[str, Any]:
        """The Messages request's parameters (online, and as a batch request's ``params``)."""
        options: dict[str, Any] = {}
        if prompt.system:
            options["system"] = [
                {"type": "text", "text": b.text, **({"cache_control": _CACHE} if b.cache else {})}
                for b in prompt.system
            ]
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if schema is not None:
            options["output_config"] = {
                "format": {"type": "json_schema", "schema": anthropic_json_schema(schema)}
            }
        messages: Any = [
            {
                "role": m.role,
                "content": [
                    {
                        "type": "text",
                        "text": m.content,
                        **({"cache_control": _CACHE} if m.cache else {}),
                    }
                ],
            }
            for m in prompt.messages
        ]
        return {"model": self.model, "max_tokens": self.max_tokens, "messages": messages, **options}

    def ready(self) -> None:
        """The SDK imported and its client made, with the resource a request goes through
        (the SDK loads it on first use)."""
        self._client().messages  # noqa: B018 - loaded now, not after the place

    def send(self, prompt: Prompt, schema: OutputSchema | None) -> Reply:
        import anthropic

        client = self._client()
        try:
            response = client.messages.create(**self.request_params(prompt, schema))
        except anthropic.APIError as exc:
            raise self._error(exc) from None
        return self.reply_of(response)

    def reply_of(self, response: Any, tier: str | None = None) -> Reply:
        """A message (the SDK's object) as a :class:`Reply`; ``tier`` overrides the usage's
        service tier (a batch's answers are priced at the batch tier)."""
        used = anthropic_usage(response, self.model, self.name)
        if tier is not None:
            used = replace(used, tier=tier)
        text = "".join(getattr(block, "text", "") for block in response.content) or None
        stop = response.stop_reason
        if stop == "refusal":
            return Reply(text, used, "refusal", text or "refused")
        return Reply(text, used, "length" if stop == "max_tokens" else "stop")

    def _error(self, exc: Exception) -> ProviderError:
        import anthropic

        text = redact_known(str(exc), [self.api_key])[:500]  # a proxy may echo the key
        if isinstance(exc, anthropic.APIConnectionError) and never_sent(exc):  # timeouts too
            return ProviderUnavailableError(
                f"could not connect: {text}", provider=self.name, sent=False
            )
        if isinstance(exc, anthropic.APITimeoutError):
            return ProviderTimeoutError(
                f"no answer within {self.timeout_seconds:g}s", provider=self.name
            )
        if isinstance(exc, anthropic.APIConnectionError):
            return ProviderUnavailableError(f"connection failed: {text}", provider=self.name)
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            if 300 <= status < 400:
                return redirect_error(self.name, status, exc.response.headers.get("location"))
            after = retry_after_seconds(exc.response.headers)
            if status == 429:
                return RateLimitedError(text, provider=self.name, status=status, retry_after=after)
            if status >= 500:  # 529: overloaded
                return ProviderUnavailableError(
                    text, provider=self.name, status=status, retry_after=after
                )
            if "prompt is too long" in text or "context window" in text:
                return ContextTooLongError(text, provider=self.name, status=status)
            return ProviderRequestError(text, provider=self.name, status=status)
        return ProviderRequestError(text, provider=self.name)


def anthropic_usage(response: Any, requested: str, provider: str = "anthropic") -> ModelUsage:
    """A message's usage as the provider reports it. Anthropic counts ``input_tokens`` without
    the cached ones; recorded here as the whole input (``input_tokens`` plus
    ``cache_read_input_tokens`` plus ``cache_creation_input_tokens``), with the parts broken
    out: cache reads, cache writes, and of those the ones written for an hour
    (``cache_creation.ephemeral_1h_input_tokens``). ``service_tier`` other than ``standard``
    (``priority``, ``batch``) is the tier."""
    usage = getattr(response, "usage", None)
    if usage is None:
        return ModelUsage(
            getattr(response, "model", None) or requested,
            requested_model=requested,
            provider_name=provider,
        )
    plain = getattr(usage, "input_tokens", None)
    read = getattr(usage, "cache_read_input_tokens", None)
    written = getattr(usage, "cache_creation_input_tokens", None)
    creation = getattr(usage, "cache_creation", None)
    hour = getattr(creation, "ephemeral_1h_input_tokens", None)
    tier = getattr(usage, "service_tier", None)
    counts = [c for c in (plain, read, written) if isinstance(c, int)]
    return ModelUsage(
        getattr(response, "model", None) or requested,
        sum(counts) if plain is not None else None,
        getattr(usage, "output_tokens", None),
        requested_model=requested,
        cache_read_tokens=read,
        cache_write_tokens=written,
        cache_write_1h_tokens=hour,
        provider_name=provider,
        tier=None if tier in (None, "standard") else str(tier),
    )
