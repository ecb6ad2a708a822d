-- The step outputs store: what a Dagster step hands the next (the IO manager).

-- faces: worker

-- name: store_step_output
-- Keep what a Dagster step hands the next; a re-run of the same step replaces it.
INSERT INTO {schema}.step_outputs (dagster_run_id, step_key, output_name, run_id, value)
SELECT %(dagster_run_id)s, %(step_key)s, %(output_name)s, r.run_id, %(value)s::jsonb
FROM (SELECT %(run_id)s::text AS wanted) AS w
LEFT JOIN {schema}.runs AS r ON r.run_id = w.wanted
ON CONFLICT (dagster_run_id, step_key, output_name)
DO UPDATE SET value = EXCLUDED.value, run_id = EXCLUDED.run_id, created_at = now()
RETURNING created_at

-- name: load_step_output
-- What a Dagster step handed the next, by the run, step and output that produced it.
SELECT value FROM {schema}.step_outputs
WHERE dagster_run_id = %(dagster_run_id)s AND step_key = %(step_key)s
  AND output_name = %(output_name)s

-- faces: admin

-- name: prune_step_outputs
-- Count, and with `apply` delete, up to `batch_size` step hand-overs of a job's runs completed before the cutoff.
-- What the ledger IO manager kept between a Dagster run's steps is history once the run is
-- completed (a re-execution of it finds the run done from the ledger): it goes with the attempt
-- rows' retention. Only completed runs: a run in progress keeps what its next step loads.
WITH old AS (
  SELECT s.dagster_run_id, s.step_key, s.output_name, pg_column_size(s.*) AS bytes
  FROM {schema}.step_outputs AS s JOIN {schema}.runs AS r ON r.run_id = s.run_id
  WHERE r.job_name = %(job_name)s AND r.status = 'completed'
    AND r.completed_at < %(before)s AND s.created_at < %(before)s
  LIMIT %(batch_size)s::bigint
), gone AS (
  DELETE FROM {schema}.step_outputs AS s USING old
  WHERE %(apply)s AND (s.dagster_run_id, s.step_key, s.output_name)
    = (old.dagster_run_id, old.step_key, old.output_name)
  RETURNING s.dagster_run_id
)
SELECT count(*)::bigint, COALESCE(sum(bytes), 0)::bigint FROM old
