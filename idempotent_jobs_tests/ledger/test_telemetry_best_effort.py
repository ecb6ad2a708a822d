"""Telemetry never changes an outcome, and carries no prompt, input, answer or secret.

Raising SDK parts a user may install (a span processor, a meter whose instruments raise) leave a
run's outcome, its lease and its recorded calls as they are with telemetry off. Every exported
span and metric of a run whose prompt, input, answer and provider error hold sentinel strings is
searched for them.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from idempotent_jobs import (
    JobConfig,
    ModelAnswer,
    ModelUsage,
    RunIdentity,
    run_idempotent,
)
from idempotent_jobs.core import telemetry
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.telemetry import redact_secrets
from idempotent_jobs_tests.helpers import Collector, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.otel import installed, reset_globals

PROMPT = "PROMPT-SENTINEL-7731"
INPUT = "INPUT-SENTINEL-5512"
ANSWER = "ANSWER-SENTINEL-9904"
API_KEY = "sk-proj-SENTINELKEY0123456789abcdef"
CONFIG = JobConfig.of(prompt=PROMPT, model="gpt-test", validator="any")


class Exploding(SpanProcessor):
    """A span processor that raises wherever the SDK calls it."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("on_start exploded")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("on_end exploded")


class RaisingInstrument:
    def add(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("counter exploded")

    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("histogram exploded")


class RaisingMeter:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: RaisingInstrument()


class RaisingMeterProvider(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return RaisingMeter()


@contextmanager
def hostile(kind: str) -> Iterator[None]:
    reset_globals()
    tracer_provider = TracerProvider()
    if kind == "span processor":
        tracer_provider.add_span_processor(Exploding())
        trace.set_tracer_provider(tracer_provider)
    else:
        metrics.set_meter_provider(RaisingMeterProvider())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        reset_globals()


def _answer(raw: dict[str, Any]) -> ModelAnswer:
    return ModelAnswer({"summary": "ok"}, ModelUsage("gpt-test", 120, 30))


def _timeout(raw: dict[str, Any]) -> ModelAnswer:
    raise TimeoutError("the model did not answer in time")


def outcome(ledger: HarnessLedger, operator: LedgerAdmin, run_id: str) -> tuple[Any, ...]:
    record = ledger.get(run_id)
    assert record is not None
    calls = [(c.outcome, c.input_tokens, c.output_tokens) for c in ledger.model_calls(run_id)]
    attempts = [a.outcome for a in operator.attempts(run_id)]
    return record.status, record.lease_owner, record.output, calls, attempts


def scenario(ledger: HarnessLedger, operator: LedgerAdmin, subject: str) -> tuple[Any, ...]:
    """A failed call then an accepted one, then a reuse: the ledger's state after each."""
    ident = identity(subject)
    states = []
    with pytest.raises(TimeoutError):
        run_idempotent(ledger, ident, collect=Collector(), transform=_timeout, config=CONFIG)
    states.append(outcome(ledger, operator, ident.run_id))
    run_idempotent(
        ledger, ident, collect=Collector(), transform=_answer, notifications=email, config=CONFIG
    )
    states.append(outcome(ledger, operator, ident.run_id))
    run_idempotent(ledger, ident, collect=Collector(), transform=_answer, config=CONFIG)
    states.append(outcome(ledger, operator, ident.run_id))
    return tuple(states)


@pytest.mark.parametrize("kind", ["span processor", "meter"])
def test_a_raising_sdk_part_leaves_every_outcome_as_without_telemetry(
    ledger: HarnessLedger, operator: LedgerAdmin, kind: str
) -> None:
    without = scenario(ledger, operator, "plain")
    with hostile(kind):
        hostile_states = scenario(ledger, operator, f"hostile-{kind.replace(' ', '-')}")
    assert hostile_states == without
    assert without[1][0] == "completed" and without[1][1] is None  # the lease was given back
    assert [c[0] for c in without[1][3]] == ["failed", "accepted"]


def test_a_raising_sdk_is_reported_once_as_a_warning(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    reset_globals()
    telemetry._failures_reported.clear()  # as in a fresh process
    metrics.set_meter_provider(RaisingMeterProvider())
    try:
        with pytest.warns(RuntimeWarning, match="telemetry failed") as caught:
            scenario(ledger, operator, "warned")
            scenario(ledger, operator, "warned-again")
    finally:
        reset_globals()
    assert len({str(w.message) for w in caught}) == len(caught)  # once per place and kind


def test_no_prompt_input_answer_or_secret_is_exported(ledger: HarnessLedger) -> None:
    ident = identity("sentinels")

    def collect(ident: RunIdentity) -> dict[str, Any]:
        return {"text": INPUT}

    def leaky_provider(raw: dict[str, Any]) -> ModelAnswer:
        raise ConnectionError(
            f"401 for key {API_KEY} (Authorization: Bearer {API_KEY}) on prompt {PROMPT} "
            f"with {raw['text']}"
        )

    def answer(raw: dict[str, Any]) -> ModelAnswer:
        return ModelAnswer({"summary": ANSWER}, ModelUsage("gpt-test", 10, 5))

    def refuse(output: dict[str, Any]) -> bool:
        raise ValueError(f"refused {output['summary']} for {PROMPT}")

    with installed() as otel:
        with pytest.raises(ConnectionError):
            run_idempotent(ledger, ident, collect=collect, transform=leaky_provider, config=CONFIG)
        with pytest.raises(ValueError):
            run_idempotent(
                ledger, ident, collect=collect, transform=answer, validate=refuse, config=CONFIG
            )
        run_idempotent(ledger, ident, collect=collect, transform=answer, config=CONFIG)
        exported = repr(
            [(s.name, s.attributes, s.events, s.status.description) for s in otel.finished()]
        )
        assert otel.reader is not None
        exported += repr(otel.reader.get_metrics_data())
    for sentinel in (PROMPT, INPUT, ANSWER, API_KEY, "SENTINELKEY"):
        assert sentinel not in exported, sentinel
    assert "ConnectionError" in exported and "ValueError" in exported  # error.type stays
    assert "exception.stacktrace" not in exported


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {API_KEY}",
        f"key={API_KEY}",
        "postgresql://app:S3cret-pw@db:5432/ledger",
        "password=S3cret-pw host=db",
        "api_key: 'S3cret-pw'",
        "token ghp_abcdefghijklmnop1234",
    ],
)
def test_secret_looking_text_is_redacted(text: str) -> None:
    redacted = redact_secrets(text)
    assert "S3cret-pw" not in redacted and "SENTINELKEY" not in redacted
    assert "abcdefghijklmnop1234" not in redacted
    assert "****" in redacted


def test_only_the_public_opentelemetry_api_is_imported() -> None:
    """A release that moves OpenTelemetry's internals must not turn tracing off: the module
    imports no private module or name of it."""
    import ast
    from pathlib import Path

    source = Path(telemetry.__file__).read_text(encoding="utf-8")
    imported = [
        (node.module or "", [a.name for a in node.names])
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry")
    ]
    assert imported, "the module imports the API"
    for module, names in imported:
        assert not any(part.startswith("_") for part in module.split(".")), module
        assert not any(name.startswith("_") for name in names), (module, names)
