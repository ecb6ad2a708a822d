"""Traces and metrics through OpenTelemetry's API, read with the SDK's in-memory exporter and
reader: the span tree and metric values of a run with one failed and one accepted call; the
same steps as spans under Dagster's steps; and nothing at all without an SDK."""

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from idempotent_jobs import JobConfig, ModelAnswer, ModelUsage, RunLedger, run_idempotent
from idempotent_jobs.core import metrics, telemetry
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs_tests.helpers import Collector, email, identity
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.otel import installed, tree

CONFIG = JobConfig.of(prompt="Summarise.", model="gpt-test", validator="any")


def _answer(raw: dict[str, Any]) -> ModelAnswer:
    return ModelAnswer({"summary": "ok"}, ModelUsage("gpt-test", 1200, 300))


def _timeout(raw: dict[str, Any]) -> ModelAnswer:
    raise TimeoutError("the model did not answer in time")


def test_a_failed_then_an_accepted_call_as_spans_and_metrics(
    ledger: HarnessLedger, operator: LedgerAdmin
) -> None:
    operator.set_price("gpt-test", "2.50", "10.00")
    ident = identity()
    collect = Collector()
    with installed() as otel:
        with pytest.raises(TimeoutError):
            run_idempotent(ledger, ident, collect=collect, transform=_timeout, config=CONFIG)
        run_idempotent(
            ledger, ident, collect=collect, transform=_answer, notifications=email, config=CONFIG
        )
        run_idempotent(ledger, ident, collect=collect, transform=_answer, config=CONFIG)
        spans = otel.finished()
        assert tree(spans) == [
            "idempotent_jobs.attempt [failed]",
            "  idempotent_jobs.claim [claimed]",
            "  idempotent_jobs.collect",
            "  chat gpt-test [failed]",
            "idempotent_jobs.attempt [executed]",
            "  idempotent_jobs.claim [claimed]",
            "  chat gpt-test",
            "  idempotent_jobs.commit [accepted]",
            "idempotent_jobs.attempt [reused]",
        ]
        first, _, _, failed_call, second, claim, call, commit, reused = sorted(
            spans, key=lambda s: s.start_time or 0
        )
        for s in spans:  # every span names the ledger run it worked on
            attrs = s.attributes or {}
            assert attrs["idempotent_jobs.run_id"] == ident.run_id
            assert attrs["idempotent_jobs.job"] == ident.job_name
            assert attrs["idempotent_jobs.subject"] == ident.subject_id
            assert attrs["idempotent_jobs.window_start"] == "2026-08-07T09:00:00+00:00"
        assert first.status.status_code == StatusCode.ERROR
        assert failed_call.status.status_code == StatusCode.ERROR
        assert (failed_call.attributes or {})["error.type"] == "TimeoutError"
        assert (claim.attributes or {})["idempotent_jobs.lease_epoch"] == 2
        assert (claim.attributes or {})["idempotent_jobs.revision"] == 0
        assert (second.attributes or {})["idempotent_jobs.input_reused"] is True
        assert call.kind.name == "CLIENT"
        assert {k: v for k, v in (call.attributes or {}).items() if k.startswith("gen_ai")} == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-test",
            "gen_ai.response.model": "gpt-test",
            "gen_ai.usage.input_tokens": 1200,
            "gen_ai.usage.output_tokens": 300,
        }
        assert (commit.attributes or {})["idempotent_jobs.lease_epoch"] == 2
        assert (reused.attributes or {})["idempotent_jobs.reused"] is True

        runs = {
            a["idempotent_jobs.outcome"]: p.value for a, p in otel.points("idempotent_jobs.runs")
        }
        assert runs == {"failed": 1, "executed": 1, "reused": 1}
        assert all(
            a["idempotent_jobs.job"] == ident.job_name and "idempotent_jobs.run_id" not in a
            for a, _ in otel.points("idempotent_jobs.runs")
        )
        usage = {
            a["gen_ai.token.type"]: (p.count, p.sum, a["gen_ai.request.model"])
            for a, p in otel.points("gen_ai.client.token.usage")
        }
        assert usage == {"input": (1, 1200, "gpt-test"), "output": (1, 300, "gpt-test")}
        [(cost_attrs, cost)] = otel.points("idempotent_jobs.model.cost")
        assert cost.value == pytest.approx(1200 * 2.5 / 1e6 + 300 * 10 / 1e6)
        assert cost_attrs["idempotent_jobs.currency"] == "USD"
        assert otel.points("idempotent_jobs.tokens.not_accepted") == []  # a raised call: none


def test_tokens_of_a_rejected_answer_are_counted_as_not_accepted(ledger: HarnessLedger) -> None:
    with installed() as otel:
        with pytest.raises(Exception, match="rejected"):
            run_idempotent(
                ledger,
                identity(),
                collect=Collector(),
                transform=_answer,
                validate=lambda output: False,
                config=CONFIG,
            )
        [(attrs, point)] = otel.points("idempotent_jobs.tokens.not_accepted")
        assert point.value == 1500
        assert attrs == {
            "idempotent_jobs.job": "competitor-summary",
            "gen_ai.request.model": "gpt-test",
            "idempotent_jobs.outcome": "rejected",
        }


