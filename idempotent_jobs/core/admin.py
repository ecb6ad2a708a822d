"""The ledger's operator face: what operators, ``doctor``, the CLI and the Dagster admin jobs
(reconciliation, retention) do with a ledger.

Listings and reads (which the reader role can run), revisions, failure drills armed and ended,
migrate and upgrade, privileges, prices and spend, and retention's batches. Its statements are
the ``-- faces: admin`` ones of the stores' files (``sql/<store>.sql``), and only those; the
worker's path (claim, checkpoint, commit, fail, deliver) is the other
face, :class:`~idempotent_jobs.core.ledger.RunLedger`.
"""

from idempotent_jobs.core.face import LedgerFace, of_store
from idempotent_jobs.core.privilege_checks import RoleAbilities
from idempotent_jobs.core.schema import AppliedMigration
from idempotent_jobs.core.stores.attempts import AttemptsStore
from idempotent_jobs.core.stores.batches import BatchesStore
from idempotent_jobs.core.stores.budgets import BudgetsStore
from idempotent_jobs.core.stores.calls import CallsStore
from idempotent_jobs.core.stores.drills import DrillsStore
from idempotent_jobs.core.stores.limits import LimitsStore
from idempotent_jobs.core.stores.outbox import OutboxStore
from idempotent_jobs.core.stores.prices import PricesStore
from idempotent_jobs.core.stores.retention import RetentionStore
from idempotent_jobs.core.stores.revisions import RevisionsStore
from idempotent_jobs.core.stores.runs import RunsStore
from idempotent_jobs.core.stores.shadows import ShadowsStore
from idempotent_jobs.core.stores.step_outputs import StepOutputsStore
from idempotent_jobs.core.upgrade import MigrationReport


