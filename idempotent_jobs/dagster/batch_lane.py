"""The batch lane in Dagster: a job that opens a batch for a range of a spec's partitions, and a
sensor that advances every open batch of the spec until it is collected.

Launch ``<name>_batch`` from the UI's launchpad with a range (``start`` and ``end``, window
partition keys, both included, and optionally ``subjects``): its one op claims the range's runs
for a new batch (several, when the range holds more runs than one provider batch takes: its
``max_batch_requests``), checkpoints their inputs with the job's collector, holds the batch's worst
case under the job's budgets, submits it, and ends. Nothing waits in an op: the sensor
``<name>_batches`` polls each open batch (one step per tick, as :func:`advance` does) and
collects it item by item when the provider ends it. Each tick says in the UI where every batch
stands (state, items accepted, failed and pending). The partitions' ordinary runs then reuse
the accepted results: a schedule tick or a re-execution makes no model call. While a batch
holds a partition, an online run of it steps aside at once (its step fails, naming the batch,
without retry and without paying).

The model step must have a batch API: :class:`OpenAICompatibleModel` or
:class:`AnthropicModel`.
"""

from collections import deque
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from idempotent_jobs.batches import BatchProgress, BatchSteps, advance, open_intent
from idempotent_jobs.batches import progress as batch_progress
from idempotent_jobs.core.error_text import describe_error
from idempotent_jobs.core.errors import (
    BudgetExceededError,
    InvalidInputError,
    LeaseLostError,
    LedgerConnectionError,
)
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import partition_key, partition_key_of
from idempotent_jobs.dagster.resources.real_models import StructuredModel
from idempotent_jobs.dagster.resources.steps import Collector, StepContext
from idempotent_jobs.models.batches import BatchProvider
from idempotent_jobs.models.prompts import Prompt

#: How long a batch holds its runs without a renewal (the sensor renews at every tick).
DEFAULT_BATCH_LEASE_SECONDS = 1800.0


class BatchRange(dg.Config):
    """The partitions a batch computes: windows ``start`` to ``end`` (partition keys of the
    window, both included), for ``subjects`` (empty: every subject of the spec)."""

    start: str
    end: str
    subjects: list[str] = []


def batch_model(spec: IdempotentJobSpec, resources: Any) -> StructuredModel:
    """The spec's model step, which must have a batch API."""
    model = getattr(resources, spec.model)
    if not isinstance(model, StructuredModel):
        raise InvalidInputError(
            f"{spec.name}: model",
            f"the batch lane needs a model step with a batch API (OpenAICompatibleModel or "
            f"AnthropicModel); {type(model).__name__} has none",
        )
    return model


def batch_steps(
    spec: IdempotentJobSpec, model: StructuredModel, collector: Collector | None = None
) -> BatchSteps:
    """The lane's view of the spec: its collector, the model step's prompt builder and schema,
    the spec's validator and payload, and the configuration results are recorded under."""

    def prompt(raw_input: dict[str, Any], identity: RunIdentity) -> Prompt:
        context = StepContext(identity, spec.prompt, identity.run_id, None, "batch")
        return model.build_prompt(raw_input, context)

    def collect(identity: RunIdentity) -> dict[str, Any]:
        if collector is None:
            raise InvalidInputError("collector", "the batch's sensor collects no input")
        return collector.collect(identity)

    return BatchSteps(
        job_name=spec.identity_job_name,
        collect=collect,
        prompt=prompt,
        schema=model.output_schema_of(),
        validate=spec.validate,
        notifications=spec.notifications,
        config=spec.config_of(model),
    )


