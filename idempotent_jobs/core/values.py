"""The two values an error carries (what an answer was computed against, what a call cost):
records of their own, below the errors, so that the core's modules import in one direction
(values < errors < json_values < records).

They are part of :mod:`idempotent_jobs.core.records` (imported from there everywhere) and are
pickled under that name, as every release has pickled them (a Dagster step output holding a
ticket): a worker of another release unpickles what this one stores, and the other way round.
"""

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Basis:
    """What a candidate answer was computed against: the run's revision and the fingerprint of
    the raw-input checkpoint it read (``None`` for a checkpoint stored before fingerprints)."""

    revision: int
    input_fingerprint: str | None

    def holds_for(self, revision: int, input_fingerprint: str | None) -> bool:
        """Whether a run now on ``revision`` and checkpoint ``input_fingerprint`` is still on
        this basis (no fingerprint here: computed before any checkpoint, the revision decides).
        """
        fingerprint_holds = self.input_fingerprint in (None, input_fingerprint)
        return self.revision == revision and fingerprint_holds


@dataclass(frozen=True)
class ModelUsage:
    """What a model call cost, recorded on the attempt that made it, as the provider reported it.

    ``model_name`` is the model the provider says answered (a dated name such as
    ``gpt-4o-2024-08-06``); ``requested_model`` the one the call asked for (``gpt-4o``), which
    prices and metrics key on (``model_name`` when it is not given).

    ``input_tokens`` counts every input token, cached or not, and ``output_tokens`` every output
    token, reasoning included (as OpenTelemetry's GenAI conventions count them). The parts are
    broken out where the provider reports them, each priced at its own price:
    ``cache_read_tokens`` (input read from the provider's prompt cache), ``cache_write_tokens``
    (input written to it), ``cache_write_1h_tokens`` (the part of those written for an hour,
    where the provider has a longer cache at a higher price) and ``reasoning_tokens`` (output
    the model spent thinking). ``provider_name`` is the provider (``openai``, ``anthropic``)
    and ``tier`` its service tier when not the standard one (``batch``, ``flex``).

    A usage pickled by an earlier release, without the later fields, reads them as ``None``
    (the class defaults).
    """

    model_name: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    requested_model: str | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    reasoning_tokens: int | None = None
    provider_name: str | None = None
    tier: str | None = None

    @property
    def priced_model(self) -> str | None:
        """The model prices and metrics key on: the requested one, else the response's."""
        return self.requested_model or self.model_name

    @property
    def tokens(self) -> int:
        """Input and output tokens together (what a token budget counts); 0 when unknown."""
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    @property
    def unknown(self) -> bool:
        """Whether the provider reported no token counts at all."""
        return self.input_tokens is None and self.output_tokens is None


#: The fields of a usage beyond its model and its two counts: what providers break out.
USAGE_PARTS = (
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
    "provider_name",
    "tier",
)


for _value in (Basis, ModelUsage):
    _value.__module__ = "idempotent_jobs.core.records"
