"""This repository's own Dagster code location: two job specs, their config and sample data."""
