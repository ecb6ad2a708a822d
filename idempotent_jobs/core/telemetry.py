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

Metrics (:mod:`idempotent_jobs.core.metrics`) carry low-cardinality attributes only (job,
outcome, model, channel; never a run id).
"""

import hashlib
import importlib.util
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from idempotent_jobs.core.error_text import redact_secrets as redact_secrets


def _installed(module: str) -> bool:
    """Whether ``module`` can be found (a missing parent package means no)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


try:  # the public API only: a release that moves its internals changes nothing here
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as _missing:  # the otel extra is not installed: every function is a no-op
    otel_context = None  # type: ignore[assignment]
    otel_metrics = None  # type: ignore[assignment]
    otel_trace = None  # type: ignore[assignment]
    if _installed("opentelemetry.trace"):  # installed, yet unusable
        warnings.warn(
            f"idempotent_jobs: OpenTelemetry is installed but its API cannot be imported "
            f"({_missing}); traces and metrics are off",
            RuntimeWarning,
            stacklevel=1,
        )

SCOPE = "idempotent_jobs"
#: ``IDEMPOTENT_JOBS_TELEMETRY=off`` turns every span and measurement off, SDK or not.
TELEMETRY_ENV = "IDEMPOTENT_JOBS_TELEMETRY"
enabled = os.environ.get(TELEMETRY_ENV, "on").strip().lower() not in ("off", "0", "false")
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


_failures_reported: set[str] = set()


def _telemetry_failed(where: str, exc: BaseException) -> None:
    """A telemetry call raised (an SDK, a span processor, an exporter, an instrument): the work
    goes on as with telemetry off, and a warning says so once per place and kind of error."""
    key = f"{where}:{type(exc).__name__}"
    if key in _failures_reported:
        return
    _failures_reported.add(key)
    warnings.warn(
        f"idempotent_jobs: telemetry failed in {where} ({type(exc).__name__}); the run goes on "
        "as with telemetry off",
        RuntimeWarning,
        stacklevel=3,
    )


P = ParamSpec("P")
R = TypeVar("R")


