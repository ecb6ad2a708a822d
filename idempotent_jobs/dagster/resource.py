"""The ledger as a Dagster resource: configuration in Dagster, a plain ``RunLedger`` in the ops.

``RunLedgerResource`` holds the settings (``database_url`` from a ``dg.EnvVar``: it may hold a
password) and, for each run, creates the core's :class:`RunLedger`, opens it and closes it after
the run. Ops reach it as ``context.resources.ledger`` (``persist`` takes it as a parameter,
``ledger: dg.ResourceParam[RunLedger]``, which works in any op of your own). It is the ledger's
worker face; the reconciliation and retention jobs open the operator face beside it
(``LedgerAdmin.beside``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import dagster as dg
from pydantic import Field

from idempotent_jobs.core.constants import DEFAULT_SCHEMA
from idempotent_jobs.core.ledger import RunLedger
from idempotent_jobs.core.settings import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_SCHEMA_WAIT_SECONDS,
    LedgerSettings,
)


class RunLedgerResource(dg.ConfigurableResource[RunLedger]):
    """Creates the run ledger for a Dagster run; see :class:`RunLedger` for what it does."""

    #: The ledger class built with these settings (a subclass, to observe or fault a test's
    #: ledger, keeps every setting).
    ledger_class: ClassVar[type[RunLedger]] = RunLedger

    database_url: str = Field(
        description="PostgreSQL URL of the ledger database (use an EnvVar: it may hold a password)",
        repr=False,
    )
    schema_name: str = Field(
        default=DEFAULT_SCHEMA, description="PostgreSQL schema holding the ledger's tables"
    )
    pool_min_size: int = Field(default=1, description="Connections kept open by the pool")
    pool_max_size: int = Field(default=4, description="Most connections the pool opens")
    connect_timeout_seconds: float = Field(
        default=10.0, description="How long to wait for a connection before failing"
    )
    connection_retries: int = Field(
        default=3, description="Retries of a statement whose connection broke (all are idempotent)"
    )
    durable_lease_commits: bool = Field(
        default=False,
        description=(
            "Wait for the WAL flush on lease-only writes too (claim, checkpoint, renew, release). "
            "Off, those commit without waiting: visible at once, lost only if the server crashes "
            "within a few hundred ms, which the fence makes harmless. Results, outbox rows and "
            "failures always wait for the flush."
        ),
    )
    prepared_statements: bool | None = Field(
        default=None,
        description=(
            "Prepare statements on the server at first use (true), never (false), or, unset, "
            "unless a connection pooler such as PgBouncer is found in between (PgBouncer before "
            "1.21 in transaction mode cannot keep prepared statements)"
        ),
    )
    max_raw_input_bytes: int = Field(
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        description="Largest raw input (as JSON) a checkpoint accepts; a larger one fails the step",
    )
    max_output_bytes: int = Field(
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        description="Largest output (as JSON) a result may have; a larger one fails the step",
    )
    schema_wait_seconds: float = Field(
        default=DEFAULT_SCHEMA_WAIT_SECONDS,
        description=(
            "How long a run waits for `idempotent-jobs migrate` when this code is a release "
            "ahead of the ledger's schema (new code deployed before the migrate); 0 fails at once"
        ),
    )

    def create_resource(self, context: dg.InitResourceContext) -> RunLedger:
        return self.ledger()

    def settings(self) -> LedgerSettings:
        """These settings as the core's :class:`LedgerSettings` (both faces of the ledger take
        them: ``LedgerAdmin(resource.settings())`` is the operator's face)."""
        return LedgerSettings(
            self.database_url,
            schema=self.schema_name,
            pool_min_size=self.pool_min_size,
            pool_max_size=self.pool_max_size,
            connect_timeout_seconds=self.connect_timeout_seconds,
            connection_retries=self.connection_retries,
            durable_lease_commits=self.durable_lease_commits,
            max_raw_input_bytes=self.max_raw_input_bytes,
            max_output_bytes=self.max_output_bytes,
            prepared_statements=self.prepared_statements,
            schema_wait_seconds=self.schema_wait_seconds,
        )

    def ledger(self) -> RunLedger:
        """A new, unopened ledger with these settings (outside Dagster: close it yourself)."""
        return self.ledger_class(self.settings())

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[RunLedger]:
        """Open the ledger for the run (fails fast on a bad URL or an unmigrated schema) and
        close its pool when the run's step process is done with it."""
        with self.create_resource(context) as ledger:
            yield ledger
