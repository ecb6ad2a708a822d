"""The run ledger's worker face: durable run records in their own PostgreSQL schema, usable
without Dagster. PostgreSQL is the only authority: uniqueness is a constraint, the lease one atomic
UPDATE on the database clock, and every write after a claim fenced by owner and epoch (the
statements: the ``-- faces: worker`` ones of the stores' files, ``sql/<store>.sql``). Each method
is one statement on an autocommit connection, so one round trip and one transaction, safe to retry
when the connection drops.
"""

from idempotent_jobs.core.face import LedgerFace, MovedMethod, of_store, operator_method
from idempotent_jobs.core.stores.attempts import AttemptsStore
from idempotent_jobs.core.stores.batches import BatchesStore
from idempotent_jobs.core.stores.budgets import BudgetsStore
from idempotent_jobs.core.stores.calls import CallsStore
from idempotent_jobs.core.stores.drills import DrillsStore
from idempotent_jobs.core.stores.limits import LimitsStore
from idempotent_jobs.core.stores.outbox import OutboxStore
from idempotent_jobs.core.stores.prices import PricesStore
from idempotent_jobs.core.stores.runs import RunsStore
from idempotent_jobs.core.stores.shadows import ShadowsStore
from idempotent_jobs.core.stores.step_outputs import StepOutputsStore


