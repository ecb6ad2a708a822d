"""The demo: one logical run executed twice with a model that answers differently each time.

It prints the single stored run, its attempts and its single outbox row. Run it again later and
both calls reuse the result stored the first time: the ledger is durable.
"""

import json
from datetime import UTC, datetime
from typing import Any

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.protocol import RunOutcome, run_idempotent
from idempotent_jobs.core.testing import ScriptedModel

DEMO_IDENTITY = RunIdentity(
    job_name="competitor-summary",
    subject_id="workspace-acme",
    scheduled_at=datetime(2026, 8, 7, 9, 0, tzinfo=UTC),
    version="v1",
)


def _collect(identity: RunIdentity) -> dict[str, Any]:
    return {
        "subject": identity.subject_id,
        "documents": [
            "Globex cut its enterprise price by 15% and launched a usage-based tier.",
            "Initech shipped an on-premise connector for SAP.",
        ],
    }


def _notifications(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"email-ops@acme.example": {"subject": "Competitor summary", "body": output["summary"]}}


def _say(call: int, outcome: RunOutcome) -> str:
    did = "ran the model" if outcome.executed else "reused the stored result (no model call)"
    return f"call {call}: {did}; status={outcome.status}; output={json.dumps(outcome.output)}"


def run_demo(ledger: RunLedger, admin: LedgerAdmin, print_line: Any = print) -> None:
    """Run the demo as a worker of ``ledger`` (migrated) and print what its operator face,
    ``admin``, reads there."""
    identity = DEMO_IDENTITY
    model = ScriptedModel(
        [
            {"summary": "Globex cut prices 15%; Initech targets SAP shops."},
            {"summary": "Two competitors moved: a price cut and an SAP connector."},
        ]
    )
    print_line(
        f"identity: {identity.job_name} / {identity.subject_id} / "
        f"{identity.scheduled_at.isoformat()} / {identity.version}"
    )
    print_line(f"run id:   {identity.run_id}")
    for call in (1, 2):
        outcome = run_idempotent(
            ledger, identity, collect=_collect, transform=model, notifications=_notifications
        )
        print_line(_say(call, outcome))
    print_line(f"model calls in this demo: {model.calls}")

    record = admin.get(identity.run_id)
    assert record is not None
    print_line("")
    print_line("stored run (one row):")
    print_line(
        f"  status={record.status} epoch={record.lease_epoch} attempts={record.attempts} "
        f"completed_at={record.completed_at}"
    )
    print_line(f"  output={json.dumps(record.output)}")
    print_line("attempts:")
    for attempt in admin.attempts(identity.run_id):
        print_line(
            f"  epoch={attempt.lease_epoch} worker={attempt.worker_id} outcome={attempt.outcome}"
        )
    delivered = ledger.deliver_outbox(lambda row: None, run_id=identity.run_id)
    print_line(f"outbox (delivered now: {len(delivered.delivered)}):")
    for row in admin.outbox(identity.run_id):
        print_line(
            f"  key={row.idempotency_key} delivered_at={row.delivered_at} "
            f"payload={json.dumps(row.payload)}"
        )
