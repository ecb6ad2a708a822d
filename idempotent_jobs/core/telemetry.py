"""OpenTelemetry traces and metrics, through the API only (the ``otel`` extra).

Nothing here configures OpenTelemetry: the application does (an SDK, its exporters). Until it
does, or when ``opentelemetry-api`` is not installed, every function here returns at once: each
checks whether a tracer or meter provider has been set, so a process without an SDK pays one
check per step (``make bench`` measures it). ``IDEMPOTENT_JOBS_TELEMETRY=off`` turns it all off
even with an SDK.

Traces: one span per attempt (:func:`run_idempotent`) or per Dagster step, and one per protocol
step inside it: claim, collect, the model call, commit, deliver. Every span carries the ledger
run it works on (``idempotent_jobs.*`` attributes: run id, job, subject, window, version; the
lease epoch and revision once claimed) and its outcome. The model call follows the GenAI
semantic conventions (``chat <model>``, ``gen_ai.*`` attributes). A reused run gives one short
span, marked ``idempotent_jobs.reused``.

Metrics carry low-cardinality attributes only (job, outcome, model, channel; never a run id):
``gen_ai.client.token.usage``, and the ``idempotent_jobs.*`` counters of runs, tokens not
accepted, money, lease waits and notifications (:class:`Instruments`).
"""

import hashlib
import os
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import _internal as otel_metrics_internal
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # the otel extra is not installed: every function is a no-op
    otel_context = None  # type: ignore[assignment]
    otel_metrics = None  # type: ignore[assignment]
    otel_metrics_internal = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]

SCOPE = "idempotent_jobs"
#: ``IDEMPOTENT_JOBS_TELEMETRY=off`` turns every span and measurement off, SDK or not.
TELEMETRY_ENV = "IDEMPOTENT_JOBS_TELEMETRY"
enabled = os.environ.get(TELEMETRY_ENV, "on").strip().lower() not in ("off", "0", "false")
PRICE_CACHE_SECONDS = 300.0
#: The GenAI conventions' advisory buckets for ``gen_ai.client.token.usage``.
TOKEN_BUCKETS = [4.0**n for n in range(14)]
Attributes = Mapping[str, str | int | float | bool]


@dataclass(frozen=True)
class RunScope:
    """The ledger run a process is working on: every span it makes says so, and every metric
    takes its job from it."""

    run_id: str
    job: str
    subject: str
    window_start: str
    version: str

    def attributes(self) -> dict[str, str]:
        return {
            "idempotent_jobs.run_id": self.run_id,
            "idempotent_jobs.job": self.job,
            "idempotent_jobs.subject": self.subject,
            "idempotent_jobs.window_start": self.window_start,
            "idempotent_jobs.version": self.version,
        }


_scope: ContextVar[RunScope | None] = ContextVar("idempotent_jobs_run_scope", default=None)


# The API's own globals, read directly on the hot path: with no SDK, ``get_*_provider()`` looks
# up an environment variable on every call (about 1 µs; a dozen checks per run). A provider named
# by that variable is loaded by the API call, which is made whenever the variable was set at
# start or a provider has been set.
_TRACER_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_METER_ENV = "OTEL_PYTHON_METER_PROVIDER" in os.environ


def tracing() -> bool:
    """Whether an SDK's tracer provider is set (else spans would go nowhere)."""
    if not enabled or otel_trace is None:
        return False
    if getattr(otel_trace, "_TRACER_PROVIDER", True) is None and not _TRACER_ENV:
        return False
    provider = otel_trace.get_tracer_provider()
    return not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


def metering() -> bool:
    """Whether an SDK's meter provider is set (else measurements would go nowhere)."""
    if not enabled or otel_metrics is None:
        return False
    if getattr(otel_metrics_internal, "_METER_PROVIDER", True) is None and not _METER_ENV:
        return False
    provider = otel_metrics.get_meter_provider()
    return not isinstance(provider, _ProxyMeterProvider | otel_metrics.NoOpMeterProvider)


def active() -> bool:
    """Whether spans or measurements go anywhere (an SDK's provider of either is set)."""
    return tracing() or metering()


