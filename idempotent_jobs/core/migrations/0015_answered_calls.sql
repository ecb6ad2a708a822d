-- A paid answer recorded the moment it is in hand (issue 30). Expand only: the previous
-- release's workers never write the new outcome nor read the new columns, so a fleet is
-- rolled worker by worker.
--
-- In Dagster, `transform` records its call as `answered` (tokens, model, its epoch, counted in
-- the spend by the trigger on insert) with the answer and what it was computed on, before the
-- answer crosses a step boundary (an IO manager, a process, a pod). The commit that accepts it
-- (or refuses it) updates that row: one row per call however often its answer is committed. A
-- later attempt on the same revision, checkpoint and configuration reuses the recorded answer
-- instead of paying again.
ALTER TABLE {schema}.model_calls
  DROP CONSTRAINT model_calls_outcome_check,
  ADD CONSTRAINT model_calls_outcome_check
    CHECK (outcome IN ('accepted', 'stale', 'rejected', 'failed', 'lease_lost', 'answered')),
  ADD COLUMN answer jsonb,
  ADD COLUMN input_fingerprint text,
  ADD COLUMN config_parts jsonb;

-- The answers waiting for their commit: found by run, on the run's current revision.
CREATE INDEX model_calls_answered ON {schema}.model_calls (run_id, revision)
  WHERE outcome = 'answered';
