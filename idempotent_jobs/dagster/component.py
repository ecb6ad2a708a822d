"""An idempotent job as a Dagster component: a ``defs.yaml`` that ``dg`` scaffolds, checks and
serves, building what :func:`build_idempotent_job` builds from Python.

``dg scaffold defs idempotent_jobs.dagster.IdempotentJob churn_alerts`` writes
``defs/churn_alerts/defs.yaml`` and ``defs/churn_alerts/steps.py`` (the collector, model step,
validator and payload builder: the code a job needs). The YAML names the job's identity, its
partitions, its steps and channels; ``dg check defs`` refuses a wrong field naming it, and the
component builds the partitioned job, its schedule and its resources.

References to code are import paths (``package.module.Name``); one starting with a dot is
relative to the component's own folder (``.steps.ChurnCollector``). A resource setting written
``{env: NAME}`` is read from the environment when the resource is built (a ``dg.EnvVar``): a
secret is never written into the definitions.
"""

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

import dagster as dg
from dagster._utils.schedules import is_valid_cron_string
from pydantic import Field, field_validator

from idempotent_jobs.core.budgets import Budget, TokenBudget
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.rate_limits import RateLimit
from idempotent_jobs.core.retention import PARTS, RetentionPolicy
from idempotent_jobs.dagster.batch_lane import build_batch_lane
from idempotent_jobs.dagster.component_fields import (
    BudgetDecl,
    BudgetItemDecl,
    RateLimitDecl,
    ResourceDecl,
    RetryDecl,
    WindowDecl,
)
from idempotent_jobs.dagster.component_scaffold import IdempotentJobScaffolder
from idempotent_jobs.dagster.job_factory import build_idempotent_job
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec, default_payload, default_validate
from idempotent_jobs.dagster.ledger_io import ledger_io_manager
from idempotent_jobs.dagster.reconciliation_job import build_reconciliation_job
from idempotent_jobs.dagster.resource import RunLedgerResource
from idempotent_jobs.dagster.resources import (
    Collector,
    ModelStep,
    NotificationChannel,
    StructuredModel,
)
from idempotent_jobs.dagster.resources.real_models import load_object
from idempotent_jobs.dagster.retention_job import build_retention_job
from idempotent_jobs.models.schema import OutputSchema

#: The package's own resources, named without a module in ``type``.
BUILT_IN = "idempotent_jobs.dagster"
_WINDOWS: Mapping[str, Callable[..., dg.TimeWindowPartitionsDefinition]] = {
    "hour": dg.HourlyPartitionsDefinition,
    "day": dg.DailyPartitionsDefinition,
    "week": dg.WeeklyPartitionsDefinition,
    "month": dg.MonthlyPartitionsDefinition,
}