class RunLedger(LedgerFace):
    """The ledger's worker face: durable run records, fenced leases, checkpoint, commit, outbox.

    ``RunLedger(conninfo, **settings)`` or ``RunLedger(LedgerSettings(...))`` (see
    :class:`~idempotent_jobs.core.settings.LedgerSettings` and
    :class:`~idempotent_jobs.core.face.LedgerFace`). In Dagster, the
    :class:`~idempotent_jobs.dagster.resource.RunLedgerResource` creates one per run. What an
    operator does (listings, revise, drills, prices, migrate, retention) is the other face,
    :class:`~idempotent_jobs.core.admin.LedgerAdmin`.
    """

    face = "worker"

    # Asked of a worker face, these say where they went (no __getattr__: see MovedMethod).
    migrate = operator_method("migrate")
    upgrade = operator_method("upgrade")
    missing_privileges = operator_method("missing_privileges")
    arm_drill = operator_method("arm_drill")
    disarm_drills = operator_method("disarm_drills")
    attempts = operator_method("attempts")
    outbox = operator_method("outbox")
    revisions = operator_method("revisions")
    revise = operator_method("revise")
    register = MovedMethod("was removed in 0.2: begin registers and claims in one statement")
    save_raw_input = MovedMethod(
        "was removed in 0.2: checkpoint(lease, raw_input).stored_raw_input is the stored value"
    )

    # -- runs --------------------------------------------------------------------------------------
    begin = of_store("runs", RunsStore.begin)
    claim = of_store("runs", RunsStore.claim)
    renew = of_store("runs", RunsStore.renew)
    input_payload = of_store("runs", RunsStore.input_payload)
    checkpoint = of_store("runs", RunsStore.checkpoint)
    release = of_store("runs", RunsStore.release)
    get = of_store("runs", RunsStore.get)

    # -- attempts ----------------------------------------------------------------------------------
    complete = of_store("attempts", AttemptsStore.complete)
    fail = of_store("attempts", AttemptsStore.fail)
    end_caller_attempt = of_store("attempts", AttemptsStore.end_caller_attempt)

    # -- calls -------------------------------------------------------------------------------------
    output_payload = of_store("calls", CallsStore.output_payload)
    admit_request = of_store("calls", CallsStore.admit_request)
    record_answer = of_store("calls", CallsStore.record_answer)
    recorded_answer = of_store("calls", CallsStore.recorded_answer)
    record_lost_call = of_store("calls", CallsStore.record_lost_call)
    record_turn = of_store("calls", CallsStore.record_turn)
    model_calls = of_store("calls", CallsStore.model_calls)

    # -- prices ------------------------------------------------------------------------------------
    currency = of_store("prices", PricesStore.currency)

    # -- budgets -----------------------------------------------------------------------------------
    declare_budgets = of_store("budgets", BudgetsStore.declare_budgets)
    reserve_budget = of_store("budgets", BudgetsStore.reserve_budget)
    release_budget = of_store("budgets", BudgetsStore.release_budget)

    # -- limits ------------------------------------------------------------------------------------
    rate_limit_rows = of_store("limits", LimitsStore.rate_limit_rows)
    declare_rate_limit = of_store("limits", LimitsStore.declare_rate_limit)
    declare_rate_limits = of_store("limits", LimitsStore.declare_rate_limits)
    acquire_rate = of_store("limits", LimitsStore.acquire_rate)
    known_rate_limits = of_store("limits", LimitsStore.known)
    forget_rate_limits = of_store("limits", LimitsStore.forget)

    # -- drills ------------------------------------------------------------------------------------
    take_drill = of_store("drills", DrillsStore.take_drill)

    # -- outbox ------------------------------------------------------------------------------------
    deliver_outbox = of_store("outbox", OutboxStore.deliver_outbox)

    # -- shadows -----------------------------------------------------------------------------------
    shadow = of_store("shadows", ShadowsStore.shadow)
    shadow_items = of_store("shadows", ShadowsStore.shadow_items)
    shadow_gate = of_store("shadows", ShadowsStore.shadow_gate)
    claim_shadow = of_store("shadows", ShadowsStore.claim_shadow)
    renew_shadow = of_store("shadows", ShadowsStore.renew_shadow)
    release_shadow = of_store("shadows", ShadowsStore.release_shadow)
    shadow_to = of_store("shadows", ShadowsStore.shadow_to)
    shadow_start_submit = of_store("shadows", ShadowsStore.shadow_start_submit)
    admit_shadow_item = of_store("shadows", ShadowsStore.admit_shadow_item)
    record_shadow_call = of_store("shadows", ShadowsStore.record_shadow_call)
    end_shadow_item = of_store("shadows", ShadowsStore.end_shadow_item)
    judge_shadow_item = of_store("shadows", ShadowsStore.judge_shadow_item)
    mark_item_promoted = of_store("shadows", ShadowsStore.mark_item_promoted)

    # -- step outputs ------------------------------------------------------------------------------
    store_step_output = of_store("step_outputs", StepOutputsStore.store_step_output)
    load_step_output = of_store("step_outputs", StepOutputsStore.load_step_output)

    # -- batches -----------------------------------------------------------------------------------
    open_batch = of_store("batches", BatchesStore.open_batch)
    add_batch_items = of_store("batches", BatchesStore.add_batch_items)
    claim_batch = of_store("batches", BatchesStore.claim_batch)
    renew_batch = of_store("batches", BatchesStore.renew_batch)
    start_submit = of_store("batches", BatchesStore.start_submit)
    record_submitted = of_store("batches", BatchesStore.record_submitted)
    record_duplicate = of_store("batches", BatchesStore.record_duplicate)
    record_batch_status = of_store("batches", BatchesStore.record_batch_status)
    fail_batch_intent = of_store("batches", BatchesStore.fail_batch_intent)
    batch_cancel_sent = of_store("batches", BatchesStore.batch_cancel_sent)
    batch_items = of_store("batches", BatchesStore.batch_items)
    end_batch_item = of_store("batches", BatchesStore.end_batch_item)
    batch_item_paid = of_store("batches", BatchesStore.batch_item_paid)
    recorded_provider_batches = of_store("batches", BatchesStore.recorded_provider_batches)
    give_back_strays = of_store("batches", BatchesStore.give_back_strays)
    discard_batch_intent = of_store("batches", BatchesStore.discard_batch_intent)
    end_batch_step = of_store("batches", BatchesStore.end_batch_step)
    release_batch = of_store("batches", BatchesStore.release_batch)
    finish_batch = of_store("batches", BatchesStore.finish_batch)
    batch_row = of_store("batches", BatchesStore.batch_row)
    last_collected = of_store("batches", BatchesStore.last_collected)
    collected_runs = of_store("batches", BatchesStore.collected_runs)
    open_batches = of_store("batches", BatchesStore.open_batches)


__all__ = ["RunLedger"]
