-- change: additive
-- Failure drills in the ledger, so every worker on every machine sees the same drill: the next
-- `remaining` model calls of a job (its identity job name; '*': every job) fail before the call
-- is made, until `expires_at`. A drilled failure ends its attempt with its own outcome, `drill`:
-- it is neither a model call nor a failure of the job's own code.

CREATE TABLE {schema}.drills (
    job_name    text PRIMARY KEY,
    remaining   integer NOT NULL CHECK (remaining >= 0),
    expires_at  timestamptz NOT NULL,
    armed_by    text,
    armed_at    timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE {schema}.run_attempts
  DROP CONSTRAINT run_attempts_outcome_check,
  ADD CONSTRAINT run_attempts_outcome_check
    CHECK (outcome IN ('completed', 'failed', 'lease_lost', 'superseded', 'drill'));