class IdempotentJob(dg.Component, dg.Model, dg.Resolvable):
    """A scheduled AI job run at most once per partition (time window x subject): one run
    record, one accepted answer, each notification sent once. Builds the partitioned job, its
    schedule and its resources (the ledger, the collector, the model step, the channels)."""

    name: str = Field(description="the Dagster job's name")
    identity_job_name: str = Field(description="the ledger's job name, part of every run id")
    version: str = Field(description="part of every run id: change it to recompute on purpose")
    window: WindowDecl
    subjects: list[str] = Field(min_length=1, description="the subject partitions")
    prompt: str = Field(default="", description="the job's instructions to the model step")
    collector: ResourceDecl
    model_step: ResourceDecl
    validator: str | None = Field(
        default=None,
        description="import path of the validator: (output) -> bool; default: a summary",
    )
    payload: str | None = Field(
        default=None, description="import path of (identity, output) -> notification payload"
    )
    channels: dict[str, ResourceDecl] = Field(
        default_factory=dict, description="notification channels by resource key"
    )
    ledger: dict[str, Any] = Field(
        default_factory=lambda: {"database_url": {"env": DATABASE_URL_ENV}},
        description=f"RunLedgerResource settings (default: ${DATABASE_URL_ENV})",
    )
    budget: BudgetDecl | None = None
    budgets: list[BudgetItemDecl] = Field(
        default_factory=list, description="budgets in tokens or money, kept in the ledger"
    )
    follow_ledger_budget: bool = Field(
        default=False, description="enforce the ledger's budgets even where they differ"
    )
    max_tokens_per_call: int | None = Field(
        default=None, description="the most one model call takes (reserved before it runs)"
    )
    rate_limits: list[RateLimitDecl] = Field(
        default_factory=list, description="provider rate limits, kept by every worker"
    )
    retention_days: dict[str, float | None] = Field(
        default_factory=dict, description=f"days kept per part ({', '.join(PARTS)})"
    )
    lease_seconds: float = Field(default=300.0, gt=0, le=86400, allow_inf_nan=False)
    wait_seconds: float | None = Field(default=None, ge=0, le=86400, allow_inf_nan=False)
    retry: RetryDecl = Field(
        default_factory=RetryDecl,
        description="retries of the model step after a failure that may pass (429, 5xx, "
        "timeout); a final one (a 4xx, a redirect, a refusal before any request) is not retried",
    )
    step_storage: Literal["dagster", "ledger"] = Field(
        default="dagster",
        description="where the ops hand each other their tickets: Dagster's IO manager, or the "
        "ledger (steps that share no storage, such as a pod per step)",
    )
    lane: Literal["online", "batch"] = Field(
        default="online",
        description="online: the job and its schedule; batch: also <name>_batch (launched with "
        "a range of windows) and the sensor <name>_batches, for backfills through the "
        "provider's batch API (OpenAICompatibleModel or AnthropicModel)",
    )
    reconciliation_schedule: str | None = Field(
        default=None,
        description="a cron schedule: adds <name>_reconciliation (the ledger checked against "
        "Dagster: stuck runs, undelivered notifications, drift), running on it",
    )
    retention_schedule: str | None = Field(
        default="30 3 * * *",
        description="the cron schedule of <name>_retention, added when retention_days prunes "
        "anything (null: no retention job; prune by hand with `idempotent-jobs prune --apply`)",
    )
    description: str = ""

    @field_validator("reconciliation_schedule", "retention_schedule")
    @classmethod
    def _cron(cls, cron: str | None) -> str | None:
        if cron is not None and not is_valid_cron_string(cron):
            raise ValueError(f"{cron!r} is not a cron schedule (e.g. '*/15 * * * *')")
        return cron

    @field_validator("retention_days")
    @classmethod
    def _known_parts(cls, days: dict[str, float | None]) -> dict[str, float | None]:
        unknown = sorted(set(days) - set(PARTS))
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of {', '.join(PARTS)}")
        return days

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = f"component {self.name!r} ({context.path})"
        refs = _References(context, where)
        collector_key, model_key = f"{self.name}_collector", f"{self.name}_model"
        resources: dict[str, Any] = {
            "ledger": RunLedgerResource(**_settings(self.ledger)),
            collector_key: refs.resource("collector", self.collector, Collector),
            model_key: refs.resource("model_step", self.model_step, ModelStep, MODEL_IMPORTS),
        }
        for key, channel in self.channels.items():
            resources[key] = refs.resource(f"channels.{key}", channel, NotificationChannel)
        io_manager_key = "io_manager"
        if self.step_storage == "ledger":
            io_manager_key = "ledger_io_manager"
            resources[io_manager_key] = ledger_io_manager
        try:
            spec = IdempotentJobSpec(
                name=self.name,
                identity_job_name=self.identity_job_name,
                version=self.version,
                window=_WINDOWS[self.window.every](
                    start_date=self.window.start, timezone=self.window.timezone
                ),
                subjects=self.subjects,
                prompt=self.prompt,
                collector=collector_key,
                model=model_key,
                validate=refs.function("validator", self.validator, default_validate),
                payload=refs.function("payload", self.payload, default_payload),
                channels=tuple(self.channels),
                lease_seconds=self.lease_seconds,
                wait_seconds=self.wait_seconds,
                description=self.description,
                retention=RetentionPolicy.of_days(**self.retention_days),
                budget=[
                    *(TokenBudget(**self.budget.model_dump()).budgets() if self.budget else ()),
                    *(Budget(**item.model_dump()) for item in self.budgets),
                ],
                follow_ledger_budget=self.follow_ledger_budget,
                max_tokens_per_call=self.max_tokens_per_call,
                rate_limits=[RateLimit(**limit.model_dump()) for limit in self.rate_limits],
                model_retry=self.retry.policy(),
            )
        except (InvalidInputError, dg.DagsterInvalidDefinitionError, ValueError) as exc:
            raise InvalidInputError(where, str(exc)) from None
        job, schedule = build_idempotent_job(spec, io_manager_key=io_manager_key)
        upkeep = self._upkeep(spec)
        if self.lane == "online":
            return dg.Definitions.merge(
                dg.Definitions(jobs=[job], schedules=[schedule], resources=resources), upkeep
            )
        if not isinstance(resources[model_key], StructuredModel):
            raise InvalidInputError(
                f"{where}: lane",
                "batch needs a model step with a batch API (OpenAICompatibleModel or "
                f"AnthropicModel), not {type(resources[model_key]).__name__}",
            )
        batch_job, sensor = build_batch_lane(spec)
        return dg.Definitions.merge(
            dg.Definitions(
                jobs=[job, batch_job], schedules=[schedule], sensors=[sensor], resources=resources
            ),
            upkeep,
        )

    def _upkeep(self, spec: IdempotentJobSpec) -> dg.Definitions:
        """The job's reconciliation and retention jobs with their schedules, as asked for
        (running: a schedule written in the YAML is meant to run)."""
        jobs, schedules = [], []
        running = dg.DefaultScheduleStatus.RUNNING
        if self.reconciliation_schedule is not None:
            job, schedule = build_reconciliation_job(
                [spec],
                name=f"{self.name}_reconciliation",
                cron_schedule=self.reconciliation_schedule,
                default_status=running,
            )
            jobs.append(job)
            schedules.append(schedule)
        if self.retention_schedule is not None and spec.retention.prunes_anything:
            job, schedule = build_retention_job(
                [spec],
                name=f"{self.name}_retention",
                cron_schedule=self.retention_schedule,
                default_status=running,
            )
            jobs.append(job)
            schedules.append(schedule)
        return dg.Definitions(jobs=jobs, schedules=schedules)


