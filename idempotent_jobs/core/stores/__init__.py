"""The ledger's stores, composed by its two faces the way ``dagster-postgres`` composes its run,
event-log and schedule storages: each store is a module owning its SQL file
(``sql/<store>.sql``), its parameters and its cache; a face
(:class:`~idempotent_jobs.core.ledger.RunLedger`, :class:`~idempotent_jobs.core.admin.LedgerAdmin`)
makes them over its executor and shows the methods its role may use. Outside ``core/``, nothing
knows a store exists: callers use the faces.

::

    RunLedger (worker face)              LedgerAdmin (operator face)
        |                                     |
        +---- Stores over the face's own executor (its pool, its face's statements) ----+
              runs  attempts  calls  budgets  prices  limits  outbox  batches
              drills  step_outputs  revisions  retention  shadows
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from idempotent_jobs.core.settings import LedgerSettings
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

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


@dataclass(frozen=True)
class Stores:
    """Every store of one face, made once by :meth:`over`."""

    runs: RunsStore
    attempts: AttemptsStore
    calls: CallsStore
    budgets: BudgetsStore
    prices: PricesStore
    limits: LimitsStore
    outbox: OutboxStore
    batches: BatchesStore
    drills: DrillsStore
    step_outputs: StepOutputsStore
    revisions: RevisionsStore
    retention: RetentionStore
    shadows: ShadowsStore

    @classmethod
    def over(cls, db: "Executor", settings: LedgerSettings) -> "Stores":
        runs, prices = RunsStore(db, settings), PricesStore(db, settings)
        calls = CallsStore(db, settings, runs=runs, prices=prices)
        return cls(
            runs=runs,
            attempts=AttemptsStore(db, settings, calls=calls),
            calls=calls,
            budgets=BudgetsStore(db, settings, runs=runs),
            prices=prices,
            limits=LimitsStore(db, settings),
            outbox=OutboxStore(db, settings),
            batches=BatchesStore(db, settings),
            drills=DrillsStore(db, settings),
            step_outputs=StepOutputsStore(db, settings),
            revisions=RevisionsStore(db, settings, runs=runs),
            retention=RetentionStore(db, settings),
            shadows=ShadowsStore(db, settings),
        )


__all__ = ["Stores"]
