"""OpenTelemetry SDK set up for one test: in-memory span exporter and metric reader as the
global providers, reset afterwards (as OpenTelemetry's own test utilities do), so the other
tests run as an application without an SDK does."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_globals() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader | None

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Every data point of metric ``name``: its attributes and the point."""
        assert self.reader is not None
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
        return found


@contextmanager
def installed(reader: MetricReader | None = None) -> Iterator[Telemetry]:
    """An SDK with an in-memory span exporter and ``reader`` (default: in memory)."""
    reset_globals()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = reader or InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    try:
        yield Telemetry(spans, reader if isinstance(reader, InMemoryMetricReader) else None)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
        reset_globals()


def tree(spans: list[ReadableSpan]) -> list[str]:
    """The spans as an indented tree, children in start order: ``name [outcome]``."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(s)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(by_parent.get(parent, []), key=lambda s: s.start_time or 0):
            outcome = (s.attributes or {}).get("idempotent_jobs.outcome")
            lines.append("  " * depth + s.name + (f" [{outcome}]" if outcome else ""))
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return lines
