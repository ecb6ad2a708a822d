"""Tests of idempotent_jobs.operator."""
