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
    """What a model call cost, recorded on the attempt that made it.

    ``model_name`` is the model the provider says answered (a dated name such as
    ``gpt-4o-2024-08-06``); ``requested_model`` the one the call asked for (``gpt-4o``), which
    prices and metrics key on (``model_name`` when it is not given). A usage pickled by an
    earlier release, without it, reads it as ``None`` (the class default).
    """

    model_name: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    requested_model: str | None = None

    @property
    def priced_model(self) -> str | None:
        """The model prices and metrics key on: the requested one, else the response's."""
        return self.requested_model or self.model_name


for _value in (Basis, ModelUsage):
    _value.__module__ = "idempotent_jobs.core.records"
