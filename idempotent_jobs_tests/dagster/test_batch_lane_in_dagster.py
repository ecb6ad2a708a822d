"""The batch lane in Dagster: the batch job launched with a range opens and submits one batch
(the fake OpenAI Batch API), online runs of its partitions step aside while it is pending, the
sensor polls and collects it, and the partitions' ordinary runs then reuse its results with no
model call."""

import json
from collections.abc import Iterator
from typing import Any

import dagster as dg
import psycopg
import pytest

from idempotent_jobs import RunIdentity
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import (
    IdempotentJobSpec,
    OpenAICompatibleModel,
    RunLedgerResource,
    build_batch_lane,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs_tests.ledgers import BothFaces
from testkit.dagster_harness import DagsterTestEnv
from testkit.fake_providers import Answer, FakeProviders

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string"}},
    "required": ["label"],
}


class Subject(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"subject": identity.subject_id}


def has_label(output: dict[str, Any]) -> bool:
    return bool(output.get("label"))


SPEC = IdempotentJobSpec(
    name="labels",
    identity_job_name="labels",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-10"),
    subjects=["a", "b", "c"],
    lease_seconds=30.0,
    validate=has_label,
    model_retry=dg.RetryPolicy(max_retries=0),
)
JOB, _ = build_idempotent_job(SPEC)
BATCH_JOB, SENSOR = build_batch_lane(SPEC)


@pytest.fixture
def provider() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer('{"label": "ok"}', 40, 4)) as fake:
        yield fake


def _resources(provider: FakeProviders, env: DagsterTestEnv) -> dict[str, Any]:
    return {
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "collector": Subject(),
        "model": OpenAICompatibleModel(
            model="gpt-4o-mini",
            api_key="sk-test",
            base_url=provider.openai_url,
            output_schema="idempotent_jobs_tests.dagster.test_batch_lane_in_dagster:LABEL_SCHEMA",
        ),
        "report_file": JsonLinesChannel(path=str(env.notifications)),
    }


def test_a_range_backfilled_through_the_batch_lane_is_computed_once_and_reused(
    dagster_env: DagsterTestEnv,
    ledger: BothFaces,
    db: psycopg.Connection,
    provider: FakeProviders,
) -> None:
    provider.batches.polls_to_complete = 1
    resources = _resources(provider, dagster_env)
    defs = dg.Definitions(jobs=[JOB, BATCH_JOB], sensors=[SENSOR], resources=resources)
    batch_job = defs.resolve_job_def("labels_batch")
    config = {"ops": {"open_batch": {"config": {"start": "2026-11-01", "end": "2026-11-02"}}}}
    opened = batch_job.execute_in_process(run_config=config)
    assert opened.success
    [metadata] = [
        e.event_specific_data.metadata  # type: ignore[union-attr]
        for e in opened.all_events
        if e.event_type_value == "STEP_OUTPUT"
    ]
    assert metadata["state"].value == "submitted"
    assert (metadata["partitions"].value, metadata["runs_in_batch"].value) == (6, 6)
    assert len(provider.batches.created["openai"]) == 1

    # An online run of a partition in the pending batch steps aside, paying nothing.
    job = defs.resolve_job_def("labels")
    aside = job.execute_in_process(partition_key="a|2026-11-01", raise_on_error=False)
    assert not aside.success
    failure = [e for e in aside.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "is in batch" in str(failure.event_specific_data)
    assert provider.requests == []  # no request of any kind was answered online

    # The sensor advances the batch tick by tick until it is collected.
    texts = []
    for _ in range(5):
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            result = SENSOR.evaluate_tick(context)
        assert not result.run_requests
        texts.append(result.skip_message or "")
        if "collected" in texts[-1]:
            break
    assert "collected (6 accepted)" in texts[-1], texts
    calls = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE tier = 'batch') FROM idempotent_jobs.model_calls"
    ).fetchone()
    assert calls == (6, 6)

    # Ordinary runs reuse the batch's results, and deliver their notifications once.
    online_requests = len(provider.requests)
    for key in ("a|2026-11-01", "c|2026-11-02"):
        assert job.execute_in_process(partition_key=key).success
    assert len(provider.requests) == online_requests  # no model call
    delivered = [json.loads(line) for line in dagster_env.notifications.read_text().splitlines()]
    assert sorted(
        (d["payload"]["subject"], d["payload"]["window_start"][:10]) for d in delivered
    ) == [
        ("a", "2026-11-01"),
        ("c", "2026-11-02"),
    ]