def range_identities(spec: IdempotentJobSpec, chosen: BatchRange) -> list[RunIdentity]:
    """The runs of the range, refused in one line naming the field when it is not the spec's."""
    keys = spec.window.get_partition_keys()
    for field_name, key in (("start", chosen.start), ("end", chosen.end)):
        if key not in keys:
            raise InvalidInputError(
                f"{spec.name}_batch: {field_name}",
                f"{key!r} is not a window of the job (e.g. {keys[0]!r})",
            )
    windows = keys[keys.index(chosen.start) : keys.index(chosen.end) + 1]
    if not windows:
        raise InvalidInputError(f"{spec.name}_batch: end", "comes before start")
    unknown = sorted(set(chosen.subjects) - set(spec.subjects))
    if unknown:
        raise InvalidInputError(f"{spec.name}_batch: subjects", f"not the job's: {unknown}")
    subjects: Sequence[str] = chosen.subjects or spec.subjects
    return [
        spec.identity_for(partition_key(subject, window))
        for window in windows
        for subject in subjects
    ]


def describe(progress: BatchProgress) -> str:
    items = ", ".join(
        f"{n} {state.replace('_', ' ')}" for state, n in sorted(progress.items.items())
    )
    money = ""
    if progress.money is not None:
        unpriced = f" + {progress.unpriced} unpriced call(s)" if progress.unpriced else ""
        money = f"; {progress.money:.6f} {progress.currency or ''}".rstrip() + unpriced
    failing = ""
    if progress.failed_steps:
        error = (progress.last_step_error or "")[:300]
        failing = f"; its last {progress.failed_steps} step(s) failed: {error}"
    return f"batch {progress.batch_id} {progress.state} ({items or 'no items'}{money}){failing}"


#: The tag naming the batch whose result a partition's requested run delivers.
BATCH_TAG = "idempotent_jobs/batch"


def collected_requests(
    spec: IdempotentJobSpec, ledger: RunLedger, cursor: str | None
) -> tuple[list[dg.RunRequest], list[str], str | None]:
    """A run of the ordinary job for each partition the batches collected after ``cursor``
    accepted (keyed by batch and partition: never launched twice), the lines naming the
    partitions whose item was not accepted, and the new cursor."""
    since = datetime.fromisoformat(cursor) if cursor else datetime.min.replace(tzinfo=UTC)
    requests: list[dg.RunRequest] = []
    others: dict[str, list[str]] = {}
    for item in ledger.collected_runs([spec.identity_job_name], since):
        key = partition_key_of(spec.partitions_def, item.subject_id, item.scheduled_at)
        if item.state == "accepted":
            requests.append(
                dg.RunRequest(
                    run_key=f"{item.batch_id}:{key}",
                    partition_key=key,
                    tags={BATCH_TAG: item.batch_id},
                )
            )
        else:
            others.setdefault(item.batch_id, []).append(f"{key} ({item.state.replace('_', ' ')})")
        cursor = item.collected_at.isoformat()
    lines = [
        f"batch {batch_id}: no run requested for {', '.join(keys)}"
        for batch_id, keys in others.items()
    ]
    return requests, lines, cursor


