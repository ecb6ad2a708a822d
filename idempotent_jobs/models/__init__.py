"""Real models for a job's own prompt and output shape: OpenAI-compatible chat completions and
Anthropic Messages, with structured output checked against the job's schema, bounded repair
turns and retries, and every request accounted for in the ledger. No Dagster here: the Dagster
resources (``idempotent_jobs.dagster.OpenAICompatibleModel``, ``AnthropicModel``) wrap these,
and ``run_idempotent`` users call :func:`answer` in their ``transform``."""

from idempotent_jobs.models.answers import Provider, Reply, RetryPolicy, answer
from idempotent_jobs.models.anthropic_messages import AnthropicMessages
from idempotent_jobs.models.errors import (
    ContentFilteredError,
    ContextTooLongError,
    OutputSchemaError,
    ProviderError,
    ProviderRequestError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RateLimitedError,
    RefusalError,
)
from idempotent_jobs.models.openai_chat import OpenAIChat
from idempotent_jobs.models.prompts import (
    Message,
    Prompt,
    PromptBuilder,
    PromptContext,
    SystemBlock,
    json_prompt,
    require,
)
from idempotent_jobs.models.schema import OutputSchema, SchemaMismatch

__all__ = [
    "AnthropicMessages",
    "ContentFilteredError",
    "ContextTooLongError",
    "Message",
    "OpenAIChat",
    "OutputSchema",
    "OutputSchemaError",
    "Prompt",
    "PromptBuilder",
    "PromptContext",
    "Provider",
    "ProviderError",
    "ProviderRequestError",
    "ProviderTimeoutError",
    "ProviderUnavailableError",
    "RateLimitedError",
    "RefusalError",
    "Reply",
    "RetryPolicy",
    "SchemaMismatch",
    "SystemBlock",
    "answer",
    "json_prompt",
    "require",
]
