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
    AnthropicModel,
    OpenAICompatibleModel,
    RunLedgerResource,
    build_batch_lane,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.fake_providers import Answer, FakeProviders
from testkit.specs import job_spec

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


SPEC = job_spec(
    "labels",
    subjects=["a", "b", "c"],
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-11-10"),
    validate=has_label,
)
JOB, _ = build_idempotent_job(SPEC)
BATCH_JOB, SENSOR = build_batch_lane(SPEC)


@pytest.fixture
def provider() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer('{"label": "ok"}', 40, 4)) as fake:
        yield fake


def _resources(
    provider: FakeProviders,
    env: DagsterTestEnv,
    api: str = "openai",
    batch_max_requests: int | None = None,
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "api_key": "sk-test",
        "batch_max_requests": batch_max_requests,
        "output_schema": "idempotent_jobs_tests.dagster.test_batch_lane_in_dagster:LABEL_SCHEMA",
    }
    model = (
        OpenAICompatibleModel(model="gpt-4o-mini", base_url=provider.openai_url, **settings)
        if api == "openai"
        else AnthropicModel(model="claude-haiku-4-5", base_url=provider.anthropic_url, **settings)
    )
    return {
        "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
        "collector": Subject(),
        "model": model,
        "report_file": JsonLinesChannel(path=str(env.notifications)),
    }


def test_a_range_backfilled_through_the_batch_lane_is_computed_once_and_reused(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
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

    # The sensor advances the batch tick by tick until it is collected, then asks for a run of
    # each partition it computed (keyed by batch and partition, tagged with the batch).
    texts, requests, cursor = [], [], None
    for _ in range(5):
        with dg.build_sensor_context(
            resources=resources, definitions=defs, cursor=cursor
        ) as context:
            result = SENSOR.evaluate_tick(context)
        cursor = result.cursor
        requests = list(result.run_requests or [])
        if requests:
            break
        texts.append(result.skip_message or "")
    assert any("submitted" in text for text in texts), texts
    keys = sorted(str(r.partition_key) for r in requests)
    assert keys == sorted(f"{s}|2026-11-0{d}" for s in "abc" for d in (1, 2))
    [batch_id] = {r.tags["idempotent_jobs/batch"] for r in requests}
    assert all(r.run_key == f"{batch_id}:{r.partition_key}" for r in requests)
    calls = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE tier = 'batch') FROM idempotent_jobs.model_calls"
    ).fetchone()
    assert calls == (6, 6)
    with dg.build_sensor_context(resources=resources, definitions=defs, cursor=cursor) as context:
        assert not SENSOR.evaluate_tick(context).run_requests  # requested once
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        # A sensor's first tick (no cursor: just deployed, or upgraded) requests nothing for
        # batches collected before it.
        assert not SENSOR.evaluate_tick(context).run_requests

    # The requested runs reuse the batch's results and deliver each notification once.
    online_requests = len(provider.requests)
    for request in requests:
        assert job.execute_in_process(
            partition_key=request.partition_key, tags=dict(request.tags)
        ).success
    assert len(provider.requests) == online_requests  # no model call
    delivered = [json.loads(line) for line in dagster_env.notifications.read_text().splitlines()]
    assert sorted(
        (d["payload"]["subject"], d["payload"]["window_start"][:10]) for d in delivered
    ) == sorted((s, f"2026-11-0{d}") for s in "abc" for d in (1, 2))
    again = job.execute_in_process(partition_key="a|2026-11-01")  # a schedule tick later on
    assert again.success and len(dagster_env.notifications.read_text().splitlines()) == 6


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_range_larger_than_a_provider_batch_is_split_into_batches_it_takes(
    api: str,
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    provider: FakeProviders,
) -> None:
    """7 runs where the provider takes 3 requests a batch (the fake refuses more, as the real
    ones do above 50,000 and 100,000): 3 batches of 3, 3 and 1, each collected, each run
    accepted once, and launching the same range again opens nothing."""
    provider.batches.max_requests[api] = 3
    resources = _resources(provider, dagster_env, api, batch_max_requests=3)
    defs = dg.Definitions(jobs=[JOB, BATCH_JOB], sensors=[SENSOR], resources=resources)
    batch_job = defs.resolve_job_def("labels_batch")
    config = {
        "ops": {
            "open_batch": {
                "config": {"start": "2026-11-01", "end": "2026-11-04", "subjects": ["a", "b"]}
            }
        }
    }
    _, done = ledger.begin(SPEC.identity_for("a|2026-11-01"), "w", 30)
    assert done is not None  # one run of the range is done already: 7 are left to compute
    ledger.complete(ledger.checkpoint(done, {}), {"label": "online"})
    opened = batch_job.execute_in_process(run_config=config)
    assert opened.success
    [metadata] = [
        e.event_specific_data.metadata  # type: ignore[union-attr]
        for e in opened.all_events
        if e.event_type_value == "STEP_OUTPUT"
    ]
    assert metadata["batches"].value == 3
    assert (metadata["partitions"].value, metadata["runs_in_batch"].value) == (8, 7)
    assert len(provider.batches.created[api]) == 3
    sizes = sorted(len(b.requests) for b in provider.batches.batches.values())
    assert sizes == [1, 3, 3]

    requested = 0
    for _ in range(5):
        with dg.build_sensor_context(resources=resources, definitions=defs) as context:
            requested = len(SENSOR.evaluate_tick(context).run_requests or [])
        if requested:
            break
    assert requested == 7  # one run per partition the three batches computed
    accepted = db.execute(
        "SELECT count(*), count(DISTINCT run_id) FROM idempotent_jobs.runs "
        "WHERE status = 'completed' AND output->>'label' = 'ok'"
    ).fetchone()
    assert accepted == (7, 7)
    again = batch_job.execute_in_process(run_config=config)
    assert again.success
    assert len(provider.batches.created[api]) == 3  # nothing left to compute: no batch


