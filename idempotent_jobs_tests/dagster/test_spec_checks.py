"""A job's identity fields are checked when it is built, by the rules every run applies: a
subject no run could take is refused there, naming it, instead of failing every run of it."""

import dagster as dg
import pytest

from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.dagster import IdempotentJobSpec


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
        ({"subjects": "acme"}, "not one string"),
        ({"subjects": ["caf\u00e9", "cafe\u0301"]}, "the same subject once normalised"),
        ({"identity_job_name": " contract-review"}, "identity_job_name"),
        ({"version": ""}, "version"),
    ],
)
def test_a_subject_or_name_no_run_could_take_is_refused_when_the_job_is_built(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        spec(**fields)
    assert named in str(refused.value)
    assert "contract_review" in str(refused.value)


def test_a_subject_spelled_in_another_unicode_form_is_kept() -> None:
    """Two spellings of one name address the same run (ids are over NFC): a subjects file in
    NFD keeps working, as it always has."""
    assert spec(subjects=["cafe\u0301"]).identity_for("cafe\u0301|2026-11-02").subject_id == (
        "caf\u00e9"
    )
