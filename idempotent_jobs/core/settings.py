"""How a ledger reaches PostgreSQL and what it accepts: one settings object, taken by both faces
of the ledger (:class:`~idempotent_jobs.core.ledger.RunLedger` and
:class:`~idempotent_jobs.core.admin.LedgerAdmin`), by the executor that runs their statements,
and built by the Dagster resource from its configuration."""

import math
from dataclasses import dataclass, field
from typing import Any

from idempotent_jobs.core.constants import DEFAULT_SCHEMA
from idempotent_jobs.core.errors import InvalidInputError
from idempotent_jobs.core.json_values import MAX_JSON_BYTES

#: The default size limit of a raw input and of an output, as JSON text: a ledger row is no
#: place for a bulk payload (keep those in object storage and checkpoint a reference).
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: How long a worker waits for ``migrate`` when its code is a release ahead of the ledger: long
#: enough for an operator's migrate after a rollout, short enough that a forgotten one is seen.
DEFAULT_SCHEMA_WAIT_SECONDS = 120.0


def _payload_limit(name: str, limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(name, f"must be a whole number of bytes, got {limit!r}")
    if not 1 <= limit <= MAX_JSON_BYTES:
        raise InvalidInputError(name, f"must be 1 to {MAX_JSON_BYTES} bytes, got {limit}")
    return limit


@dataclass(frozen=True)
class LedgerSettings:
    """``conninfo``: a PostgreSQL URL or libpq conninfo string (it may hold a password: it is
    never shown, not even by ``repr``). ``schema``: the PostgreSQL schema of the ledger's tables.

    ``pool_min_size``/``pool_max_size``: the connection pool's bounds;
    ``connect_timeout_seconds``: how long to wait for a connection; ``connection_retries``: how
    often a statement whose connection broke is run again (every statement is safe to retry).

    ``prepared_statements``: prepare each statement on the server at first use (``True``), never
    (``False``), or, unset, unless a connection pooler such as PgBouncer is found between the
    ledger and PostgreSQL (PgBouncer before 1.21 in transaction mode cannot keep them).

    ``durable_lease_commits``: wait for the WAL flush on lease-only writes too (claim,
    checkpoint, renew, release). Off, those commit without waiting: visible at once, lost only if
    the server crashes within a few hundred ms, which the fence makes harmless. Results, outbox
    rows and failures always wait for the flush.

    ``max_raw_input_bytes``/``max_output_bytes``: the largest checkpoint and result, as JSON.

    ``schema_wait_seconds``: how long a worker that finds the ledger one release behind its
    code (migrated before, lacking only this code's newer migrations) waits for
    ``idempotent-jobs migrate`` before it fails; 0 fails at once. New code deployed before the
    migrate then runs once it is done. A ledger never migrated, and the operator's face, fail
    at once.
    """

    conninfo: str = field(repr=False)
    schema: str = DEFAULT_SCHEMA
    pool_min_size: int = 1
    pool_max_size: int = 4
    connect_timeout_seconds: float = 10.0
    connection_retries: int = 3
    prepared_statements: bool | None = None
    durable_lease_commits: bool = False
    max_raw_input_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_output_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    schema_wait_seconds: float = DEFAULT_SCHEMA_WAIT_SECONDS

    def __post_init__(self) -> None:
        if self.prepared_statements is not None and not isinstance(self.prepared_statements, bool):
            raise InvalidInputError(
                "prepared_statements",
                f"must be true, false or unset, got {self.prepared_statements!r}",
            )
        _payload_limit("max_raw_input_bytes", self.max_raw_input_bytes)
        _payload_limit("max_output_bytes", self.max_output_bytes)
        wait = self.schema_wait_seconds
        if (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not math.isfinite(wait)
            or wait < 0
        ):
            raise InvalidInputError(
                "schema_wait_seconds", f"must be a number of seconds, 0 or more, got {wait!r}"
            )

    @classmethod
    def of(cls, settings: "LedgerSettings | str", **options: Any) -> "LedgerSettings":
        """``settings`` itself, or the settings of a conninfo string; ``options`` (any field
        but ``conninfo``) override. An unknown option is an :class:`InvalidInputError`."""
        names = set(cls.__dataclass_fields__) - {"conninfo"}
        unknown = sorted(set(options) - names)
        if unknown:
            raise InvalidInputError(
                unknown[0], f"is not a ledger setting (settings: {', '.join(sorted(names))})"
            )
        if isinstance(settings, LedgerSettings):
            return cls(**{**settings.__dict__, **options}) if options else settings
        if not isinstance(settings, str):
            raise InvalidInputError(
                "conninfo", f"must be a PostgreSQL URL or conninfo string, got {settings!r}"
            )
        return cls(settings, **options)


__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "DEFAULT_SCHEMA_WAIT_SECONDS", "LedgerSettings"]