def best_effort(default: Any = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a telemetry function: whatever it raises is reported once (a warning) and
    ``default`` returned, so telemetry never changes a run's outcome (the OpenTelemetry
    specification's error-handling rule, applied to the plugins a user installs)."""

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                _telemetry_failed(function.__name__, exc)
                result: R = default
                return result

        guarded.__name__ = function.__name__
        guarded.__doc__ = function.__doc__
        return guarded

    return wrap


def _api_provider(provider: object) -> bool:
    """Whether ``provider`` is the API's own (its proxy or no-op): no SDK has been set."""
    return type(provider).__module__.startswith(("opentelemetry.trace", "opentelemetry.metrics"))


def tracing() -> bool:
    """Whether an SDK's tracer provider is set (else spans would go nowhere). On the hot path:
    no wrapper, one attribute read without an SDK; a provider that raises counts as none."""
    if not enabled or otel_trace is None:
        return False
    # The API's global, read directly when it exists: get_tracer_provider() looks an
    # environment variable up on every call. Without it, the public call decides.
    if getattr(otel_trace, "_TRACER_PROVIDER", True) is None and not _TRACER_ENV:
        return False
    try:
        return not _api_provider(otel_trace.get_tracer_provider())
    except Exception as exc:
        _telemetry_failed("tracing", exc)
        return False


def metering() -> bool:
    """Whether an SDK's meter provider is set (else measurements would go nowhere)."""
    if not enabled or otel_metrics is None:
        return False
    # As for tracing: the API's global, read (never imported) where this release keeps it; a
    # release that moves it makes the public call below decide, nothing is turned off.
    internal = sys.modules.get("opentelemetry.metrics._internal")
    if getattr(internal, "_METER_PROVIDER", True) is None and not _METER_ENV:
        return False
    try:
        return not _api_provider(otel_metrics.get_meter_provider())
    except Exception as exc:
        _telemetry_failed("metering", exc)
        return False


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
    ends it with an error status and ``error.type`` (see :func:`error_status`), never an
    exception event: its text and stack may hold a prompt, an answer or a key."""
    if not tracing():
        return _NO_SPAN
    return _guarded_span(name, attributes, client)


@contextmanager
def _guarded_span(name: str, attributes: Attributes | None, client: bool) -> Iterator[Any]:
    """The span of :func:`span`, started and ended so that nothing the SDK raises (a span
    processor's ``on_start``/``on_end``, an exporter) reaches the work inside it."""
    try:
        scope = _scope.get()
        attrs: dict[str, Any] = scope.attributes() if scope is not None else {}
        attrs.update(attributes or {})
        kind = otel_trace.SpanKind.CLIENT if client else otel_trace.SpanKind.INTERNAL
        started = otel_trace.get_tracer(SCOPE).start_as_current_span(
            name,
            kind=kind,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        )
        current = started.__enter__()
    except Exception as exc:
        _telemetry_failed("span", exc)
        yield None
        return
    try:
        yield current
    except BaseException as exc:
        error_status(current, exc)
        _exit_span(started, exc)
        raise
    _exit_span(started, None)


def _exit_span(started: AbstractContextManager[Any], exc: BaseException | None) -> None:
    try:
        if exc is None:
            started.__exit__(None, None, None)
        else:
            started.__exit__(type(exc), exc, exc.__traceback__)
    except Exception as failure:
        _telemetry_failed("span end", failure)


#: What a span's error message may hold at most (characters, after escaping).
MAX_SPAN_MESSAGE_CHARS = 200


def span_message(exc: BaseException) -> str:
    """What a span says of ``exc``: the library's own errors (whose text names runs, leases
    and limits, never payloads) with their message, escaped, capped and with anything that
    looks like a secret redacted; any other exception (a provider's, a user's step, whose text
    may echo the prompt, the input or a key) by its type alone."""
    from idempotent_jobs.core.error_text import describe_error, safe_text
    from idempotent_jobs.core.errors import LedgerError

    if not isinstance(exc, LedgerError):
        return type(exc).__name__
    return safe_text(redact_secrets(describe_error(exc)), MAX_SPAN_MESSAGE_CHARS)


@best_effort()
def error_status(target: Any, exc: BaseException) -> None:
    """End-of-span error marks on ``target`` (a span, or ``None``): status ERROR with
    :func:`span_message`, and ``error.type``."""
    if target is None:
        return
    target.set_attribute("error.type", type(exc).__name__)
    target.set_status(Status(StatusCode.ERROR, span_message(exc)))


@contextmanager
def joined_trace(run_uuid: str) -> Iterator[None]:
    """Spans made in the block join the trace whose id is ``run_uuid`` (a UUID: a Dagster run
    id), under a remote parent derived from it; unless a span of the caller is current (then
    they nest under that), no SDK is set, or ``run_uuid`` is no UUID."""
    token = _attach_run_trace(run_uuid) if tracing() else None
    try:
        yield
    finally:
        if token is not None:
            _detach(token)


@best_effort()
def _attach_run_trace(run_uuid: str) -> object | None:
    if otel_trace.get_current_span().get_span_context().is_valid:
        return None
    try:
        trace_id = uuid.UUID(run_uuid).int
    except ValueError:
        return None
    span_id = int.from_bytes(hashlib.sha256(run_uuid.encode()).digest()[:8], "big") or 1
    parent = otel_trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED),
    )
    return otel_context.attach(otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent)))


@best_effort()
def _detach(token: Any) -> None:
    otel_context.detach(token)


@best_effort()
def annotate(target: Any, **attributes: str | int | float | bool | None) -> None:
    """Set ``idempotent_jobs.<name>`` attributes on ``target`` (a span, or ``None``)."""
    if target is None:
        return
    for key, value in attributes.items():
        if value is not None:
            target.set_attribute(key if "." in key else f"idempotent_jobs.{key}", value)


@best_effort()
def annotate_current(**attributes: str | int | float | bool | None) -> None:
    """:func:`annotate` the current span, if one is recording."""
    if tracing():
        annotate(otel_trace.get_current_span(), **attributes)


@best_effort()
def past_span(name: str, start_ns: int, attributes: Attributes) -> None:
    """A span that began at ``start_ns`` (``time.time_ns()``) and ends now: a step recorded once
    its outcome is known (a claim that found the run completed makes none)."""
    if not tracing():
        return
    scope = _scope.get()
    attrs: dict[str, Any] = scope.attributes() if scope is not None else {}
    attrs.update(attributes)
    otel_trace.get_tracer(SCOPE).start_span(name, attributes=attrs, start_time=start_ns).end()
