"""What the batch lane needs of a job (:class:`BatchSteps`), and where a batch stands after a
step (:class:`BatchProgress`)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.records import JobConfig
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.models.schema import OutputSchema


@dataclass(frozen=True)
class BatchSteps:
    """What the lane needs of a job: its identity job name, the collector, the prompt builder
    (raw input and the run's identity -> :class:`Prompt`), the output schema, the validator and
    the payload builder (output and identity -> notifications by channel), as the online job
    has them."""

    job_name: str
    collect: Callable[[RunIdentity], dict[str, Any]]
    prompt: Callable[[dict[str, Any], RunIdentity], Prompt]
    schema: OutputSchema | None = None
    validate: Callable[[dict[str, Any]], object] | None = None
    notifications: Callable[[RunIdentity, dict[str, Any]], Mapping[str, dict[str, Any]]] | None = (
        None
    )
    config: JobConfig = field(default_factory=JobConfig)


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch stands after a step of :func:`advance`."""

    batch_id: str
    state: str
    provider_batch_id: str | None
    items: dict[str, int]
    duplicates: int = 0
    #: The money of the calls recorded so far (``None``: none, or none priced), its currency,
    #: and how many calls no price covers.
    money: Decimal | None = None
    currency: str | None = None
    unpriced: int = 0
    #: How many of its steps failed in a row, and the last one's error.
    failed_steps: int = 0
    last_step_error: str | None = None

    @property
    def collected(self) -> bool:
        return self.state == "collected"
