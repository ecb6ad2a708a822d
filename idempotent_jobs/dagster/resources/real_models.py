"""Model steps for a job's own prompt and output shape, on a real provider: OpenAI's chat
completions (and the servers that speak them) and Anthropic's Messages.

Configure them as any resource. The prompt and the output schema are the job's, named by import
path (``"churn.prompts:churn_prompt"``, ``"churn.schemas:ChurnAlerts"``) so they fit a
``defs.yaml`` too; or subclass and override :meth:`StructuredModel.build_prompt` and
:meth:`StructuredModel.output_schema_of`::

    "model": OpenAICompatibleModel(
        model="gpt-4o",
        api_key=dg.EnvVar("OPENAI_API_KEY"),
        prompt="contracts.prompts:clause_prompt",    # (raw_input, context) -> Prompt
        output_schema="contracts.schemas:Clauses",   # a pydantic model or a JSON schema dict
    )

Each answer is checked against the schema; one outside it gets up to ``max_repair_turns``
repair turns, and a transient provider error up to ``max_retries`` retries (a ``Retry-After``
is honoured up to ``max_retry_wait_seconds``). Every request is recorded in the ledger as it
ends, counted by budgets (see :mod:`idempotent_jobs.models`).
"""

import hashlib
import inspect
from abc import abstractmethod
from collections.abc import Mapping
from importlib import import_module
from typing import Any, ClassVar

from pydantic import Field

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.dagster.resources.steps import ModelStep, StepContext
from idempotent_jobs.models.answers import Provider, RetryPolicy, answer
from idempotent_jobs.models.anthropic_messages import AnthropicMessages
from idempotent_jobs.models.batches import AnthropicBatches, BatchProvider, OpenAIBatches
from idempotent_jobs.models.openai_chat import OpenAIChat
from idempotent_jobs.models.prompts import Prompt, json_prompt
from idempotent_jobs.models.schema import OutputSchema


def load_object(path: str, field: str) -> Any:
    """The object ``path`` names (``package.module:attribute``, or ``package.module.attribute``);
    an :class:`InvalidInputError` naming ``field`` when it cannot be imported."""
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise InvalidInputError(field, f"{path!r} is not 'package.module:attribute'")
    try:
        module = import_module(module_name)
    except Exception as exc:  # the user's module: any error there is theirs to see
        raise InvalidInputError(
            field, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise InvalidInputError(field, f"module {module_name!r} has no {attribute!r}") from None


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StructuredModel(ModelStep):
    """What both providers' model steps share: the model, the prompt builder, the output schema,
    the repair turns and the retries."""

    #: Each request's worst case is reserved under the ledger's budgets as it is sent.
    announces_requests: ClassVar[bool] = True

    model: str = Field(description="The model to ask for (recorded and priced as asked)")
    api_key: str = Field(default="", repr=False, description="API key; use a dg.EnvVar")
    api_key_name: str = Field(
        default="",
        description="The key's name under the ledger's rate limits (a label, never the key)",
    )
    prompt: str = Field(
        default="",
        description=(
            "Import path of the prompt builder, (raw_input, context) -> Prompt; empty: the "
            "job's prompt as the system prompt and the raw input as JSON"
        ),
    )
    output_schema: str = Field(
        default="",
        description=(
            "Import path of the answer's schema: a pydantic model or a JSON schema dict; "
            'empty: the answer is {"text": ...}'
        ),
    )
    max_repair_turns: int = Field(
        default=1, ge=0, le=5, description="Repair turns for an answer outside the schema"
    )
    max_retries: int = Field(
        default=3, ge=0, le=20, description="Retries of a 429, 5xx or timeout, in the attempt"
    )
    max_retry_wait_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Longest Retry-After waited for; a longer one ends the attempt",
    )
    timeout_seconds: float = Field(default=60.0, gt=0, description="Per request")
    temperature: float | None = None
    max_tokens: int = Field(default=1024, ge=1, description="Most tokens an answer may have")
    batch_max_requests: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The batch lane: the most runs one provider batch holds (unset: the provider's "
            "limit, 50,000 for OpenAI, 100,000 for Anthropic); a larger range is split"
        ),
    )

    @property
    def model_name(self) -> str:
        return self.model

    def settings(self) -> Mapping[str, str]:
        """The prompt builder and the schema (by fingerprint): a result computed under others
        is reported as such when it is reused."""
        found: dict[str, str] = {}
        if self.prompt:
            builder = load_object(self.prompt, "prompt")
            try:
                source = inspect.getsource(builder)
            except (OSError, TypeError):
                source = self.prompt
            found["prompt_builder"] = _fingerprint(source)
        schema = self.output_schema_of()
        if schema is not None:
            found["output_schema"] = _fingerprint(schema.fingerprint_text())
        return found

    def build_prompt(self, raw_input: dict[str, Any], context: StepContext) -> Prompt:
        """The prompt for one run: the configured builder's, else :func:`json_prompt`."""
        builder = load_object(self.prompt, "prompt") if self.prompt else json_prompt
        built = builder(raw_input, context)
        if not isinstance(built, Prompt):
            raise InvalidInputError(
                "prompt", f"{self.prompt} returned a {type(built).__name__}, not a Prompt"
            )
        return built

    def output_schema_of(self) -> OutputSchema | None:
        """The answer's schema, or ``None`` (the answer is then ``{"text": ...}``)."""
        if not self.output_schema:
            return None
        return OutputSchema.of(load_object(self.output_schema, "output_schema"))

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_retries, max_wait_seconds=self.max_retry_wait_seconds
        )

    def _batch_settings(self) -> dict[str, Any]:
        """What only the batch API takes: the most requests per batch, when set."""
        if self.batch_max_requests is None:
            return {}
        return {"max_batch_requests": self.batch_max_requests}

    @abstractmethod
    def provider(self) -> Provider: ...

    @abstractmethod
    def batch_provider(self) -> BatchProvider:
        """The provider's batch API with this step's settings (the batch lane's)."""

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        return answer(
            self.provider(),
            self.build_prompt(raw_input, context),
            self.output_schema_of(),
            repair_turns=self.max_repair_turns,
            retry=self.retry_policy(),
        )


