-- change: contracting
-- One vocabulary: a run's "lock" columns are its lease, and the Dagster run id and step of an
-- attempt or model call are the caller's (any scheduler can be the caller). Renames only: no
-- data moves, and a rename takes its table's lock for an instant.

ALTER TABLE {schema}.runs RENAME COLUMN lock_owner TO lease_owner;
ALTER TABLE {schema}.runs RENAME COLUMN lock_expires_at TO lease_expires_at;
ALTER TABLE {schema}.runs RENAME COLUMN lease_dagster_run_id TO lease_caller_run_id;
ALTER TABLE {schema}.runs RENAME COLUMN lease_step_key TO lease_caller_step;
ALTER TABLE {schema}.runs RENAME CONSTRAINT runs_lock_check TO runs_lease_check;

ALTER TABLE {schema}.run_attempts RENAME COLUMN dagster_run_id TO caller_run_id;
ALTER TABLE {schema}.run_attempts RENAME COLUMN step_key TO caller_step;

ALTER TABLE {schema}.model_calls RENAME COLUMN dagster_run_id TO caller_run_id;
ALTER TABLE {schema}.model_calls RENAME COLUMN step_key TO caller_step;

-- A view keeps the column names it was created with: create it again under the new ones.
DROP VIEW {schema}.attempts;
CREATE VIEW {schema}.attempts AS
SELECT run_id, lease_epoch, worker_id, caller_run_id, caller_step, started_at, ended_at, outcome,
       error, model_name, input_tokens, output_tokens
FROM {schema}.run_attempts
UNION ALL
SELECT run_id, lease_epoch, lease_owner, lease_caller_run_id, lease_caller_step,
       COALESCE(lease_started_at, updated_at), NULL::timestamptz, NULL::text, NULL::text,
       NULL::text, NULL::integer, NULL::integer
FROM {schema}.runs
WHERE status = 'running';
