"""The jobs of this code location: a daily competitor summary and an hourly digest."""

from pathlib import Path

import dagster as dg

from idempotent_jobs.core.retention import RetentionPolicy
from idempotent_jobs.dagster.job_spec import IdempotentJobSpec
from idempotent_jobs.dagster.partitions import load_subjects

SUBJECTS_FILE = Path(__file__).parent / "config" / "subjects.yaml"

COMPETITOR_SUMMARY = IdempotentJobSpec(
    name="competitor_summary",
    identity_job_name="competitor-summary",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-08-01"),
    subjects=load_subjects("competitor_summary", SUBJECTS_FILE),
    prompt="Summarise what competitors did in this period, in at most three sentences.",
    description="Daily summary of competitor moves per workspace.",
    # The run rows stay forever (they make a rerun a no-op); the bulk goes after these times.
    retention=RetentionPolicy.of_days(raw_input=30, output=365, attempts=90, delivered_payloads=30),
)

HOURLY_DIGEST = IdempotentJobSpec(
    name="hourly_digest",
    identity_job_name="hourly-digest",
    version="v1",
    window=dg.HourlyPartitionsDefinition(start_date="2026-11-01-00:00"),
    subjects=load_subjects("hourly_digest", SUBJECTS_FILE),
    prompt="Give a one-sentence digest of the documents of this hour.",
    description="Hourly one-line digest per workspace.",
    retention=RetentionPolicy.of_days(raw_input=7, output=90, attempts=30, delivered_payloads=7),
)

JOB_SPECS = (COMPETITOR_SUMMARY, HOURLY_DIGEST)
