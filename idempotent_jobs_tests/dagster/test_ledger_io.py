"""The ledger IO manager's store: tickets as JSON (every field back, nothing pickled), and
retention: what the steps of a completed run handed each other goes with its attempt rows."""

from dataclasses import replace

import psycopg

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.records import Basis, CallOrigin, JobConfig, ModelUsage
from idempotent_jobs.core.retention import RetentionPolicy, prune
from idempotent_jobs.core.steps import BoundAnswer
from idempotent_jobs.dagster.ticket import StepResult, Ticket, ticket_from_json, ticket_to_json
from idempotent_jobs_tests.helpers import backdate, claimed, identity
from idempotent_jobs_tests.ledgers import HarnessLedger


def _ticket(ledger: HarnessLedger) -> Ticket:
    ident = identity("io")
    lease = ledger.checkpoint(claimed(ledger, ident), {"documents": ["d"]})
    lease = replace(lease, budgeted=False)  # known at the claim: the next step need not ask
    answer = BoundAnswer(
        output={"summary": "s", "nested": {"n": [1, 2.5, None, "ü"]}},
        usage=ModelUsage(
            "m", 10, 5, cache_read_tokens=4, reasoning_tokens=2, provider_name="openai"
        ),
        basis=lease.basis,
        config=JobConfig.of(prompt="p", model="m", validator="v"),
        origin=CallOrigin(caller_step="transform", caller_run_id="dagster-run", retry_number=1),
    )
    return Ticket.under(lease, "dagster-run", StepResult.MODEL_CALLED, answer)


def test_a_ticket_survives_the_round_trip_through_the_ledger(ledger: HarnessLedger) -> None:
    ticket = _ticket(ledger)
    ledger.store_step_output("dagster-run", "transform", "result", ticket_to_json(ticket))
    stored = ledger.load_step_output("dagster-run", "transform", "result")
    assert stored is not None and ticket_from_json(stored) == ticket
    assert ticket.lease is not None and ticket.answer is not None
    basis = Basis(revision=0, input_fingerprint=ticket.lease.input_fingerprint)
    assert ticket.answer.basis == basis and basis.input_fingerprint is not None
    assert ledger.load_step_output("dagster-run", "persist", "result") is None


def test_retention_prunes_the_hand_overs_of_completed_runs_with_their_attempts(
    ledger: HarnessLedger, operator: LedgerAdmin, db: psycopg.Connection
) -> None:
    ticket = _ticket(ledger)
    for step in ("collect", "transform"):
        ledger.store_step_output("dagster-run", step, "result", ticket_to_json(ticket))
    assert ticket.lease is not None and ticket.answer is not None
    ledger.complete(ticket.lease, ticket.answer.output)
    policy = RetentionPolicy.of_days(attempts=30)
    assert prune(operator, "competitor-summary", policy, apply=True).rows == 0
    db.execute("UPDATE idempotent_jobs.step_outputs SET created_at = now() - interval '40 days'")
    backdate(db, ticket.run_id, 40)
    # A dry run counts every one, however small the batches; the apply prunes them all.
    dry = prune(operator, "competitor-summary", policy, batch_size=1)
    assert dry.parts["attempts"].rows == 3  # the attempt row and the two hand-overs
    assert ledger.load_step_output("dagster-run", "transform", "result") is not None
    applied = prune(operator, "competitor-summary", policy, apply=True, batch_size=1)
    assert applied.parts["attempts"].rows == 3
    for step in ("collect", "transform"):
        assert ledger.load_step_output("dagster-run", step, "result") is None