class OpenAICompatibleModel(StructuredModel):
    """OpenAI's chat completions, or any server that speaks them (Azure OpenAI, vLLM, Ollama,
    llama.cpp): structured output by ``response_format`` with the job's JSON schema."""

    base_url: str | None = Field(
        default=None,
        description=(
            "e.g. http://127.0.0.1:11434/v1 (Ollama); unset: $OPENAI_BASE_URL, else OpenAI's API"
        ),
    )
    strict_schema: bool = Field(
        default=True,
        description="OpenAI's strict structured output (the schema must allow it)",
    )

    def _client_settings(self) -> dict[str, Any]:
        """What the online and the batch API are made with: the same model and settings."""
        return {
            "model": self.model,
            "api_key": self.api_key or "not-needed",
            "base_url": self.base_url,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "timeout_seconds": self.timeout_seconds,
            "strict_schema": self.strict_schema,
            "key_name": self.api_key_name,
        }

    def provider(self) -> Provider:
        return OpenAIChat(**self._client_settings())

    def batch_provider(self) -> BatchProvider:
        return OpenAIBatches(**self._client_settings(), **self._batch_settings())


class AnthropicModel(StructuredModel):
    """Anthropic's Messages: structured output by ``output_config`` with the job's JSON
    schema; system blocks and messages the prompt marks ``cache`` get a cache breakpoint."""

    base_url: str | None = Field(
        default=None, description="Unset: $ANTHROPIC_BASE_URL, else Anthropic's API"
    )

    def _client_settings(self) -> dict[str, Any]:
        """What the online and the batch API are made with: the same model and settings."""
        return {
            "model": self.model,
            "api_key": self.api_key,
            "max_tokens": self.max_tokens,
            "base_url": self.base_url,
            "temperature": self.temperature,
            "timeout_seconds": self.timeout_seconds,
            "key_name": self.api_key_name,
        }

    def provider(self) -> Provider:
        return AnthropicMessages(**self._client_settings())

    def batch_provider(self) -> BatchProvider:
        return AnthropicBatches(**self._client_settings(), **self._batch_settings())
