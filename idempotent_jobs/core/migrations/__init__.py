"""Versioned SQL migrations, shipped as package data; applied by ``idempotent_jobs.core.schema``."""
