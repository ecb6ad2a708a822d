"""What a shadow needs of a job's new version (:class:`ShadowSteps`), the rule a shadow must
meet before the version delivers (:class:`ShadowRule`), and where a shadow stands
(:class:`ShadowProgress`)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class ShadowRule:
    """What a shadow of a new version must show before the version may deliver (its gate) or
    be promoted without ``--force``: at least ``min_agreement`` of the answered runs agree with
    their accepted answer, at most ``max_invalid`` answers fail validation, and at least
    ``min_runs`` runs were compared. A scorer's number agrees from ``agree_score`` up."""

    min_agreement: float = 0.95
    max_invalid: int = 0
    min_runs: int = 1
    agree_score: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_agreement <= 1.0:
            raise InvalidInputError("min_agreement", "must be from 0 to 1")
        if self.max_invalid < 0 or self.min_runs < 0:
            raise InvalidInputError("max_invalid", "must not be negative")
        if not 0.0 <= self.agree_score <= 1.0:
            raise InvalidInputError("agree_score", "must be from 0 to 1")

    def unmet(self, summary: Mapping[str, Any] | None) -> str | None:
        """Why a shadow's ``summary`` does not meet the rule; ``None`` when it does."""
        if not summary:
            return "no comparison yet"
        compared = int(summary.get("compared", 0))
        if compared < self.min_runs:
            return f"{compared} run(s) compared, the rule needs {self.min_runs}"
        found = summary.get("agreement")
        agreement = float(found) if found is not None else None  # None: nothing to agree with
        if agreement is not None and agreement < self.min_agreement:
            return f"{agreement:.1%} of the answers agree, the rule needs {self.min_agreement:.0%}"
        invalid = int(summary.get("invalid", 0))
        if invalid > self.max_invalid:
            return f"{invalid} answer(s) failed validation, the rule allows {self.max_invalid}"
        return None

    def describe(self) -> str:
        return (
            f"at least {self.min_agreement:.0%} agreement, at most {self.max_invalid} invalid "
            f"answer(s), at least {self.min_runs} run(s) compared"
        )


@dataclass(frozen=True)
class ShadowSteps:
    """What a shadow needs of the new version: its identity job name and version, the prompt
    builder (raw input and the run's identity -> :class:`Prompt`), the output schema, the
    validator, the scorer (``compare(accepted, new)``: a bool, a score from 0 to 1, a verdict
    ``"agree"``/``"differ"``, or a dict with ``verdict``/``score``; ``None``: the default
    field-by-field comparison), the payload builder (for a promotion's re-delivery), the
    configuration its answers are recorded under, and for the online lane the model step
    (raw input and identity -> a :class:`~idempotent_jobs.core.steps.ModelAnswer`)."""

    job_name: str
    version: str
    prompt: Callable[[JSONDict, RunIdentity], Prompt]
    schema: OutputSchema | None = None
    validate: Callable[[JSONDict], object] | None = None
    compare: Callable[[JSONDict, JSONDict], object] | None = None
    notifications: Callable[[RunIdentity, JSONDict], Mapping[str, JSONDict]] | None = None
    config: JobConfig = field(default_factory=JobConfig)
    online: Callable[[JSONDict, RunIdentity], Any] | None = None
    rule: ShadowRule = field(default_factory=ShadowRule)


@dataclass(frozen=True)
class ShadowProgress:
    """Where a shadow stands after a step."""

    shadow_id: str
    job_name: str
    version: str
    baseline_version: str
    lane: str
    state: str
    items: dict[str, int]
    summary: dict[str, Any] | None
    money: Decimal | None
    currency: str | None
    calls: int
    provider_batch_id: str | None = None
    error: str | None = None

    @property
    def compared(self) -> bool:
        return self.state in ("compared", "promoting", "promoted")