class LedgerAdmin(LedgerFace):
    """The operator face of a ledger: ``LedgerAdmin(conninfo, **settings)`` or
    ``LedgerAdmin(LedgerSettings(...))`` (see :class:`~idempotent_jobs.core.face.LedgerFace`).
    ``LedgerAdmin.beside(ledger)`` is one with a worker face's settings (its own pool)."""

    face = "admin"

    @classmethod
    def beside(cls, ledger: LedgerFace) -> "LedgerAdmin":
        """The operator face of the ledger ``ledger`` reaches (the same settings, a pool of its
        own, opened on first use: close it, or use a ``with`` block)."""
        return cls(ledger.settings)

    def migrate(self) -> list[str]:
        """Apply missing migrations and the upgrade steps (idempotent, serialised by an advisory
        lock); return the migrations applied now. :meth:`upgrade` says what else it did."""
        return self._db.migrate().applied

    def upgrade(self, split_roles: bool = False) -> MigrationReport:
        """:meth:`migrate`, returning its whole report: the migrations applied, what was done
        besides (identities normalised, grants) and what an operator should look at.
        ``split_roles``: from now on the worker role only reads prices, budgets and limits,
        which the operator role sets (:mod:`idempotent_jobs.core.grants`)."""
        return self._db.migrate(split_roles)

    def role_abilities(self) -> RoleAbilities:
        """The connected role, the ledger's group roles it belongs to and what it may do."""
        return self._db.abilities()

    def missing_privileges(self) -> tuple[str, list[str]]:
        """The connected role's name, and what it lacks of the privileges workers need
        (``PRIVILEGE on schema.table``; empty when it has them all)."""
        return self._db.privileges()

    def migrations_ahead(self) -> list[AppliedMigration]:
        """The applied migrations this code does not ship (a later release's: the mixed window
        of a rolling upgrade, while workers of this release still run)."""
        return self._db.migrations_ahead()

    # -- runs --------------------------------------------------------------------------------------
    get = of_store("runs", RunsStore.get)
    job_names = of_store("runs", RunsStore.job_names)
    list_runs = of_store("runs", RunsStore.list_runs)
    resolve_run_id = of_store("runs", RunsStore.resolve_run_id)
    drifted = of_store("runs", RunsStore.drifted)
    expired_leases = of_store("runs", RunsStore.expired_leases)
    failed_past_retries = of_store("runs", RunsStore.failed_past_retries)
    run_sizes = of_store("runs", RunsStore.run_sizes)
    run_statuses = of_store("runs", RunsStore.run_statuses)
    database_now = of_store("runs", RunsStore.database_now)

    # -- attempts ----------------------------------------------------------------------------------
    attempts = of_store("attempts", AttemptsStore.attempts)

    # -- calls -------------------------------------------------------------------------------------
    model_calls = of_store("calls", CallsStore.model_calls)
    call_costs = of_store("calls", CallsStore.call_costs)
    spend_by_job = of_store("calls", CallsStore.spend_by_job)
    spend_by_kind = of_store("calls", CallsStore.spend_by_kind)
    spend_totals = of_store("calls", CallsStore.spend_totals)
    calls_in_doubt = of_store("calls", CallsStore.calls_in_doubt)
    settle_call = of_store("calls", CallsStore.settle_call)
    job_history = of_store("calls", CallsStore.job_history)

    # -- outbox ------------------------------------------------------------------------------------
    outbox = of_store("outbox", OutboxStore.outbox)
    stale_outbox = of_store("outbox", OutboxStore.stale_outbox)

    # -- revisions ---------------------------------------------------------------------------------
    revisions = of_store("revisions", RevisionsStore.revisions)
    revise = of_store("revisions", RevisionsStore.revise)

    # -- drills ------------------------------------------------------------------------------------
    drills = of_store("drills", DrillsStore.drills)
    arm_drill = of_store("drills", DrillsStore.arm_drill)
    disarm_drills = of_store("drills", DrillsStore.disarm_drills)

    # -- limits ------------------------------------------------------------------------------------
    rate_limits = of_store("limits", LimitsStore.rate_limit_rows)
    set_rate_limit = of_store("limits", LimitsStore.set_rate_limit)
    delete_rate_limit = of_store("limits", LimitsStore.delete_rate_limit)

    # -- batches -----------------------------------------------------------------------------------
    batches = of_store("batches", BatchesStore.batches)
    batch_id_of = of_store("batches", BatchesStore.batch_id_of)
    batch_runs = of_store("batches", BatchesStore.batch_runs)
    cancel_batch = of_store("batches", BatchesStore.cancel_batch)

    # -- prices ------------------------------------------------------------------------------------
    currency = of_store("prices", PricesStore.current_currency)
    prices = of_store("prices", PricesStore.prices)
    set_price = of_store("prices", PricesStore.set_price)
    delete_prices = of_store("prices", PricesStore.delete_prices)
    price_matches = of_store("prices", PricesStore.price_matches)

    # -- budgets -----------------------------------------------------------------------------------
    budgets = of_store("budgets", BudgetsStore.budgets)
    set_budget = of_store("budgets", BudgetsStore.set_budget)
    clear_budget = of_store("budgets", BudgetsStore.clear_budget)

    # -- retention ---------------------------------------------------------------------------------
    storage = of_store("retention", RetentionStore.storage)
    prune_batch = of_store("retention", RetentionStore.prune_batch)
    prune_spend = of_store("retention", RetentionStore.prune_spend)

    # -- shadows -----------------------------------------------------------------------------------
    baseline_version = of_store("shadows", ShadowsStore.baseline_version)
    create_shadow = of_store("shadows", ShadowsStore.create_shadow)
    shadows = of_store("shadows", ShadowsStore.shadows)
    quarantine = of_store("shadows", ShadowsStore.quarantine)
    shadow = of_store("shadows", ShadowsStore.shadow)
    shadow_items = of_store("shadows", ShadowsStore.shadow_items)
    shadow_gate = of_store("shadows", ShadowsStore.shadow_gate)

    # -- step outputs ------------------------------------------------------------------------------
    prune_step_outputs = of_store("step_outputs", StepOutputsStore.prune_step_outputs)


__all__ = ["LedgerAdmin"]
