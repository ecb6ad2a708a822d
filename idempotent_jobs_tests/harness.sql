-- Statements only tests use: a run registered without a claim, a lease given back untouched.

-- name: register
-- Create the run row if it is new; return the stored row either way.
-- Idempotent registration: a second one only touches updated_at, never clears output nor moves a
-- completed run back. The same fields under another run id violate runs_identity_key.
INSERT INTO {schema}.runs (run_id, job_name, subject_id, scheduled_at, version)
VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s)
ON CONFLICT (run_id) DO UPDATE SET updated_at = now()
RETURNING *

-- name: release
-- Hand the run back untouched, ending the attempt as superseded; say what happened.
-- For a step that stops early. `outcome`: `applied`, `already_done` (this release landed
-- before) or `lease_lost`.
WITH cur AS (
  SELECT run_id, status, lease_epoch, lease_owner,
    COALESCE(lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s AND status = 'running',
      false) AS mine
  FROM {schema}.runs
  WHERE run_id = %(run_id)s
  FOR UPDATE
), released AS (
  UPDATE {schema}.runs AS r
  SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM cur
  WHERE r.run_id = cur.run_id AND cur.mine
  RETURNING r.run_id, r.lease_epoch, r.lease_started_at, r.lease_caller_run_id,
    r.lease_caller_step,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT run_id, lease_epoch, %(worker_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(), 'superseded'
  FROM released
)
SELECT CASE
    WHEN EXISTS (SELECT FROM released) THEN 'applied'
    WHEN cur.status = 'pending' AND cur.lease_epoch = %(epoch)s AND cur.lease_owner IS NULL
      THEN 'already_done'
    ELSE 'lease_lost' END AS outcome
FROM cur
