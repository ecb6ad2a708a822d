"""Versioned SQL migrations, shipped as package data and applied by :mod:`idempotent_jobs.schema`."""
