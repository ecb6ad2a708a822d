"""What every store is: one subsystem of the ledger over the face's executor, running only the
statements of its own file (``sql/<store>.sql``), with its parameters and its cache."""

from typing import TYPE_CHECKING

from idempotent_jobs.core.settings import LedgerSettings

if TYPE_CHECKING:
    from idempotent_jobs.core.executor import Executor


class Store:
    """One store of one face: ``Store(executor, settings)``. A face makes its stores once (see
    :class:`~idempotent_jobs.core.stores.Stores`) and shows their methods as its own; a store's
    cache lives as long as its face."""

    def __init__(self, db: "Executor", settings: LedgerSettings) -> None:
        self._db = db
        self.settings = settings

    @property
    def schema(self) -> str:
        return self.settings.schema
