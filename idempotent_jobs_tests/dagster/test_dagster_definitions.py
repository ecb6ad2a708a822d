"""The code location loads, and its schedules pass partition keys (never wall-clock time)."""

from datetime import UTC, datetime

import dagster as dg
import pytest

from idempotent_jobs import InvalidInputError, RunIdentity
from idempotent_jobs.dagster.partitions import load_subjects
from idempotent_jobs.location.definitions import defs
from idempotent_jobs.location.jobs import COMPETITOR_SUMMARY, HOURLY_DIGEST, SUBJECTS_FILE


def test_definitions_load_with_both_jobs_and_schedules() -> None:
    assert dg.Definitions.validate_loadable(defs) is None
    for name in ("competitor_summary", "hourly_digest"):
        job = defs.resolve_job_def(name)
        assert {n.name for n in job.nodes} == {"collect", "transform", "persist", "deliver"}
        assert isinstance(job.partitions_def, dg.MultiPartitionsDefinition)
        assert defs.resolve_schedule_def(f"{name}_schedule").job_name == name


@pytest.mark.parametrize(
    ("spec", "tick", "window_key", "window_start"),
    [
        (
            COMPETITOR_SUMMARY,
            datetime(2026, 8, 8, 0, 0, tzinfo=UTC),
            "2026-08-07",
            datetime(2026, 8, 7, tzinfo=UTC),
        ),
        (
            HOURLY_DIGEST,
            datetime(2026, 11, 3, 15, 0, tzinfo=UTC),
            "2026-11-03-14:00",
            datetime(2026, 11, 3, 14, tzinfo=UTC),
        ),
    ],
)
def test_a_tick_requests_the_last_window_for_every_subject_with_run_keys(
    spec: object, tick: datetime, window_key: str, window_start: datetime
) -> None:
    schedule = defs.resolve_schedule_def(f"{spec.name}_schedule")  # type: ignore[attr-defined]
    with dg.instance_for_test() as instance:
        result = schedule.evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=tick)
        )
    requests = result.run_requests or []
    expected = [f"{subject}|{window_key}" for subject in spec.subjects]  # type: ignore[attr-defined]
    assert sorted(str(r.partition_key) for r in requests) == sorted(expected)
    assert sorted(str(r.run_key) for r in requests) == sorted(expected)
    for request in requests:
        ident = spec.identity_for(request.partition_key)  # type: ignore[attr-defined]
        assert ident.scheduled_at == window_start
        assert ident == RunIdentity(
            spec.identity_job_name,  # type: ignore[attr-defined]
            str(request.partition_key).split("|")[0],
            window_start,
            "v1",
        )


def test_the_same_tick_twice_gives_the_same_run_keys() -> None:
    schedule = defs.resolve_schedule_def("competitor_summary_schedule")
    tick = datetime(2026, 9, 1, 0, 0, 30, tzinfo=UTC)
    keys = []
    for _ in range(2):
        with dg.instance_for_test() as instance:
            result = schedule.evaluate_tick(
                dg.build_schedule_context(instance=instance, scheduled_execution_time=tick)
            )
        keys.append(sorted(str(r.run_key) for r in result.run_requests or []))
    assert keys[0] == keys[1] and len(keys[0]) == len(COMPETITOR_SUMMARY.subjects)


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("workspace-acme", "is not '<subject>|<window>'"),
        ("workspace-acme|2026-08-07|x", "is not '<subject>|<window>'"),
        ("workspace-nobody|2026-08-07", "is not configured"),
        ("workspace-acme|2026-02-30", "is not a key"),
        ("workspace-acme|2020-01-01", "before the partitions' first window"),
    ],
)
def test_malformed_partition_keys_are_refused(key: str, reason: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        COMPETITOR_SUMMARY.identity_for(key)
    assert info.value.field == "partition_key" and reason in str(info.value)


def test_subjects_come_from_configuration(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "subjects.yaml"  # type: ignore[operator]
    config.write_text("competitor_summary: [tenant-a, ' tenant-b ']\n")
    monkeypatch.setenv("IDEMPOTENT_JOBS_SUBJECTS_FILE", str(config))
    assert load_subjects("competitor_summary", SUBJECTS_FILE) == ["tenant-a", "tenant-b"]
    config.write_text("competitor_summary: [tenant-a, 'bad|name']\n")
    with pytest.raises(InvalidInputError, match="subject_id"):
        load_subjects("competitor_summary", SUBJECTS_FILE)
    with pytest.raises(InvalidInputError, match="lists no subjects"):
        load_subjects("unknown_job", SUBJECTS_FILE)
