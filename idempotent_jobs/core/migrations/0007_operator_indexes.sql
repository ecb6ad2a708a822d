-- change: additive
-- Operator queries that stay index scans however large the ledger grows: the newest runs
-- (`runs list`), expired leases and failed runs (`doctor`). The two partial indexes hold only
-- the few rows they serve. Built inside the migration's transaction, so writes to `runs` wait
-- while they build (seconds per million runs): migrate during a deploy.

CREATE INDEX runs_newest_idx ON {schema}.runs (scheduled_at DESC, job_name, subject_id);
CREATE INDEX runs_running_expiry_idx ON {schema}.runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_failed_idx ON {schema}.runs (updated_at) WHERE status = 'failed';
