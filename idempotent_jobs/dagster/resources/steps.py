"""The generic steps of an idempotent AI job, as Dagster resources any job can implement.

A job is: a :class:`Collector` (the source data of one logical run), a :class:`ModelStep` (the
model call on that data), a validator and a payload builder (plain functions in the job spec),
and notification channels. The ledger around them is the same for every job.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.steps import ModelAnswer


@dataclass(frozen=True)
class StepContext:
    """What a model step may know about the call besides its input: the logical run (job,
    subject, window), the job's instructions, and the caller run and step making it."""

    identity: RunIdentity
    instructions: str
    run_id: str
    caller_run_id: str | None = None
    caller_step: str | None = None


class Collector(dg.ConfigurableResource, ABC):  # type: ignore[type-arg]
    """Gathers the source data of one logical run; called once per run (it is checkpointed)."""

    @abstractmethod
    def collect(self, identity: RunIdentity) -> dict[str, Any]: ...


class ModelStep(dg.ConfigurableResource, ABC):  # type: ignore[type-arg]
    """The model call: the checkpointed input in, an answer (output and usage) out.

    The prompt and the model are this resource's business. ``model_name`` and ``settings`` are
    recorded with every accepted result, so a result reused under another configuration is
    reported, never silently treated as current.
    """

    @property
    @abstractmethod
    def model_name(self) -> str: ...

    def settings(self) -> Mapping[str, str]:
        """What else shapes the answers (a prompt template, say), as short texts."""
        return {}

    @abstractmethod
    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer: ...
