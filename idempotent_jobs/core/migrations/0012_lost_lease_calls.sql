-- change: additive
-- A model call whose lease was lost before its answer (or its failure) could be committed was
-- still paid for: it is recorded with the outcome `lease_lost` (RunLedger.record_lost_call),
-- though nothing else of that attempt is written.

ALTER TABLE {schema}.model_calls
  DROP CONSTRAINT model_calls_outcome_check,
  ADD CONSTRAINT model_calls_outcome_check
    CHECK (outcome IN ('accepted', 'stale', 'rejected', 'failed', 'lease_lost'));
