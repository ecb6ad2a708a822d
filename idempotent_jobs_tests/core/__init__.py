"""Tests of idempotent_jobs.core."""
