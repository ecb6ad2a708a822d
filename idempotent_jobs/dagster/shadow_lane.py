"""Shadow runs in Dagster: a spec's new version seen as a shadow needs it
(:func:`shadow_steps`), the gated schedule of a version that must prove itself in a shadow
before it delivers (:func:`gated_schedule`), and the sensor that carries the version's shadows
to their comparison and says where each stands in its tick (:func:`build_shadow_sensor`)."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import LeaseLostError, LedgerConnectionError
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import partition_key
from idempotent_jobs.dagster.resources.real_models import StructuredModel
from idempotent_jobs.dagster.resources.steps import ModelStep, StepContext
from idempotent_jobs.models.prompts import Prompt
from idempotent_jobs.shadows import ShadowRule, ShadowSteps, advance, gate_reason
from idempotent_jobs.shadows.report import summary_text

__all__ = ["ShadowRule", "build_shadow_sensor", "gated_schedule", "shadow_steps"]


def shadow_steps(spec: IdempotentJobSpec, model: ModelStep) -> ShadowSteps:
    """What a shadow of ``spec``'s version needs: the model step's prompt builder and schema
    (a :class:`StructuredModel`; another model step has the online lane only), the spec's
    validator, scorer, rule and payload, and the configuration answers are recorded under."""
    structured = model if isinstance(model, StructuredModel) else None

    def context(identity: RunIdentity) -> StepContext:
        return StepContext(identity, spec.prompt, identity.run_id, None, "shadow")

    def prompt(raw_input: dict[str, Any], identity: RunIdentity) -> Prompt:
        if structured is None:
            raise TypeError(f"{type(model).__name__} builds no prompt: use --lane online")
        return structured.build_prompt(raw_input, context(identity))

    def online(raw_input: dict[str, Any], identity: RunIdentity) -> Any:
        return model.generate(raw_input, context(identity))

    return ShadowSteps(
        job_name=spec.identity_job_name,
        version=spec.version,
        prompt=prompt,
        schema=structured.output_schema_of() if structured is not None else None,
        validate=spec.validate,
        compare=spec.compare,
        notifications=spec.notifications,
        config=spec.config_of(model),
        online=online,
        rule=spec.shadow_rule,
    )


def gated_schedule(spec: IdempotentJobSpec, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    """The schedule of a gated version: at each tick of the job's windows, a run of the window
    that just ended for each subject (as Dagster's partitioned schedule makes), once a shadow
    of this version met the job's rule or was promoted; until then the tick is skipped with
    the reason, which the UI shows."""
    window = spec.window

    @dg.schedule(
        name=f"{spec.name}_schedule",
        cron_schedule=window.get_cron_schedule(),
        execution_timezone=window.timezone,
        job=job,
        required_resource_keys={"ledger"},
    )
    def gated(context: dg.ScheduleEvaluationContext) -> Any:
        ledger = context.resources.ledger
        shadows = ledger.shadow_gate(spec.identity_job_name, spec.version)
        why = gate_reason(shadows, spec.shadow_rule, spec.version)
        if why is not None:
            return dg.SkipReason(why)
        now: datetime = context.scheduled_execution_time or datetime.now(UTC)
        keys = window.get_partition_keys(current_time=now)
        if not keys:
            return dg.SkipReason("no window has ended yet")
        last = keys[-1]
        return [
            dg.RunRequest(run_key=key, partition_key=key)
            for key in (partition_key(subject, last) for subject in spec.subjects)
        ]

    return gated


def build_shadow_sensor(
    spec: IdempotentJobSpec,
    *,
    minimum_interval_seconds: int = 30,
    sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """``<name>_shadows``: at each tick, one step of every open shadow of ``spec``'s version
    (started from the command line: ``idempotent-jobs shadow start``), then each shadow's
    summary in the tick (agreement, verdicts, cost per run old and new) and whether the
    version's gate is open. It requests no run: a promotion is an operator's decision."""

    @dg.sensor(
        name=f"{spec.name}_shadows",
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={"ledger", spec.model},
        description=f"advances the shadows of {spec.identity_job_name} {spec.version} and "
        "shows their comparison",
        default_status=sensor_status,
    )
    def shadows_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        ledger = context.resources.ledger
        model = getattr(context.resources, spec.model)
        steps = shadow_steps(spec, model)
        provider = model.batch_provider() if isinstance(model, StructuredModel) else None
        lines = []
        for found in ledger.shadow_gate(spec.identity_job_name, spec.version):
            shadow_id = str(found["shadow_id"])
            if found["state"] in ("started", "submitted", "collected"):
                try:
                    advance(ledger, steps, provider, shadow_id, worker_id=context.sensor_name)
                except LeaseLostError:
                    lines.append(f"shadow {shadow_id}: advanced by another process now")
                except LedgerConnectionError:
                    raise
                except Exception as exc:  # noqa: BLE001 - this shadow's step; the tick goes on
                    lines.append(f"shadow {shadow_id}: its step failed: {describe_error(exc)}")
            row = ledger.shadow(shadow_id)
            if row is not None:
                lines.append(" | ".join(summary_text(row)))
        why = gate_reason(
            ledger.shadow_gate(spec.identity_job_name, spec.version),
            spec.shadow_rule,
            spec.version,
        )
        if spec.gated:
            lines.append(why or f"version {spec.version} may deliver: its gate is open")
        text = "\n".join(lines) or f"no shadow of {spec.identity_job_name} {spec.version}"
        context.log.info(text)
        return dg.SkipReason(text)

    return shadows_sensor
