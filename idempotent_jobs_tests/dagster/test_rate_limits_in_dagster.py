"""A job's spec declares its provider's rate limit; the transform step of each partition waits
for its place in the ledger before its request, and says how long in its metadata."""

from collections.abc import Iterator, Sequence
from typing import Any, cast

import dagster as dg
import pytest

from idempotent_jobs import LedgerPermissionError, RateLimit, RunIdentity
from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import (
    OpenAICompatibleModel,
    RunLedgerResource,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.fake_providers import Answer, FakeProviders
from testkit.specs import job_spec

#: Two requests per 10-second window: the first goes at once, the second waits for its place
#: (about 5.3 s after the first, less the time the first run took: at least 2 s on a slow
#: machine).
LIMIT = RateLimit("openai", "gpt-4o-mini", requests_per_minute=2, window_seconds=10)


class Subject(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"subject": identity.subject_id}


def has_text(output: dict[str, Any]) -> bool:
    return bool(output.get("text"))


SPEC = job_spec(
    "limited_summary",
    subjects=["first", "second"],
    validate=has_text,
    model_retry=dg.RetryPolicy(max_retries=1, delay=0.1),
    rate_limits=[LIMIT],
)
JOB, _ = build_idempotent_job(SPEC)


@pytest.fixture
def provider() -> Iterator[FakeProviders]:
    with FakeProviders(default=lambda request: Answer("a summary", 20, 5)) as fake:
        yield fake


def test_the_spec_declares_the_limit_and_the_step_reports_its_wait(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    provider: FakeProviders,
) -> None:
    defs = dg.Definitions(
        jobs=[JOB],
        resources={
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "collector": Subject(),
            "model": OpenAICompatibleModel(
                model="gpt-4o-mini", api_key="sk-test", base_url=provider.openai_url
            ),
            "report_file": JsonLinesChannel(path=str(dagster_env.notifications)),
        },
    )
    job = defs.resolve_job_def(SPEC.name)
    waits: list[float] = []
    for subject in ("first", "second"):
        result = job.execute_in_process(partition_key=f"{subject}|2026-08-07")
        assert result.success
        [transform] = [
            e
            for e in result.all_events
            if e.step_key == "transform" and e.event_type_value == "STEP_OUTPUT"
        ]
        found = transform.step_output_data.metadata.get("rate_limit_wait_seconds")
        waits.append(0.0 if found is None else float(cast(float, found.value)))
    [row] = operator.rate_limits()
    assert (row["requests_per_window"], row["declared_by"]) == (2, "limited-summary")
    assert waits[0] < 0.5 and waits[1] > 0.3, waits  # the second waited for its place
    assert len(provider.requests) == 2


class NoDeclarations(HarnessLedger):
    """A ledger that cannot take the spec's limits (a role without the privilege, an outage)."""

    def declare_rate_limits(self, limits: Sequence[RateLimit], job_name: str) -> None:
        raise LedgerPermissionError("permission denied for table rate_limits")


class DeclaringFails(RunLedgerResource):
    ledger_class = NoDeclarations


def test_a_declaration_that_fails_ends_the_attempt_and_frees_the_lease(
    dagster_env: DagsterTestEnv,
    ledger: HarnessLedger,
    operator: LedgerAdmin,
    provider: FakeProviders,
) -> None:
    defs = dg.Definitions(
        jobs=[JOB],
        resources={
            "ledger": DeclaringFails(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "collector": Subject(),
            "model": OpenAICompatibleModel(
                model="gpt-4o-mini", api_key="sk-test", base_url=provider.openai_url
            ),
            "report_file": JsonLinesChannel(path=str(dagster_env.notifications)),
        },
    )
    job = defs.resolve_job_def(SPEC.name)
    result = job.execute_in_process(partition_key="first|2026-08-07", raise_on_error=False)
    assert not result.success
    [run] = operator.list_runs(job_name=SPEC.identity_job_name)
    assert run.status == "failed" and run.lease_owner is None  # given back, not held
    assert "permission denied for table rate_limits" in (run.last_error or "")
    assert ledger.model_calls(run.run_id) == [] and provider.requests == []
