"""An IO manager that needs nothing but the ledger: what one op hands the next, in PostgreSQL.

Under an executor whose steps share no storage (Kubernetes' ``k8s_job_executor`` runs each op in
a pod of its own), Dagster's default IO manager writes a step's output to a local folder the
next pod never sees. The ops of an idempotent job hand each other only a small ``Ticket`` (the
raw input and, once ``transform`` has it, the paid answer are in the ledger anyway), so the ledger
can carry it too: ``ledger_io_manager`` stores it as JSON in ``step_outputs``, keyed by the
Dagster run, step and output that produced it, so a later step, a run retry or a re-execution
from failure in any process loads it. Use it under the key its job's ops write with
(``io_manager`` by default):

    resources={"ledger": RunLedgerResource(...), "io_manager": ledger_io_manager, ...}
"""

import dagster as dg

from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.dagster.ticket import Ticket, ticket_from_json, ticket_to_json


class LedgerIOManager(dg.IOManager):
    """Stores the ``Ticket`` a step returns in the run ledger's ``step_outputs`` table, and
    loads it for the step that takes it; ``None`` (an op with no output) is not stored."""

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if obj is None:
            return
        if not isinstance(obj, Ticket):
            raise TypeError(
                f"the ledger IO manager carries the Tickets of idempotent jobs only; step "
                f"{context.step_key} returned a {type(obj).__name__}"
            )
        ledger: RunLedger = context.resources.ledger
        ledger.store_step_output(
            context.run_id, context.step_key, context.name, ticket_to_json(obj)
        )

    def load_input(self, context: dg.InputContext) -> Ticket:
        upstream = context.upstream_output
        if upstream is None or upstream.run_id is None:
            raise dg.DagsterInvariantViolationError(
                f"input {context.name} has no upstream output to load from the ledger"
            )
        ledger: RunLedger = context.resources.ledger
        value = ledger.load_step_output(upstream.run_id, upstream.step_key, upstream.name)
        if value is None:
            raise dg.DagsterInvariantViolationError(
                f"no stored output {upstream.name} of step {upstream.step_key} in Dagster run "
                f"{upstream.run_id}: was the job run with the ledger IO manager?"
            )
        return ticket_from_json(value)


@dg.io_manager(
    required_resource_keys={"ledger"},
    description="What each op of an idempotent job hands the next, kept in the run ledger",
)
def ledger_io_manager(init_context: dg.InitResourceContext) -> LedgerIOManager:
    return LedgerIOManager()
