-- change: contracting
-- Leaner claims. A claim writes one row: while a claim is open, its details (when it started,
-- which Dagster run and step) live on the run itself, and its `run_attempts` row is written when
-- it ends (complete, fail, release) or, if its holder vanished, by the claim that supersedes it.
-- The view `attempts` shows every claim: the ended ones and the open one.
-- Updates of `runs` change no indexed column any more (status leaves the operators' index) and
-- pages keep free room, so PostgreSQL updates a run in place (HOT) without touching its indexes.

ALTER TABLE {schema}.runs
    ADD COLUMN lease_started_at     timestamptz,
    ADD COLUMN lease_dagster_run_id text,
    ADD COLUMN lease_step_key       text;
ALTER TABLE {schema}.runs SET (fillfactor = 80);

-- The open attempt of a running run moves onto the run; any other open attempt was abandoned.
UPDATE {schema}.runs AS r
SET lease_started_at = a.started_at, lease_dagster_run_id = a.dagster_run_id,
    lease_step_key = a.step_key
FROM {schema}.run_attempts AS a
WHERE a.run_id = r.run_id AND a.lease_epoch = r.lease_epoch AND a.outcome IS NULL
  AND r.status = 'running';
DELETE FROM {schema}.run_attempts AS a
USING {schema}.runs AS r
WHERE a.run_id = r.run_id AND a.lease_epoch = r.lease_epoch AND a.outcome IS NULL
  AND r.status = 'running';
UPDATE {schema}.run_attempts SET outcome = 'lease_lost', ended_at = now() WHERE outcome IS NULL;
ALTER TABLE {schema}.run_attempts
    ALTER COLUMN outcome SET NOT NULL,
    ALTER COLUMN ended_at SET NOT NULL;

DROP INDEX {schema}.runs_job_status_idx;
CREATE INDEX runs_job_window_idx ON {schema}.runs (job_name, scheduled_at);

CREATE VIEW {schema}.attempts AS
SELECT run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome,
       error, model_name, input_tokens, output_tokens
FROM {schema}.run_attempts
UNION ALL
SELECT run_id, lease_epoch, lock_owner, lease_dagster_run_id, lease_step_key,
       COALESCE(lease_started_at, updated_at), NULL::timestamptz, NULL::text, NULL::text,
       NULL::text, NULL::integer, NULL::integer
FROM {schema}.runs
WHERE status = 'running';
