"""OpenTelemetry metrics, through the API only (see :mod:`idempotent_jobs.core.telemetry`:
nothing is configured here, and every function returns at once until an SDK sets a meter
provider).

Low-cardinality attributes only (job, outcome, model, channel; never a run id):
``gen_ai.client.token.usage``, and the ``idempotent_jobs.*`` counters of runs, tokens not
accepted, money, calls in doubt, lease waits and notifications (:class:`Instruments`).
"""

from typing import Any

from idempotent_jobs.core.telemetry import SCOPE, best_effort, current_job, metering

try:  # the public API only; without it, metering() is false and nothing below reads it
    from opentelemetry import metrics as otel_metrics
except ImportError:
    otel_metrics = None  # type: ignore[assignment]

#: The GenAI conventions' advisory buckets for ``gen_ai.client.token.usage``.
TOKEN_BUCKETS = [4.0**n for n in range(14)]


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
            description="Money spent on model calls, as the ledger priced each when admitted",
        )
        self.calls_in_doubt = meter.create_counter(
            "idempotent_jobs.model.calls_in_doubt",
            unit="{call}",
            description="Model calls recorded with no usage known: charged in doubt, apart from "
            "the money, until an operator settles them",
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


@best_effort()
def instruments() -> Instruments | None:
    """The instruments of the meter provider set now, or ``None`` when none is set."""
    global _instruments
    if not metering():
        return None
    provider = otel_metrics.get_meter_provider()
    if _instruments is None or _instruments[0] is not provider:
        _instruments = (provider, Instruments(provider.get_meter(SCOPE)))
    return _instruments[1]


@best_effort()
def count_run(outcome: str) -> None:
    """One logical run ended this way: ``executed``, ``reused``, ``failed``, ``superseded``
    or ``lease_lost``."""
    found = instruments()
    if found is not None:
        found.runs.add(
            1, {"idempotent_jobs.job": current_job(), "idempotent_jobs.outcome": outcome}
        )


@best_effort()
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


@best_effort()
def record_lease_wait(seconds: float, outcome: str) -> None:
    """A wait for another worker's lease, and how it ended (``claimed``, ``reused``, ``busy``),
    or for a place under a provider's rate limit (``rate_limited``)."""
    found = instruments()
    if found is not None:
        found.lease_waits.record(
            seconds, {"idempotent_jobs.job": current_job(), "idempotent_jobs.outcome": outcome}
        )


@best_effort()
def count_notification(channel: str, outcome: str) -> None:
    """A notification ``delivered`` or ``failed`` on ``channel``."""
    found = instruments()
    if found is not None:
        found.notifications.add(
            1, {"idempotent_jobs.channel": channel, "idempotent_jobs.outcome": outcome}
        )


def usage_attributes(usage: Any) -> dict[str, Any]:
    """A model call's usage as the GenAI conventions name it (a part the provider did not
    report is left out: ``None`` values are dropped by :func:`annotate`)."""
    return {
        "gen_ai.provider.name": usage.provider_name,
        "gen_ai.response.model": usage.model_name,
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
        "gen_ai.usage.reasoning.output_tokens": usage.reasoning_tokens,
    }


@best_effort()
def record_usage(usage: Any) -> None:
    """A model call newly made: its tokens by type (``gen_ai.client.token.usage``). A reused
    answer or run is never recorded here: the conventions count an effect once, when it is
    executed. Its money is recorded by :func:`record_cost` as the ledger records the call."""
    found = instruments()
    if found is None:
        return
    model = usage.priced_model
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model or "",
        "idempotent_jobs.job": current_job(),
    }
    if usage.provider_name:
        base["gen_ai.provider.name"] = usage.provider_name
    for token_type, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
        if tokens is not None:
            found.token_usage.record(tokens, {**base, "gen_ai.token.type": token_type})


@best_effort()
def count_call_in_doubt(model: str | None) -> None:
    """A paid call recorded with no usage known (a timeout after send, a cut answer): its money
    is in doubt, so it is counted here and never in ``idempotent_jobs.model.cost``."""
    found = instruments()
    if found is not None:
        found.calls_in_doubt.add(
            1, {"gen_ai.request.model": model or "", "idempotent_jobs.job": current_job()}
        )


@best_effort()
def record_cost(money: Any, currency: str | None, model: str | None) -> None:
    """A paid call's money (``idempotent_jobs.model.cost``) as the statement that recorded it
    returned it: priced in the ledger by the row its admission fixed, never here. Unknown
    money (no price, or the call is in doubt) adds nothing."""
    found = instruments()
    if found is None or money is None or not currency:
        return
    found.cost.add(
        float(money),
        {
            "gen_ai.request.model": model or "",
            "idempotent_jobs.job": current_job(),
            "idempotent_jobs.currency": currency,
        },
    )
