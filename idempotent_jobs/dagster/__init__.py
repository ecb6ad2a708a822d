"""Dagster glue: the ledger resource, the job spec and factory, ops, partitions, resources."""
