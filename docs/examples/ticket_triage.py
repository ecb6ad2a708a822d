"""Ticket triage, an idempotent AI job written against the installed package only.

Every day and for each queue: collect the open tickets, label each one with the model, check the
labels, and post them to a webhook once. Launch the same partition twice, backfill it, re-execute
it: one model call, one webhook post per queue and day.
"""

import json
import urllib.request
from typing import Any
from urllib.parse import urlencode

import dagster as dg

from idempotent_jobs import ModelAnswer, ModelUsage, RunIdentity, TokenBudget
from idempotent_jobs.dagster import (
    Collector,
    IdempotentJobSpec,
    ModelStep,
    RunLedgerResource,
    StepContext,
    WebhookChannel,
    build_idempotent_job,
)

LABELS = ("bug", "billing", "question")


class OpenTickets(Collector):
    """The queue's tickets opened in the window, from a helpdesk's JSON API."""

    url: str

    def collect(self, identity: RunIdentity) -> dict[str, Any]:
        query = urlencode({"queue": identity.subject_id, "day": identity.scheduled_at.date()})
        with urllib.request.urlopen(f"{self.url}?{query}", timeout=20) as answer:  # noqa: S310
            return {"tickets": json.load(answer)}


class KeywordTriage(ModelStep):
    """Stands in for an LLM call: any ModelStep whose generate() returns a ModelAnswer works."""

    @property
    def model_name(self) -> str:
        return "keyword-triage"

    def generate(self, raw_input: dict[str, Any], context: StepContext) -> ModelAnswer:
        def label(text: str) -> str:
            lowered = text.lower()
            return (
                "bug" if "error" in lowered else "billing" if "invoice" in lowered else "question"
            )

        labels = {str(t["id"]): label(t["text"]) for t in raw_input["tickets"]}
        return ModelAnswer(
            {"labels": labels}, ModelUsage(self.model_name, len(labels), len(labels))
        )


def known_labels(output: dict[str, Any]) -> bool:
    labels = output.get("labels")
    return isinstance(labels, dict) and all(value in LABELS for value in labels.values())


def triage_payload(identity: RunIdentity, output: dict[str, Any]) -> dict[str, Any]:
    return {"queue": identity.subject_id, "day": str(identity.scheduled_at.date()), **output}


TRIAGE = IdempotentJobSpec(
    name="ticket_triage",
    identity_job_name="ticket-triage",
    version="v1",
    window=dg.DailyPartitionsDefinition(start_date="2026-11-01"),
    subjects=["support", "sales"],
    prompt="Label each ticket as bug, billing or question.",
    collector="open_tickets",
    model="triage_model",
    validate=known_labels,
    payload=triage_payload,
    channels=("triage_webhook",),
    # Decided in the ledger for every worker: a call that would start once a limit is spent
    # fails its step at once (no retry), with the spend and the budget as metadata.
    budget=TokenBudget(tokens_per_day=2_000_000, tokens_per_subject_per_day=500_000),
)

triage_job, triage_schedule = build_idempotent_job(TRIAGE)

defs = dg.Definitions(
    jobs=[triage_job],
    schedules=[triage_schedule],
    resources={
        "ledger": RunLedgerResource(database_url=dg.EnvVar("IDEMPOTENT_JOBS_DATABASE_URL")),
        "open_tickets": OpenTickets(url=dg.EnvVar("HELPDESK_TICKETS_URL")),
        "triage_model": KeywordTriage(),
        "triage_webhook": WebhookChannel(url=dg.EnvVar("TRIAGE_WEBHOOK_URL")),
    },
)
