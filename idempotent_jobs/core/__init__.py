"""The Dagster-free core: run identity, records, errors, the ledger and the protocol.

Imports psycopg and psycopg_pool, never Dagster (an import-linter contract in ``make lint`` keeps
it so): ``pip install idempotent-jobs`` without extras is enough to use :func:`run_idempotent`.
"""
