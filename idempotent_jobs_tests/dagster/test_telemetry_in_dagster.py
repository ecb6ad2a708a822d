"""Traces and metrics of a Dagster run: the protocol's spans nest under a span per Dagster step,
every step of one Dagster run is in the trace whose id is the run id, and the metrics reach
Prometheus through OpenTelemetry's Prometheus exporter (a real scrape over HTTP)."""

import re
import urllib.request
import uuid
from typing import Any

import dagster as dg
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry, start_http_server

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import IdempotentJobSpec, RunLedgerResource, build_idempotent_job
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel, ModelStep, StepContext
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.otel import installed, tree
from testkit.specs import job_spec


class Tickets(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"tickets": [identity.subject_id]}


CALLS: list[int] = []  # the model's calls in this process, across op retries


class FlakyModel(ModelStep):
    """Times out on its first call in this process, then answers."""

    @property
    def model_name(self) -> str:
        return "gpt-test"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        CALLS.append(1)
        if len(CALLS) == 1:
            raise TimeoutError("the model did not answer in time")
        return ModelAnswer({"summary": "triaged"}, ModelUsage(self.model_name, 1200, 300))


SPEC = job_spec(
    "traced_triage",
    subjects=["support"],
    wait_seconds=0.0,
    model_retry=dg.RetryPolicy(max_retries=1),
)
JOB, _ = build_idempotent_job(SPEC)
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _run(env: DagsterTestEnv) -> dg.ExecuteInProcessResult:
    CALLS.clear()
    defs = dg.Definitions(
        jobs=[JOB],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "model": FlakyModel(),
            "collector": Tickets(),
            "report_file": JsonLinesChannel(path=str(env.notifications)),
        },
    )
    return defs.resolve_job_def(SPEC.name).execute_in_process(partition_key="support|2026-08-07")


def test_spans_nest_under_dagster_steps_in_the_trace_of_the_run(
    dagster_env: DagsterTestEnv,
) -> None:
    with installed() as otel:
        result = _run(dagster_env)
        assert result.success
        spans = otel.finished()
    assert tree(spans) == [
        "dagster step collect [collected]",
        "  idempotent_jobs.claim [claimed]",
        "  idempotent_jobs.collect",
        "dagster step transform",
        "  idempotent_jobs.claim [claimed]",
        "  chat gpt-test [failed]",
        "dagster step transform [model called]",
        "  idempotent_jobs.claim [claimed]",
        "  chat gpt-test",
        "dagster step persist [new]",
        "  idempotent_jobs.commit [accepted]",
        "dagster step deliver",
        "  idempotent_jobs.deliver",
    ]
    trace_id = uuid.UUID(result.run_id).int
    assert {s.context.trace_id for s in spans} == {trace_id}
    run_id = SPEC.identity_for("support|2026-08-07").run_id
    for s in spans:
        attrs = s.attributes or {}
        assert attrs["idempotent_jobs.run_id"] == run_id
        if s.name.startswith("dagster step"):
            assert attrs["dagster.run_id"] == result.run_id
            assert attrs["dagster.partition_key"] == "support|2026-08-07"
    retried = [s for s in spans if s.name == "dagster step transform"]
    assert [(s.attributes or {})["dagster.retry_number"] for s in retried] == [0, 1]


def test_only_a_reused_runs_steps_say_reused(dagster_env: DagsterTestEnv) -> None:
    with installed() as otel:
        assert _run(dagster_env).success  # a new run
        first = {s.name: dict(s.attributes or {}) for s in otel.finished()}
        otel.spans.clear()
        assert _run(dagster_env).success  # the same partition again: reused
        second = {s.name: dict(s.attributes or {}) for s in otel.finished()}
    persist = first["dagster step persist"]
    assert persist["idempotent_jobs.outcome"] == "new"
    assert "idempotent_jobs.reused" not in persist
    assert second["dagster step persist"]["idempotent_jobs.reused"] is True
    assert second["dagster step persist"]["idempotent_jobs.outcome"] == "reused"


@pytest.mark.slow
def test_metrics_reach_prometheus_through_the_exporter(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    operator.set_price("gpt-test", "2.50", "10.00")
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with installed(reader):
            assert _run(dagster_env).success
            with urllib.request.urlopen(  # noqa: S310 - the test's own server
                f"http://127.0.0.1:{server.server_port}/metrics", timeout=10
            ) as answer:
                scrape = answer.read().decode()
    finally:
        server.shutdown()
        thread.join(timeout=10)
    print(scrape)  # docs/observability.md shows this scrape
    samples = [
        (m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3)))
        for m in map(SAMPLE.fullmatch, scrape.splitlines())
        if m is not None
    ]

    def value(name: str, **labels: str) -> float:
        [found] = [v for n, got, v in samples if n == name and labels.items() <= got.items()]
        return found

    job = "traced-triage"
    runs = "idempotent_jobs_runs_total"
    assert value(runs, idempotent_jobs_job=job, idempotent_jobs_outcome="failed") == 1
    assert value(runs, idempotent_jobs_job=job, idempotent_jobs_outcome="executed") == 1
    usage = {"idempotent_jobs_job": job, "gen_ai_request_model": "gpt-test"}
    assert value("gen_ai_client_token_usage_sum", **usage, gen_ai_token_type="input") == 1200
    assert value("gen_ai_client_token_usage_count", **usage, gen_ai_token_type="output") == 1
    assert value("idempotent_jobs_model_cost_total", idempotent_jobs_currency="USD") == (
        pytest.approx(1200 * 2.5 / 1e6 + 300 * 10 / 1e6)
    )
    delivered = {"idempotent_jobs_channel": "report_file", "idempotent_jobs_outcome": "delivered"}
    assert value("idempotent_jobs_notifications_total", **delivered) == 1
    assert "idempotent_jobs_run_id" not in scrape  # low cardinality: never a run id


def test_each_op_works_out_its_run_identity_once(
    dagster_env: DagsterTestEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An op's frame (``dagster/op_frame.py``) asks the spec for the partition's identity once,
    for its span, its claim, its model's step context and its commit alike."""
    asked: list[str] = []
    identity_for = IdempotentJobSpec.identity_for

    def counted(spec: IdempotentJobSpec, partition_key: str) -> RunIdentity:
        asked.append(partition_key)
        return identity_for(spec, partition_key)

    monkeypatch.setattr(IdempotentJobSpec, "identity_for", counted)
    with installed():  # with an SDK, each step's span asks too
        result = _run(dagster_env)
    assert result.success
    retried = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    # collect, transform and its retry, persist, deliver: one question each
    assert len(retried) == 1 and asked == ["support|2026-08-07"] * 5