@contextmanager
def run_scope(
    run_id: str, job: str, subject: str, window_start: str, version: str
) -> Iterator[None]:
    """Work on this ledger run until the block ends (nested scopes restore the outer one)."""
    token = _scope.set(RunScope(run_id, job, subject, window_start, version))
    try:
        yield
    finally:
        _scope.reset(token)


def current_job() -> str:
    scope = _scope.get()
    return scope.job if scope is not None else ""


_NO_SPAN: AbstractContextManager[Any] = nullcontext(None)


def span(
    name: str, attributes: Attributes | None = None, *, client: bool = False
) -> AbstractContextManager[Any]:
    """A span named ``name`` under the current one, carrying the run scope's attributes; the
    span, or ``None`` when no SDK is set (then not even a generator is made). An exception
    ends it with an error status."""
    if not tracing():
        return _NO_SPAN
    scope = _scope.get()
    attrs: dict[str, Any] = scope.attributes() if scope is not None else {}
    attrs.update(attributes or {})
    kind = otel_trace.SpanKind.CLIENT if client else otel_trace.SpanKind.INTERNAL
    tracer = otel_trace.get_tracer(SCOPE)
    started: AbstractContextManager[Any] = tracer.start_as_current_span(
        name, kind=kind, attributes=attrs
    )
    return started


@contextmanager
def joined_trace(run_uuid: str) -> Iterator[None]:
    """Spans made in the block join the trace whose id is ``run_uuid`` (a UUID: a Dagster run
    id), under a remote parent derived from it; unless a span of the caller is current (then
    they nest under that), no SDK is set, or ``run_uuid`` is no UUID."""
    if not tracing() or otel_trace.get_current_span().get_span_context().is_valid:
        yield
        return
    try:
        trace_id = uuid.UUID(run_uuid).int
    except ValueError:
        yield
        return
    span_id = int.from_bytes(hashlib.sha256(run_uuid.encode()).digest()[:8], "big") or 1
    parent = otel_trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED),
    )
    token = otel_context.attach(otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent)))
    try:
        yield
    finally:
        otel_context.detach(token)


def annotate(target: Any, **attributes: str | int | float | bool | None) -> None:
    """Set ``idempotent_jobs.<name>`` attributes on ``target`` (a span, or ``None``)."""
    if target is None:
        return
    for key, value in attributes.items():
        if value is not None:
            target.set_attribute(key if "." in key else f"idempotent_jobs.{key}", value)


def annotate_current(**attributes: str | int | float | bool | None) -> None:
    """:func:`annotate` the current span, if one is recording."""
    if tracing():
        annotate(otel_trace.get_current_span(), **attributes)


def past_span(name: str, start_ns: int, attributes: Attributes) -> None:
    """A span that began at ``start_ns`` (``time.time_ns()``) and ends now: a step recorded once
    its outcome is known (a claim that found the run completed makes none)."""
    if not tracing():
        return
    scope = _scope.get()
    attrs: dict[str, Any] = scope.attributes() if scope is not None else {}
    attrs.update(attributes)
    otel_trace.get_tracer(SCOPE).start_span(name, attributes=attrs, start_time=start_ns).end()


# -- metrics ---------------------------------------------------------------------------------


class Instruments:
    """The metric instruments of one meter provider."""

    def __init__(self, meter: Any) -> None:
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Measures number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.runs = meter.create_counter(
            "idempotent_jobs.runs",
            unit="{run}",
            description="Logical runs by outcome: executed, reused, failed, superseded",
        )
        self.tokens_not_accepted = meter.create_counter(
            "idempotent_jobs.tokens.not_accepted",
            unit="{token}",
            description="Tokens spent on model answers that were not accepted",
        )
        self.cost = meter.create_counter(
            "idempotent_jobs.model.cost",
            description="Money spent on model calls, at the prices set in the ledger",
        )
        self.lease_waits = meter.create_histogram(
            "idempotent_jobs.lease.wait.duration",
            unit="s",
            description="Time spent waiting for another worker's lease",
        )
        self.notifications = meter.create_counter(
            "idempotent_jobs.notifications",
            unit="{notification}",
            description="Notifications delivered and failed",
        )


