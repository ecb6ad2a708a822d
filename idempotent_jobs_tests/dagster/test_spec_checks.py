"""A job's identity fields are checked when it is built, by the rules every run applies: a
subject no run could take is refused there, naming it, instead of failing every run of it."""

import json
from typing import Any

import dagster as dg
import psycopg
import pytest

from idempotent_jobs import RunIdentity
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.dagster import (
    IdempotentJobSpec,
    OpenAICompatibleModel,
    RunLedgerResource,
    build_idempotent_job,
)
from idempotent_jobs.dagster.job_spec import default_validate
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs_tests.ledgers import HarnessLedger
from testkit.dagster_harness import DagsterTestEnv
from testkit.fake_providers import Answer, FakeProviders


def spec(**fields: object) -> IdempotentJobSpec:
    settings: dict[str, object] = {
        "name": "contract_review",
        "identity_job_name": "contract-review",
        "version": "v1",
        "window": dg.DailyPartitionsDefinition(start_date="2026-11-01"),
        "subjects": ["acme", "globex"],
        **fields,
    }
    return IdempotentJobSpec(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"subjects": ["acme", ""]}, "subject ''"),
        ({"subjects": ["acme", "evil\u202egnp.exe"]}, "control, format"),
        ({"subjects": [" emea"]}, "spaces around it"),
        ({"subjects": ["emea "]}, "spaces around it"),
        ({"subjects": ["a|b"]}, "'|'"),
        ({"subjects": ["acme", "a,b"]}, "subject 'a,b': must not contain ','"),
        ({"subjects": ["[eu]"]}, "subject '[eu]': must not contain ','"),
        ({"subjects": "acme"}, "not one string"),
        ({"subjects": ["caf\u00e9", "cafe\u0301"]}, "the same subject once normalised"),
        ({"identity_job_name": " contract-review"}, "identity_job_name"),
        ({"name": "contract-review"}, "name: must be letters, digits and underscores"),
        ({"name": ""}, "name: must be letters, digits and underscores"),
        ({"version": ""}, "version"),
    ],
)
def test_a_subject_or_name_no_run_could_take_is_refused_when_the_job_is_built(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        spec(**fields)
    assert named in str(refused.value)
    assert f"IdempotentJobSpec {fields.get('name', 'contract_review')!r}" in str(refused.value)


def test_a_subject_spelled_in_another_unicode_form_is_kept() -> None:
    """Two spellings of one name address the same run (ids are over NFC): a subjects file in
    NFD keeps working, as it always has."""
    assert spec(subjects=["cafe\u0301"]).identity_for("cafe\u0301|2026-11-02").subject_id == (
        "caf\u00e9"
    )


def test_a_model_step_with_no_schema_answers_what_the_default_validator_accepts(
    dagster_env: DagsterTestEnv, ledger: HarnessLedger, db: psycopg.Connection
) -> None:
    """OpenAICompatibleModel with no output schema answers ``{"text": ...}``: the spec's default
    validator accepts it, and the default payload carries it, at the first call."""
    with FakeProviders(default=lambda request: Answer("The invoice is wrong.", 30, 6)) as fake:
        job, _ = build_idempotent_job(spec(name="plain_text", identity_job_name="plain-text"))
        defs = dg.Definitions(
            jobs=[job],
            resources={
                "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
                "collector": _Raw(),
                "model": OpenAICompatibleModel(
                    model="gpt-4o-mini", api_key="sk-test", base_url=fake.openai_url
                ),
                "report_file": JsonLinesChannel(path=str(dagster_env.notifications)),
            },
        )
        result = defs.resolve_job_def("plain_text").execute_in_process(
            partition_key="acme|2026-11-02"
        )
    assert result.success and len(fake.requests) == 1
    assert db.execute("SELECT outcome FROM idempotent_jobs.model_calls").fetchall() == [
        ("accepted",)
    ]
    [sent] = dagster_env.notifications.read_text().splitlines()
    assert json.loads(sent)["payload"]["summary"] == "The invoice is wrong."
    assert default_validate({"text": "x"}) and not default_validate({"text": " "})
    assert not default_validate({"text": "x", "other": 1})  # only the schema-less answer


class _Raw(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        return {"ticket": "the invoice is wrong"}
