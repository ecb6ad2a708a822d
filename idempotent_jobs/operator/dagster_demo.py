"""The Dagster half of the demo: the competitor_summary job, a few partitions, executed twice."""

from collections.abc import Callable
from typing import Any

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.dagster.partitions import partition_key
from idempotent_jobs.dagster.resources import JsonLinesChannel
from idempotent_jobs.dagster.results import output_metadata
from idempotent_jobs.operator.code_location import load_location
from idempotent_jobs.operator.location_targets import Target

#: The sample code location, loaded as any user's is: the operator never imports it.
SAMPLE_LOCATION = "idempotent_jobs.location.definitions"
DEMO_JOB = "competitor_summary"
DEMO_DAYS = ("2026-08-05", "2026-08-06")


QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_dagster_demo(admin: LedgerAdmin, print_line: Callable[[str], Any] = print) -> None:
    """Execute each demo partition twice in process; print what the ledger holds for each."""
    location = load_location(Target(module=SAMPLE_LOCATION, found_in="the sample"))
    spec = next(s for s in location.specs if s.name == DEMO_JOB)
    job = location.defs.resolve_job_def(spec.name)
    channel = JsonLinesChannel()
    notifications = channel.target()
    resources = {"report_file": channel}
    print_line(f"Dagster job {job.name}: each partition executed twice (in process)")
    for key in [partition_key(subject, day) for subject in spec.subjects for day in DEMO_DAYS]:
        results = [
            output_metadata(
                job.execute_in_process(
                    partition_key=key, resources=resources, run_config=QUIET, raise_on_error=True
                )
            )["persist"]["result"]
            for _ in range(2)
        ]
        run_id = spec.identity_for(key).run_id
        record = admin.get(run_id)
        assert record is not None
        attempts = admin.attempts(run_id)
        outbox = admin.outbox(run_id)
        delivered = sum(1 for row in outbox if row.delivered_at is not None)
        summary = (record.output or {}).get("summary", "")
        print_line(
            f"  {key:<28} runs: {' / '.join(results):<15} status={record.status} "
            f"attempts={len(attempts)} outbox={len(outbox)} delivered={delivered}"
        )
        print_line(f"    accepted: {summary[:90]}{'...' if len(summary) > 90 else ''}")
    print_line(f"notifications written to {notifications}")