def test_without_an_sdk_nothing_is_made(ledger: HarnessLedger) -> None:
    assert not telemetry.tracing() and not telemetry.metering()
    assert metrics.instruments() is None
    with telemetry.span("anything") as span:
        assert span is None
    outcome = run_idempotent(ledger, identity(), collect=Collector(), transform=_answer)
    assert outcome.executed


def test_the_switch_turns_it_off_even_with_an_sdk(
    ledger: HarnessLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "enabled", False)  # IDEMPOTENT_JOBS_TELEMETRY=off
    with installed() as otel:
        assert not telemetry.active()
        run_idempotent(ledger, identity(), collect=Collector(), transform=_answer)
        assert otel.finished() == []
        assert otel.points("idempotent_jobs.runs") == []


def test_a_wait_for_another_workers_lease_is_measured(database: str) -> None:
    ident = identity()
    holding, go, waiting = threading.Event(), threading.Event(), threading.Event()

    def collect(_: object) -> dict[str, Any]:  # runs under the holder's lease
        holding.set()
        return {"documents": ["d"]}

    class WatchedLedger(RunLedger):
        def get(self, run_id: str) -> Any:  # the waiter's look at the run between claims
            record = super().get(run_id)
            if record is not None and record.status == "running":
                waiting.set()  # it saw the holder's lease: it waits now, whenever that ends
            return record

    def held(raw: dict[str, Any]) -> ModelAnswer:
        assert go.wait(timeout=60)
        return _answer(raw)

    with installed() as otel, HarnessLedger(database) as holder, WatchedLedger(database) as waiter:
        first = threading.Thread(
            target=lambda: run_idempotent(holder, ident, collect=collect, transform=held)
        )
        first.start()
        assert holding.wait(timeout=60)
        second = threading.Thread(
            target=lambda: run_idempotent(
                waiter, ident, collect=Collector(), transform=_answer, wait_seconds=60
            )
        )
        second.start()
        assert waiting.wait(timeout=60)  # the second worker is waiting for the lease
        go.set()
        first.join(timeout=60)
        second.join(timeout=60)
        [(attrs, point)] = otel.points("idempotent_jobs.lease.wait.duration")
        assert attrs == {"idempotent_jobs.job": ident.job_name, "idempotent_jobs.outcome": "reused"}
        assert point.count == 1 and point.sum > 0
        runs = {
            a["idempotent_jobs.outcome"]: p.value for a, p in otel.points("idempotent_jobs.runs")
        }
        assert runs == {"executed": 1, "reused": 1}


REGISTRY = json.loads(
    (Path(__file__).parent.parent / "data" / "genai_attribute_registry.json").read_text()
)
FULL_USAGE = ModelUsage(
    "claude-test-20260101",
    12_050,
    400,
    requested_model="claude-test",
    cache_read_tokens=10_000,
    cache_write_tokens=2_000,
    cache_write_1h_tokens=1_500,
    reasoning_tokens=100,
    provider_name="anthropic",
)


def test_every_emitted_genai_name_is_in_the_conventions_registry_and_a_reuse_reports_nothing(
    ledger: HarnessLedger,
    operator: LedgerAdmin,
) -> None:
    operator.set_price("claude-test", "3", "15")
    ident = identity(subject="registry")
    config = JobConfig.of(prompt="p", model="claude-test", validator="v")
    with installed() as otel:

        def transform(raw: dict[str, Any]) -> ModelAnswer:
            return ModelAnswer({"summary": "ok"}, FULL_USAGE)

        run_idempotent(ledger, ident, collect=Collector(), transform=transform, config=config)
        [call] = [s for s in otel.finished() if s.name.startswith("chat")]
        attrs = dict(call.attributes or {})
        assert attrs["gen_ai.provider.name"] == "anthropic"
        assert attrs["gen_ai.usage.input_tokens"] == 12_050  # cached tokens included
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == 10_000
        assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 2_000
        assert attrs["gen_ai.usage.reasoning.output_tokens"] == 100
        usage_points = otel.points("gen_ai.client.token.usage")
        cost_points = otel.points("idempotent_jobs.model.cost")
        assert {a["gen_ai.token.type"] for a, _ in usage_points} == set(REGISTRY["token_types"])
        assert all(a["gen_ai.provider.name"] == "anthropic" for a, _ in usage_points)
        emitted = {k for s in otel.finished() for k in (s.attributes or {})}
        for name in ("gen_ai.client.token.usage", "idempotent_jobs.model.cost"):
            emitted |= {k for a, _ in otel.points(name) for k in a}
        genai = {k for k in emitted if k.startswith("gen_ai.")}
        assert genai <= set(REGISTRY["attributes"]), genai - set(REGISTRY["attributes"])
        assert not genai & set(REGISTRY["deprecated"])

        # A replay reuses the run: nothing is executed, so no usage and no money is reported.
        before = [(a, p.count, p.sum) for a, p in usage_points], [p.value for _, p in cost_points]
        run_idempotent(ledger, ident, collect=Collector(), transform=transform, config=config)
        after = (
            [(a, p.count, p.sum) for a, p in otel.points("gen_ai.client.token.usage")],
            [p.value for _, p in otel.points("idempotent_jobs.model.cost")],
        )
        assert after == before
