"""What a model step sends: the system blocks and messages built from a run's raw input by the
job's own prompt builder, and the repair turn added after an answer outside its schema."""

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import RunIdentity

#: What a message's framing (role, separators) may cost, in tokens, at most.
FRAMING_TOKENS = 16


@dataclass(frozen=True)
class Message:
    """One turn of the conversation. ``cache``: an Anthropic cache breakpoint after it (the
    prompt up to here is cached and read back at the cached-input price)."""

    role: Literal["user", "assistant"]
    content: str
    cache: bool = False


@dataclass(frozen=True)
class SystemBlock:
    """A block of the system prompt; ``cache`` as for :class:`Message`."""

    text: str
    cache: bool = False


@dataclass(frozen=True)
class Prompt:
    """System blocks and messages, in order."""

    messages: tuple[Message, ...]
    system: tuple[SystemBlock, ...] = ()

    @classmethod
    def of(
        cls, *, system: str | Iterable[SystemBlock] = "", user: str, cache_system: bool = False
    ) -> "Prompt":
        """The common shape: one system text (cached when ``cache_system``), one user message."""
        blocks = (SystemBlock(system, cache_system),) if isinstance(system, str) else tuple(system)
        return cls((Message("user", user),), tuple(b for b in blocks if b.text))

    def estimated_tokens(self) -> int:
        """The tokens this prompt may take, generously (a token per 3 characters): what a rate
        limit reserves for it before it is sent."""
        text = sum(len(b.text) for b in self.system) + sum(len(m.content) for m in self.messages)
        return text // 3 + 8 * (len(self.messages) + len(self.system))

    def max_input_tokens(self) -> int:
        """The most tokens this prompt can take: a token is at least one byte of its text (as
        byte-level tokenizers cut it), plus what each message's framing costs. The worst case a
        budget reserves for it (the structured output's schema is added by the request)."""
        text = sum(len(b.text.encode()) for b in self.system)
        text += sum(len(m.content.encode()) for m in self.messages)
        return text + FRAMING_TOKENS * (len(self.messages) + len(self.system) + 1)

    def repaired(self, answer: str | None, problems: list[str]) -> "Prompt":
        """This prompt, the answer that missed the schema, and a request to correct it."""
        listed = "\n".join(f"- {p}" for p in problems[:20])
        return replace(
            self,
            messages=(
                *self.messages,
                Message("assistant", answer or "(empty)"),
                Message(
                    "user",
                    "Your answer does not match the required JSON schema:\n"
                    f"{listed}\nAnswer again with only the corrected JSON object.",
                ),
            ),
        )


class PromptContext(Protocol):
    """What a prompt builder may use besides the raw input: the run and the job's prompt."""

    @property
    def identity(self) -> RunIdentity: ...

    @property
    def instructions(self) -> str: ...


PromptBuilder = Callable[[dict[str, Any], PromptContext], Prompt]


def require(raw_input: dict[str, Any], *keys: str) -> list[Any]:
    """The values of ``keys`` in the raw input; before any call, an :class:`InvalidInputError`
    naming the first key that is missing (and the keys there are)."""
    missing = [key for key in keys if key not in raw_input]
    if missing:
        present = ", ".join(map(repr, sorted(raw_input))) or "none"
        raise InvalidInputError(
            "raw_input",
            f"has no {missing[0]!r}, which the prompt needs (its keys: {present}); "
            "check the collector's output",
        )
    return [raw_input[key] for key in keys]


def json_prompt(raw_input: dict[str, Any], context: PromptContext) -> Prompt:
    """The default prompt: the job's instructions as the system prompt (cached), the whole raw
    input as JSON as the user message."""
    return Prompt.of(
        system=context.instructions,
        user=json.dumps(raw_input, ensure_ascii=False, sort_keys=True),
        cache_system=True,
    )