def build_batch_lane(
    spec: IdempotentJobSpec,
    *,
    minimum_interval_seconds: int = 30,
    lease_seconds: float = DEFAULT_BATCH_LEASE_SECONDS,
    sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> tuple[dg.JobDefinition, dg.SensorDefinition]:
    """The spec's batch job (``<name>_batch``, launched with a :class:`BatchRange`) and the
    sensor that advances its batches (``<name>_batches``, every ``minimum_interval_seconds``;
    ``sensor_status``: whether it runs before anyone turns it on in the UI). Bind the same
    resources as the online job's."""
    keys = {"ledger", spec.collector, spec.model}

    @dg.op(name="open_batch", required_resource_keys=keys)
    def open_batch_op(context: dg.OpExecutionContext, config: BatchRange) -> None:
        ledger: RunLedger = context.resources.ledger
        model = batch_model(spec, context.resources)
        steps = batch_steps(spec, model, getattr(context.resources, spec.collector))
        provider = model.batch_provider()
        identities = range_identities(spec, config)
        worker = f"dagster:{context.run_id}:open_batch"
        opened: list[BatchProgress] = []
        left = deque(identities)

        def draw() -> Iterator[RunIdentity]:
            while left:
                yield left.popleft()

        while left:  # a batch per provider-sized part of the runs left to compute
            try:
                batch = open_intent(
                    ledger,
                    steps,
                    provider,
                    draw(),
                    worker_id=worker,
                    lease_seconds=lease_seconds,
                    caller_run_id=context.run_id,
                )
            except BudgetExceededError:
                if opened:  # they stand: the sensor advances them
                    context.log.warning(
                        "opened before the budget refused the next batch: "
                        + ", ".join(p.batch_id for p in opened)
                    )
                raise
            if batch is None:
                continue
            # Submitted here, then handed to the sensor (the batch's lease given back).
            step = advance(
                ledger, steps, provider, batch.batch_id, worker_id=worker, hand_back=True
            )
            if step.provider_batch_id is None and step.state != "intent":  # ended unsent
                row = ledger.batch_row(batch.batch_id) or {}
                before = f" (opened before it: {', '.join(p.batch_id for p in opened)})"
                raise dg.Failure(
                    description=f"batch {batch.batch_id} was not submitted: {row.get('error')}; "
                    f"its runs were given back{before if opened else ''}",
                    allow_retries=False,
                )
            opened.append(step)
        if not opened:
            context.add_output_metadata(
                {"result": "nothing to compute", "partitions": len(identities)}
            )
            return
        in_batches = sum(sum(p.items.values()) for p in opened)
        context.add_output_metadata(
            {
                "batch_id": ", ".join(p.batch_id for p in opened),
                "state": ", ".join(p.state for p in opened),
                "provider_batch_id": ", ".join(p.provider_batch_id or "" for p in opened),
                "batches": len(opened),
                "partitions": len(identities),
                "runs_in_batch": in_batches,
                "skipped": len(identities) - in_batches,
            }
        )

    @dg.job(name=f"{spec.name}_batch", tags={**spec.tags(), "idempotent_jobs/lane": "batch"})
    def batch_job() -> None:
        open_batch_op()

    @dg.sensor(
        name=f"{spec.name}_batches",
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={"ledger", spec.model},
        description=f"Advances the batches of {spec.name}_batch until they are collected, then "
        f"requests a run of {spec.name} for each partition they computed, which delivers it",
        default_status=sensor_status,
        job_name=spec.name,
    )
    def batches_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        ledger: RunLedger = context.resources.ledger
        model = batch_model(spec, context.resources)
        steps = batch_steps(spec, model)
        provider = model.batch_provider()
        cursor = context.cursor
        if cursor is None:  # a sensor's first tick: batches collected before it are not its to
            # request runs for (an upgrade must not launch a run per partition of the past)
            before = ledger.last_collected([spec.identity_job_name])
            cursor = before.isoformat() if before is not None else None
        lines = [
            _advance_one(ledger, steps, provider, batch_id)
            for batch_id in ledger.open_batches([spec.identity_job_name])
        ] or ["no open batch"]
        requests, named, cursor = collected_requests(spec, ledger, cursor)
        lines.extend(named)
        if requests:
            lines.append(f"{len(requests)} run(s) of {spec.name} requested")
        text = "; ".join(lines)
        context.log.info(text)
        if requests:
            return dg.SensorResult(run_requests=requests, cursor=cursor)
        return dg.SensorResult(skip_reason=text, cursor=cursor)

    def _advance_one(
        ledger: RunLedger, steps: BatchSteps, provider: BatchProvider, batch_id: str
    ) -> str:
        """One step of one batch, as a line of the tick: a batch that fails never stops the
        others (its failure is counted on it, and shown)."""
        try:
            progress = advance(
                ledger, steps, provider, batch_id, worker_id=f"sensor:{spec.name}_batches"
            )
        except LeaseLostError:
            return f"batch {batch_id}: advanced by another worker now"
        except LedgerConnectionError:
            raise  # the ledger out of reach: no batch can go on, the tick fails as a whole
        except Exception as exc:  # noqa: BLE001 - this batch's step failed; the tick goes on
            try:
                failed = batch_progress(ledger, batch_id)
            except Exception:  # noqa: BLE001 - the line says what is known
                return f"batch {batch_id}: its step failed: {describe_error(exc)[:300]}"
            return describe(failed)
        return describe(progress)

    return batch_job, batches_sensor
