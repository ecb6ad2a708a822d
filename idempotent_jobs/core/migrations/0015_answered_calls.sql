-- change: additive
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

-- What one Dagster step hands the next (a Ticket, as JSON), for executors whose steps share no
-- storage (Kubernetes: a pod per step): the ledger IO manager keeps it here, by the Dagster
-- run, step and output that produced it, so a later step or a re-execution from failure in any
-- process loads it. A new table: the previous release's workers never read it.
CREATE TABLE {schema}.step_outputs (
    dagster_run_id text NOT NULL,
    step_key       text NOT NULL,
    output_name    text NOT NULL,
    run_id         text REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    value          jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dagster_run_id, step_key, output_name)
);
CREATE INDEX step_outputs_created_at ON {schema}.step_outputs (created_at);