_instruments: tuple[object, Instruments] | None = None


def instruments() -> Instruments | None:
    """The instruments of the meter provider set now, or ``None`` when none is set."""
    global _instruments
    if not metering():
        return None
    provider = otel_metrics.get_meter_provider()
    if _instruments is None or _instruments[0] is not provider:
        _instruments = (provider, Instruments(provider.get_meter(SCOPE)))
    return _instruments[1]


def count_run(outcome: str) -> None:
    """One logical run ended this way: ``executed``, ``reused``, ``failed``, ``superseded``
    or ``lease_lost``."""
    found = instruments()
    if found is not None:
        found.runs.add(
            1, {"idempotent_jobs.job": current_job(), "idempotent_jobs.outcome": outcome}
        )


def count_tokens_not_accepted(tokens: int, model: str | None, outcome: str) -> None:
    """``tokens`` of a call whose answer was not accepted (``failed``, ``rejected``, ``stale``,
    ``lease_lost``)."""
    found = instruments()
    if found is not None and tokens:
        found.tokens_not_accepted.add(
            tokens,
            {
                "idempotent_jobs.job": current_job(),
                "gen_ai.request.model": model or "",
                "idempotent_jobs.outcome": outcome,
            },
        )


def record_lease_wait(seconds: float, outcome: str) -> None:
    """A wait for another worker's lease, and how it ended (``claimed``, ``reused``, ``busy``)."""
    found = instruments()
    if found is not None:
        found.lease_waits.record(
            seconds, {"idempotent_jobs.job": current_job(), "idempotent_jobs.outcome": outcome}
        )


def count_notification(channel: str, outcome: str) -> None:
    """A notification ``delivered`` or ``failed`` on ``channel``."""
    found = instruments()
    if found is not None:
        found.notifications.add(
            1, {"idempotent_jobs.channel": channel, "idempotent_jobs.outcome": outcome}
        )


class PriceSource(Protocol):
    """What prices are read from: a ledger (:meth:`RunLedger.price_rows`)."""

    def price_rows(self) -> list[dict[str, Any]]: ...


_prices: "weakref.WeakKeyDictionary[PriceSource, tuple[float, dict[str, Any]]]" = (
    weakref.WeakKeyDictionary()
)


def _price_of(model: str, source: PriceSource) -> tuple[Decimal, Decimal, str] | None:
    """``model``'s price per million tokens (input, output, currency), read from the ledger at
    most every :data:`PRICE_CACHE_SECONDS` per ledger."""
    now = time.monotonic()
    cached = _prices.get(source)
    if cached is None or now - cached[0] > PRICE_CACHE_SECONDS:
        table = {
            r["model_name"]: (r["input_per_million"], r["output_per_million"], r["currency"])
            for r in source.price_rows()
        }
        cached = _prices[source] = (now, table)
    found: tuple[Decimal, Decimal, str] | None = cached[1].get(model)
    return found


def record_usage(
    model: str | None, input_tokens: int | None, output_tokens: int | None, prices: PriceSource
) -> None:
    """A model call's tokens (``gen_ai.client.token.usage``) and, when its model has a price
    (read from ``prices``, the ledger), its money (``idempotent_jobs.model.cost``)."""
    found = instruments()
    if found is None:
        return
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model or "",
        "idempotent_jobs.job": current_job(),
    }
    for token_type, tokens in (("input", input_tokens), ("output", output_tokens)):
        if tokens is not None:
            found.token_usage.record(tokens, {**base, "gen_ai.token.type": token_type})
    try:
        price = _price_of(model, prices) if model else None
    except Exception:  # the prices could not be read (an outage): the call is not failed for it
        price = None
    if price is not None:
        money = ((input_tokens or 0) * price[0] + (output_tokens or 0) * price[1]) / 1_000_000
        found.cost.add(
            float(money),
            {
                "gen_ai.request.model": model or "",
                "idempotent_jobs.job": current_job(),
                "idempotent_jobs.currency": price[2],
            },
        )
