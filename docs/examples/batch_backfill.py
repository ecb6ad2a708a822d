"""A backfill through the batch lane, end to end, as docs/batch.md shows it.

    python docs/examples/batch_backfill.py     # needs IDEMPOTENT_JOBS_DATABASE_URL (a ledger)

A job labels support tickets per team and day. Its batch job is launched with a range (two
days of three teams), its sensor is ticked until the batch is collected and asks for a run of
each partition, those runs deliver the notifications, and the operator's commands show the
batch. The provider is a local fake of OpenAI's Batch API (the tests'), so
nothing is paid; point the model step's ``base_url`` at OpenAI to run it for real.
"""

import os
import sys
from pathlib import Path
from typing import Any

import dagster as dg

from idempotent_jobs import LedgerAdmin, RunIdentity
from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.dagster import (
    IdempotentJobSpec,
    OpenAICompatibleModel,
    RunLedgerResource,
    build_batch_lane,
    build_idempotent_job,
)
from idempotent_jobs.dagster.resources import Collector, JsonLinesChannel
from idempotent_jobs.operator.cli import main as cli

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["bug", "billing", "question"]}},
    "required": ["label"],
}


class Tickets(Collector):
    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        day = identity.scheduled_at.date().isoformat()
        return {"tickets": [f"{identity.subject_id} ticket of {day}: the invoice is wrong"]}


def has_label(output: dict[str, Any]) -> bool:
    return output.get("label") in ("bug", "billing", "question")


SPEC = IdempotentJobSpec(
    name="ticket_labels",
    identity_job_name="ticket-labels",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01", end_date="2026-12-01"),
    subjects=["emea", "amer", "apac"],
    prompt="Label the tickets: bug, billing or question.",
    validate=has_label,
)
JOB, SCHEDULE = build_idempotent_job(SPEC)
BATCH_JOB, BATCH_SENSOR = build_batch_lane(SPEC)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's testkit
    from testkit.fake_providers import Answer, FakeProviders

    notes = str(Path(os.environ.get("IDEMPOTENT_JOBS_HOME", ".")) / "batch_backfill.jsonl")
    Path(notes).unlink(missing_ok=True)
    with FakeProviders(default=lambda request: Answer('{"label": "billing"}', 412, 6)) as fake:
        fake.batches.polls_to_complete = 1  # still in progress at the first poll
        resources = {
            "ledger": RunLedgerResource(database_url=dg.EnvVar(DATABASE_URL_ENV)),
            "collector": Tickets(),
            "model": OpenAICompatibleModel(
                model="gpt-4o-mini",
                api_key="sk-local-fake",
                base_url=fake.openai_url,
                output_schema="batch_backfill:LABEL",
            ),
            "report_file": JsonLinesChannel(path=notes),
        }
        defs = dg.Definitions(jobs=[JOB, BATCH_JOB], sensors=[BATCH_SENSOR], resources=resources)
        with LedgerAdmin(os.environ[DATABASE_URL_ENV]) as admin:
            admin.set_price("gpt-4o-mini", "0.15", "0.60")
            admin.set_price("gpt-4o-mini", "0.075", "0.30", tier="batch")
        range_ = {"start": "2026-11-01", "end": "2026-11-02"}
        opened = defs.resolve_job_def("ticket_labels_batch").execute_in_process(
            run_config={"ops": {"open_batch": {"config": range_}}}
        )
        [step] = [e for e in opened.all_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = step.event_specific_data.metadata  # type: ignore[union-attr]
        print("$ (launchpad) ticket_labels_batch with", range_)
        for key in ("batch_id", "state", "partitions", "runs_in_batch", "skipped"):
            print(f"  {key}: {metadata[key].value}")
        requested: list[dg.RunRequest] = []
        for tick in range(1, 4):
            with dg.build_sensor_context(resources=resources, definitions=defs) as context:
                result = BATCH_SENSOR.evaluate_tick(context)
            requested = list(result.run_requests or [])
            if requested:  # the tick that collected the batch asks for a run per partition
                print(f"sensor tick {tick}: batch collected; {len(requested)} runs requested")
                break
            print(f"sensor tick {tick}: {result.skip_message}")
        job = defs.resolve_job_def("ticket_labels")
        ran = [
            job.execute_in_process(partition_key=r.partition_key, tags=dict(r.tags)).success
            for r in requested
        ]
        delivered = len(Path(notes).read_text().splitlines())
        print(
            f"requested runs: {sum(ran)} of {len(ran)} succeeded, {delivered} notifications "
            f"delivered ({len(fake.requests)} model requests in all, every one in the batch)"
        )
    for argv in (["batches", "list"], ["batches", "show", str(metadata["batch_id"].value)]):
        print(f"\n$ idempotent-jobs {' '.join(argv[:2])}{' <batch>' if len(argv) > 2 else ''}")
        cli(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
