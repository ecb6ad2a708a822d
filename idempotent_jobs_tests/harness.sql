-- Statements only tests use: a run registered without a claim.

-- name: register
-- Create the run row if it is new; return the stored row either way.
-- Idempotent registration: a second one only touches updated_at, never clears output nor moves a
-- completed run back. The same fields under another run id violate runs_identity_key.
INSERT INTO {schema}.runs (run_id, job_name, subject_id, scheduled_at, version)
VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s)
ON CONFLICT (run_id) DO UPDATE SET updated_at = now()
RETURNING *
