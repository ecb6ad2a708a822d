-- change: additive
-- Token counts as bigint: a provider's count above 2^31 (real or hostile) no longer fails the
-- very statement that records the paid call. Python refuses counts that are negative or above a
-- billion per call before they reach here (core/usage.py); this only widens the columns.
-- The `attempts` view names the columns, so it is created again around the change (rewriting
-- both tables takes their lock for seconds per million rows).

DROP VIEW {schema}.attempts;

ALTER TABLE {schema}.run_attempts
  ALTER COLUMN input_tokens TYPE bigint,
  ALTER COLUMN output_tokens TYPE bigint;
ALTER TABLE {schema}.model_calls
  ALTER COLUMN input_tokens TYPE bigint,
  ALTER COLUMN output_tokens TYPE bigint;

CREATE VIEW {schema}.attempts AS
SELECT run_id, lease_epoch, worker_id, caller_run_id, caller_step, started_at, ended_at, outcome,
       error, model_name, input_tokens, output_tokens
FROM {schema}.run_attempts
UNION ALL
SELECT run_id, lease_epoch, lease_owner, lease_caller_run_id, lease_caller_step,
       COALESCE(lease_started_at, updated_at), NULL::timestamptz, NULL::text, NULL::text,
       NULL::text, NULL::bigint, NULL::bigint
FROM {schema}.runs
WHERE status = 'running';
