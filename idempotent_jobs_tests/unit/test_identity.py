import hashlib
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from idempotent_jobs import InvalidInputError, RunIdentity, stable_run_id

NINE_UTC = datetime(2026, 8, 7, 9, 0, tzinfo=UTC)


def recipe(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_published_vector() -> None:
    # Computed independently with: printf '%s' '<text>' | sha256sum
    assert (
        stable_run_id("competitor-summary", "workspace-acme", NINE_UTC, "v1")
        == "70130901deca1ba5c508cd0730a67be6cb7bf82aa4ad3d766d68a219acb42719"
    )


@pytest.mark.parametrize(
    ("scheduled_at", "encoded"),
    [
        (NINE_UTC, "2026-08-07T09:00:00+00:00"),
        (
            datetime(2026, 8, 7, 11, 0, tzinfo=timezone(timedelta(hours=2))),
            "2026-08-07T09:00:00+00:00",
        ),
        (
            datetime(2026, 8, 7, 5, 0, tzinfo=ZoneInfo("America/New_York")),
            "2026-08-07T09:00:00+00:00",
        ),
        (datetime(2026, 8, 7, 9, 0, 0, 999_999, tzinfo=UTC), "2026-08-07T09:00:00+00:00"),
        # DST edge: 01:30 happens twice in New York on 2026-11-01; fold picks the second (EST).
        (
            datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")),
            "2026-11-01T06:30:00+00:00",
        ),
    ],
)
def test_id_follows_the_recipe_in_utc(scheduled_at: datetime, encoded: str) -> None:
    expected = recipe(f"job|subject|{encoded}|v2")
    assert stable_run_id("job", "subject", scheduled_at, "v2") == expected
    assert RunIdentity(" job ", "subject\t", scheduled_at, " v2").run_id == expected


def test_identity_is_normalised_and_frozen() -> None:
    ident = RunIdentity(
        " job ",
        " subject ",
        datetime(2026, 8, 7, 11, 0, 5, 42, tzinfo=timezone(timedelta(hours=2))),
        "v1 ",
    )
    assert (ident.job_name, ident.subject_id, ident.version) == ("job", "subject", "v1")
    assert ident.scheduled_at == datetime(2026, 8, 7, 9, 0, 5, tzinfo=UTC)
    assert ident.scheduled_at.utcoffset() == timedelta(0)
    assert ident == RunIdentity("job", "subject", datetime(2026, 8, 7, 9, 0, 5, tzinfo=UTC), "v1")
    with pytest.raises(AttributeError):
        ident.job_name = "other"  # type: ignore[misc]


def test_different_fields_give_different_ids() -> None:
    base = stable_run_id("job", "subject", NINE_UTC, "v1")
    assert base != stable_run_id("job", "subject", NINE_UTC, "v2")
    assert base != stable_run_id("job", "subject-2", NINE_UTC, "v1")
    assert base != stable_run_id("job", "subject", NINE_UTC + timedelta(seconds=1), "v1")
    assert stable_run_id("jöb", "客户", NINE_UTC, "v1") == recipe(
        "jöb|客户|2026-08-07T09:00:00+00:00|v1"
    )


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"job_name": "  "}, "job_name", "empty"),
        ({"subject_id": ""}, "subject_id", "empty"),
        ({"version": "v|1"}, "version", "'|'"),
        ({"subject_id": "acme|eu"}, "subject_id", "'|'"),
        ({"job_name": "job\nname"}, "job_name", "control"),
        ({"subject_id": "acme\x00"}, "subject_id", "control"),
        ({"version": "v\u200b1"}, "version", "control"),
        ({"subject_id": "x" * 513}, "subject_id", "at most"),
        ({"job_name": 7}, "job_name", "string"),
        ({"scheduled_at": datetime(2026, 8, 7, 9, 0)}, "scheduled_at", "timezone-aware"),
        ({"scheduled_at": "2026-08-07T09:00:00Z"}, "scheduled_at", "datetime"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(
    kwargs: dict[str, object], field: str, reason: str
) -> None:
    args: dict[str, object] = {
        "job_name": "job",
        "subject_id": "subject",
        "scheduled_at": NINE_UTC,
        "version": "v1",
    }
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        stable_run_id(**args)  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidInputError)
    assert info.value.field == field
    assert reason in str(info.value)
    assert str(info.value).startswith(f"{field}: ")