def _prompt_builder(found: object) -> None:
    if not callable(found):
        raise ValueError("is not callable: a prompt builder is (raw_input, context) -> Prompt")


def _output_schema(found: object) -> None:
    OutputSchema.of(found)  # a pydantic model or a JSON schema dict, or the reason it is not


#: A model step's settings that are import paths, and how each is checked when it is loaded.
MODEL_IMPORTS: Mapping[str, Callable[[Any], object]] = {
    "prompt": _prompt_builder,
    "output_schema": _output_schema,
}


class _References:
    """Import paths of the component's YAML, resolved (a leading dot: its own folder)."""

    def __init__(self, context: dg.ComponentLoadContext, where: str) -> None:
        self.context = context
        self.where = where

    def load(self, field: str, path: str) -> Any:
        if path.startswith("."):
            path = self.absolute(path)
        elif "." not in path:
            path = f"{BUILT_IN}.{path}"
        module_name, _, name = path.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise InvalidInputError(
                f"{self.where}: {field}", f"cannot import {module_name!r}: {exc}"
            ) from None
        found = getattr(module, name, None)
        if found is None:
            raise InvalidInputError(f"{self.where}: {field}", f"{module_name} has no {name!r}")
        return found

    def resource(
        self,
        field: str,
        decl: ResourceDecl,
        kind: type[Any],
        imports: Mapping[str, Callable[[Any], object]] | None = None,
    ) -> Any:
        """The resource ``decl`` declares. ``imports``: settings that are import paths (a
        model step's ``prompt`` and ``output_schema``), resolved against the component's folder
        when they start with a dot and imported now (``dg check defs`` names the one that
        fails), each checked by its function."""
        cls = self.load(f"{field}.type", decl.type)
        if not (isinstance(cls, type) and issubclass(cls, kind)):
            raise InvalidInputError(
                f"{self.where}: {field}.type", f"{decl.type} is not a {kind.__name__} class"
            )
        config = dict(decl.config)
        settings = getattr(cls, "model_fields", None)
        if isinstance(settings, dict):
            unknown = sorted(set(config) - set(settings))
            if unknown:
                raise InvalidInputError(
                    f"{self.where}: {field}.config.{unknown[0]}",
                    f"is not a setting of {cls.__name__} (its settings: {', '.join(settings)})",
                )
        for key, check in (imports or {}).items():
            path = config.get(key)
            if not isinstance(path, str) or not path:
                continue
            where = f"{self.where}: {field}.config.{key}"
            config[key] = path = self.absolute(path)
            try:
                check(load_object(path, where))
            except InvalidInputError:
                raise
            except Exception as exc:  # the user's object: say what is wrong with it
                raise InvalidInputError(where, f"{path}: {exc}") from None
        try:
            return cls(**_settings(config))
        except Exception as exc:  # pydantic names the setting
            raise InvalidInputError(f"{self.where}: {field}.config", str(exc)) from None

    def absolute(self, path: str) -> str:
        """An import path with a leading dot made the component folder's module's."""
        if not path.startswith("."):
            return path
        return self.context.defs_relative_module_name(self.context.path) + path

    def function(
        self, field: str, path: str | None, default: Callable[..., Any]
    ) -> Callable[..., Any]:
        if path is None:
            return default
        found = self.load(field, path)
        if not callable(found):
            raise InvalidInputError(f"{self.where}: {field}", f"{path} is not callable")
        return found  # type: ignore[no-any-return]


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Resource settings, with ``{env: NAME}`` as a ``dg.EnvVar`` (read when the resource is
    built, never stored in the definitions)."""
    return {key: _setting(value) for key, value in config.items()}


def _setting(value: Any) -> Any:
    if isinstance(value, Mapping) and set(value) == {"env"} and isinstance(value["env"], str):
        return dg.EnvVar(value["env"])
    if isinstance(value, Mapping):
        return {k: _setting(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_setting(v) for v in value]
    return value


# -- scaffolding ----------------------------------------------------------------------------


dg.scaffold_with(IdempotentJobScaffolder)(IdempotentJob)

__all__ = ["IdempotentJob", "IdempotentJobScaffolder"]
