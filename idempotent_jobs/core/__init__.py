"""The Dagster-free core: run identity, records, errors, the ledger and the protocol.

Imports psycopg and psycopg_pool, never Dagster (an import-linter contract in ``make lint`` keeps
it so): ``pip install idempotent-jobs`` without extras is enough to use :func:`run_idempotent`.
"""

from idempotent_jobs.core.observers import add_observer as _add_observer
from idempotent_jobs.core.telemetry_observer import TelemetryObserver as _TelemetryObserver

# Telemetry watches the attempt engine from outside (core/observers.py): added once, here.
_add_observer(_TelemetryObserver())
