"""The schema a job's structured output is sent with is what each provider's own SDK makes of
it (the transform its ``parse`` helper applies), online and in batches: Anthropic's
``transform_schema`` (objects closed, ``minItems``/``maxLength``/``maxItems`` moved into the
description), OpenAI's strict schema (objects closed, every property required)."""

import json
from typing import Literal

import anthropic
import pydantic
import pytest
from openai.lib._pydantic import to_strict_json_schema

from idempotent_jobs.models import OutputSchema, Prompt
from idempotent_jobs.models.anthropic_messages import AnthropicMessages
from idempotent_jobs.models.batches import AnthropicBatches, OpenAIBatches
from idempotent_jobs.models.openai_chat import OpenAIChat
from idempotent_jobs.models.schema import SchemaMismatch


class Finding(pydantic.BaseModel):
    code: str = pydantic.Field(min_length=2, max_length=12)
    severity: Literal["low", "high"]
    score: float = pydantic.Field(ge=0, le=1)


class Review(pydantic.BaseModel):
    summary: str
    findings: list[Finding] = pydantic.Field(min_length=1, max_length=5)
    owner: str | None = None


PROMPT = Prompt.of(system="Review it.", user="the contract")


def test_anthropic_requests_carry_the_sdks_own_schema_online_and_in_batches() -> None:
    schema = OutputSchema.of(Review)
    expected = anthropic.transform_schema(Review)
    assert "'maxItems'" not in str(expected) and "additionalProperties" in str(expected)
    online = AnthropicMessages(model="claude-x", api_key="k").request_params(PROMPT, schema)
    assert online["output_config"]["format"]["schema"] == expected
    line = AnthropicBatches(model="claude-x", api_key="k").batch_line("ij-1", PROMPT, schema)
    assert line["params"]["output_config"]["format"]["schema"] == expected


def test_openai_requests_carry_the_sdks_own_strict_schema_online_and_in_batches() -> None:
    schema = OutputSchema.of(Review)
    expected = to_strict_json_schema(Review)
    online = OpenAIChat(model="gpt-4o-mini", api_key="k").request_body(PROMPT, schema)
    assert online["response_format"]["json_schema"]["schema"] == expected
    line = OpenAIBatches(model="gpt-4o-mini", api_key="k").batch_line("ij-1", PROMPT, schema)
    assert line["body"]["response_format"]["json_schema"]["schema"] == expected


def test_the_answer_is_still_checked_against_the_schema_as_given() -> None:
    schema = OutputSchema.of(Review)
    sent = anthropic.transform_schema(Review)
    assert sent != schema.json_schema  # what is sent is the provider's form...
    too_many = {
        "summary": "s",
        "findings": [{"code": "ab", "severity": "low", "score": 0.5}] * 6,
    }
    with pytest.raises(SchemaMismatch):  # ...the answer is held to the job's own
        schema.check(json.dumps(too_many))
