"""Tests of idempotent_jobs.dagster."""
