"""The worker face a test holds: :class:`HarnessLedger` is :class:`RunLedger` plus what only
tests do (``harness.sql``): register a run without claiming it. The operator's reads and writes
go through the operator face (:class:`~idempotent_jobs.core.admin.LedgerAdmin`), a fixture of
its own: a test plays each role through that role's face.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg import sql

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


class HarnessLedger(RunLedger):
    """``HarnessLedger(conninfo, **settings)``: the worker face, plus what only tests do
    (``harness.sql``): register a run without claiming it, checkpoint by the stored value, and
    read or set up rows by hand on one of its own connections. What an operator does is the
    operator face's (the ``operator`` fixture, or ``LedgerAdmin.beside(ledger)``)."""

    executor_class = HarnessExecutor

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
