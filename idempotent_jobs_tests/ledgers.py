"""The ledger a test holds when it plays both roles: a worker that claims and commits, and the
operator who then reads what the ledger holds.

:class:`BothFaces` is the worker face (:class:`RunLedger`) whose missing attributes are the
operator face's (:class:`LedgerAdmin`, same settings, a pool of its own), plus what only tests do
(``harness.sql``): register a run without claiming it.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any, Concatenate, Generic, LiteralString, ParamSpec, TypeVar

import psycopg
from psycopg import sql

from idempotent_jobs.core.admin import LedgerAdmin
from idempotent_jobs.core.checks import check_identity, identity_params
from idempotent_jobs.core.errors import IdentityConflictError
from idempotent_jobs.core.executor import Executor
from idempotent_jobs.core.identity import RunIdentity
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.records import Lease, RunRecord
from idempotent_jobs.core.rows import record_row
from idempotent_jobs.core.sql import Statement, parse_statements


@cache
def harness_statements() -> dict[str, Statement]:
    """The statements only tests run (``harness.sql``, beside this module)."""
    text = resources.files(__package__).joinpath("harness.sql").read_text(encoding="utf-8")
    return parse_statements(text)


class HarnessExecutor(Executor):
    """The worker face's executor, which also runs ``harness.sql``'s statements."""

    def query(self, name: str) -> LiteralString:
        statement = harness_statements().get(name)
        if statement is None:
            return super().query(name)
        rendered = sql.SQL(statement.text).format(schema=sql.Identifier(self.schema))
        text = rendered.as_string(None)
        assert text is not None
        return text


P = ParamSpec("P")
R = TypeVar("R")


class AdminMethod(Generic[P, R]):
    """One of the operator face's methods, on :class:`BothFaces`: typed as the operator's
    (the worker face's stub of the same name says it moved)."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: "BothFaces", owner: type | None = None) -> Callable[P, R]:
        bound: Callable[P, R] = getattr(instance.admin, self.name)
        return bound


class BothFaces(RunLedger):
    """``BothFaces(conninfo, **settings)``: a worker face that also answers the operator
    face's methods (``ledger.attempts(run_id)``, ``ledger.revise(...)``, ``ledger.migrate()``)."""

    executor_class = HarnessExecutor

    @property
    def admin(self) -> LedgerAdmin:
        """The operator face over the same settings, made at first use (a pool of its own)."""
        admin = self.__dict__.get("_admin")
        if admin is None:
            admin = self.__dict__["_admin"] = LedgerAdmin(self.settings)
        return admin

    # The worker face's stubs (typed NoReturn) answered by the operator face: only this hybrid
    # may break that contract, hence the ignores.
    migrate = AdminMethod(LedgerAdmin.migrate)  # type: ignore[assignment]
    upgrade = AdminMethod(LedgerAdmin.upgrade)  # type: ignore[assignment]
    missing_privileges = AdminMethod(LedgerAdmin.missing_privileges)  # type: ignore[assignment]
    arm_drill = AdminMethod(LedgerAdmin.arm_drill)  # type: ignore[assignment]
    disarm_drills = AdminMethod(LedgerAdmin.disarm_drills)  # type: ignore[assignment]
    attempts = AdminMethod(LedgerAdmin.attempts)  # type: ignore[assignment]
    outbox = AdminMethod(LedgerAdmin.outbox)  # type: ignore[assignment]
    revisions = AdminMethod(LedgerAdmin.revisions)  # type: ignore[assignment]
    revise = AdminMethod(LedgerAdmin.revise)  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:  # only what RunLedger lacks
        if name.startswith("_") or "settings" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.admin, name)

    def close(self) -> None:
        super().close()
        admin = self.__dict__.get("_admin")
        if admin is not None:
            admin.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A connection of this face's own pool, in a transaction: what a test reads or sets
        up by hand sees exactly what the worker's connections see (a pooler's settings too)."""
        with self._db.transaction() as conn:
            yield conn

    def register(self, identity: RunIdentity) -> RunRecord:  # type: ignore[override]
        """Create the run's row if it is new, unclaimed; return the stored record either way."""
        params = identity_params(identity)
        try:
            rows = self._db.fetch("register", params, record_row(RunRecord))
        except IdentityConflictError:
            params = self._stores.runs._stored_id_of(params)
            rows = self._db.fetch("register", params, record_row(RunRecord))
        check_identity(rows[0], identity)
        return rows[0]

    def save_raw_input(  # type: ignore[override]
        self, lease: Lease, raw_input: dict[str, Any]
    ) -> dict[str, Any]:
        """:meth:`checkpoint`'s stored value (the first stored wins)."""
        stored = self.checkpoint(lease, raw_input).stored_raw_input
        assert stored is not None
        return stored
