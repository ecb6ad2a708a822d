"""The sample's summary models: a local extractive summarizer (default, offline) and the same
summary from any OpenAI-compatible server. They read ``raw_input["documents"]`` and answer
``{"summary": ...}``; a job with its own prompt and output shape uses
:class:`~idempotent_jobs.dagster.OpenAICompatibleModel` or
:class:`~idempotent_jobs.dagster.AnthropicModel` (``real_models.py``)."""

import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from idempotent_jobs.core.json_values import json_fingerprint
from idempotent_jobs.core.records import ModelUsage
from idempotent_jobs.core.steps import ModelAnswer
from idempotent_jobs.dagster.resources.steps import ModelStep, StepContext
from idempotent_jobs.models.openai_chat import openai_usage
from idempotent_jobs.models.prompts import require

_WORD = re.compile(r"[\w'-]+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was "
    "were will with their they our we you".split()
)


def documents_text(raw_input: dict[str, Any]) -> list[str]:
    """The documents of a collected input, as text (``documents``: list of str or dicts)."""
    documents = raw_input.get("documents", [])
    if not isinstance(documents, list):
        raise ValueError("raw_input.documents must be a list")
    texts = []
    for doc in documents:
        if isinstance(doc, dict):
            doc = ": ".join(str(doc[k]).strip() for k in ("title", "text") if doc.get(k))
        if not isinstance(doc, str):
            raise ValueError(f"raw_input.documents holds a {type(doc).__name__}, not text")
        texts.append(doc.strip())
    return [t for t in texts if t]


class SummaryModel(ModelStep):
    """A model step that turns the job's instructions and the collected documents into
    ``{"summary": ...}`` with its usage."""

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        return self.summarize(context.instructions, raw_input)

    @abstractmethod
    def summarize(self, prompt: str, raw_input: dict[str, Any]) -> ModelAnswer: ...


class LocalExtractiveSummarizer(SummaryModel):
    """Deterministic, offline: keeps the sentences whose words are most frequent in the input."""

    max_sentences: int = Field(default=3, description="Sentences kept in the summary")

    @property
    def model_name(self) -> str:
        return "local-extractive"

    def summarize(self, prompt: str, raw_input: dict[str, Any]) -> ModelAnswer:
        sentences = [s for doc in documents_text(raw_input) for s in _SENTENCE_END.split(doc) if s]
        words = [w.lower() for s in sentences for w in _WORD.findall(s)]
        weights = Counter(w for w in words if w not in _STOPWORDS)

        def score(sentence: str) -> float:
            tokens = [w.lower() for w in _WORD.findall(sentence)]
            return sum(weights[t] for t in tokens) / (len(tokens) or 1)

        ranked = sorted(range(len(sentences)), key=lambda i: (-score(sentences[i]), i))
        kept = [sentences[i] for i in sorted(ranked[: self.max_sentences])]
        summary = " ".join(kept)
        return ModelAnswer(
            {"summary": summary, "sentences": len(kept)},
            ModelUsage(
                self.model_name,
                len(_WORD.findall(prompt)) + len(words),
                len(_WORD.findall(summary)),
            ),
        )


class OpenAICompatibleSummaryModel(SummaryModel):
    """The sample's summary from any server speaking OpenAI's chat completions (OpenAI, Ollama,
    vLLM, llama.cpp): ``raw_input["documents"]`` in, ``{"summary": text}`` out. For your own
    prompt and output schema, use :class:`~idempotent_jobs.dagster.OpenAICompatibleModel`.

    Configure ``api_key=dg.EnvVar("OPENAI_API_KEY")`` (local servers accept any key). The system
    message is ``prompt_template`` with ``{instructions}`` (the job's prompt), ``{subject}`` and
    ``{window_start}`` filled in; the user message holds the documents.
    """

    base_url: str = Field(description="e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1")
    model: str = Field(description="model name as the server knows it")
    api_key: str = Field(default="not-needed", repr=False, description="API key; use an EnvVar")
    temperature: float = 0.2
    max_tokens: int = 400
    timeout_seconds: float = 60.0
    max_retries: int = Field(default=0, description="SDK retries; the op's RetryPolicy retries too")
    prompt_template: str = Field(
        default="{instructions}",
        description="System message; {instructions}, {subject} and {window_start} are filled in",
    )

    @property
    def model_name(self) -> str:
        return self.model

    def settings(self) -> Mapping[str, str]:
        if self.prompt_template == "{instructions}":
            return {}
        return {"prompt_template": json_fingerprint(self.prompt_template)}

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        try:
            system = self.prompt_template.format(
                instructions=context.instructions,
                subject=context.identity.subject_id,
                window_start=context.identity.scheduled_at.isoformat(),
            )
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"prompt_template: {exc!r}; it may use {{instructions}}, {{subject}} and "
                "{window_start} only (write {{ and }} for braces)"
            ) from None
        return self.summarize(system, raw_input)

    def summarize(self, prompt: str, raw_input: dict[str, Any]) -> ModelAnswer:
        from openai import OpenAI

        if "documents" not in raw_input:
            require(raw_input, "documents")  # one line naming the key, before any call

        client = OpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout_seconds,
            max_retries=self.max_retries,
        )
        documents = "\n\n".join(f"- {text}" for text in documents_text(raw_input))
        response = client.chat.completions.create(
            model=self.model,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            messages=[
                {"role": "system", "content": prompt},
                {"role": "user", "content": documents or "(no documents)"},
            ],
        )
        if not response.choices:
            raise ValueError("the model returned no choices")
        content = response.choices[0].message.content
        if not isinstance(content, str) or not content.strip():
            raise ValueError("the model returned an empty answer")
        return ModelAnswer({"summary": content.strip()}, openai_usage(response, self.model))
