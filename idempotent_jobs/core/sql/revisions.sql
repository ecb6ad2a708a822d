-- The revisions store: an operator's revision of a completed run, and their listing.

-- faces: admin

-- name: revise
-- Reopen a completed run for recomputation under the next revision.
-- The only way a completed run is recomputed: its accepted result moves to run_revisions with the
-- reason, and the run becomes claimable again under the next revision number. A run whose raw
-- input retention pruned is reopened only with `recollect` (there is nothing to recompute on).
-- With `expected`, only while the run is at that revision (a promotion revises what it read).
WITH current AS (
  SELECT run_id, revision, output, completed_at, lease_epoch FROM {schema}.runs
  WHERE run_id = %(run_id)s AND status = 'completed'
    AND (%(recollect)s OR raw_input_pruned_at IS NULL)
    AND (%(expected)s::integer IS NULL OR revision = %(expected)s::integer)
  FOR UPDATE
), kept AS (
  INSERT INTO {schema}.run_revisions (run_id, revision, reason, channels, previous_output,
    previous_completed_at, previous_epoch, recollect, requested_by)
  SELECT run_id, revision + 1, %(reason)s, %(channels)s, output, completed_at, lease_epoch,
    %(recollect)s, %(requested_by)s
  FROM current
  RETURNING run_id AS revised_run_id, revision AS new_revision
)
UPDATE {schema}.runs AS r
SET status = 'pending', output = NULL, completed_at = NULL, last_error = NULL,
  revision = new_revision, updated_at = now(), config_fingerprint = NULL, config_parts = NULL,
  raw_input = CASE WHEN %(recollect)s THEN NULL ELSE r.raw_input END,
  input_fingerprint = CASE WHEN %(recollect)s THEN NULL ELSE r.input_fingerprint END,
  raw_input_pruned_at = CASE WHEN %(recollect)s THEN NULL ELSE r.raw_input_pruned_at END,
  output_pruned_at = NULL
FROM kept
WHERE r.run_id = revised_run_id
RETURNING r.*

-- name: list_revisions
-- The results a run had before each explicit revision, oldest first.
SELECT * FROM {schema}.run_revisions WHERE run_id = %(run_id)s ORDER BY revision