def test_a_batch_the_provider_refuses_fails_the_launch_and_gives_its_runs_back(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    provider: FakeProviders,
) -> None:
    """The provider takes fewer requests than the lane was told (a 400 at create): the launch
    fails naming the reason, no provider batch exists, and the runs are free to compute online
    at once (a refused create is not searched for and sent again at every sensor tick)."""
    provider.batches.max_requests["openai"] = 3
    resources = _resources(provider, dagster_env)
    defs = dg.Definitions(jobs=[JOB, BATCH_JOB], sensors=[SENSOR], resources=resources)
    config = {"ops": {"open_batch": {"config": {"start": "2026-11-01", "end": "2026-11-02"}}}}
    opened = defs.resolve_job_def("labels_batch").execute_in_process(
        run_config=config, raise_on_error=False
    )
    assert not opened.success
    [failure] = [e for e in opened.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "was not submitted: the provider refused the batch" in str(failure.event_specific_data)
    assert "at most 3 requests, not 6" in str(failure.event_specific_data)
    assert provider.batches.created["openai"] == []
    [(state, provider_batch_id, error)] = db.execute(
        "SELECT state, provider_batch_id, error FROM idempotent_jobs.batches"
    ).fetchall()
    assert (state, provider_batch_id) == ("collected", None)  # ended, nothing left pending
    assert "at most 3 requests" in error
    held = db.execute(
        "SELECT count(*) FROM idempotent_jobs.runs WHERE lease_owner IS NOT NULL"
    ).fetchone()
    assert held == (0,)
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        tick = SENSOR.evaluate_tick(context)
    assert not tick.run_requests and (tick.skip_message or "").startswith("no open batch")
    assert defs.resolve_job_def("labels").execute_in_process(partition_key="b|2026-11-02").success
    assert len(provider.requests) == 1  # computed online, once


def test_a_batch_whose_step_fails_never_stops_the_others_in_a_tick(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    db: psycopg.Connection,
    provider: FakeProviders,
) -> None:
    resources = _resources(provider, dagster_env, batch_max_requests=3)
    defs = dg.Definitions(jobs=[JOB, BATCH_JOB], sensors=[SENSOR], resources=resources)
    config = {"ops": {"open_batch": {"config": {"start": "2026-11-01", "end": "2026-11-02"}}}}
    assert defs.resolve_job_def("labels_batch").execute_in_process(run_config=config).success
    provider.batches.fail_next["retrieve"] = [500]  # the first batch's poll fails, once
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        tick = SENSOR.evaluate_tick(context)
    states = db.execute(
        "SELECT state, failed_steps, last_step_error FROM idempotent_jobs.batches"
        " ORDER BY created_at"
    ).fetchall()
    assert [(s, n) for s, n, _ in states] == [("submitted", 1), ("collected", 0)]
    assert "500" in states[0][2]
    assert len(tick.run_requests or []) == 3  # the other batch's partitions, requested
    with dg.build_sensor_context(resources=resources, definitions=defs) as context:
        tick = SENSOR.evaluate_tick(context)
    assert db.execute(
        "SELECT count(*) FROM idempotent_jobs.batches WHERE state = 'collected'"
    ).fetchone() == (2,)
