"""What the tests and the benchmarks share, and neither owns: PgBouncer and the Debian tools the
network tests need, an in-memory OpenTelemetry SDK, and a Dagster instance and daemon to launch
runs and backfills against. Not shipped (the wheel holds ``idempotent_jobs`` only)."""
