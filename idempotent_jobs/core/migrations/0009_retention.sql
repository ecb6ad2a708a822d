-- change: additive
-- Retention: payloads can be pruned while the identity row stays forever (it carries the
-- deduplication). When each payload went is kept beside it, and the columns that held payloads
-- may now be empty: a pruned output, raw input, delivered notification payload, or the output a
-- revised run had when its output had already been pruned.

ALTER TABLE {schema}.runs
  ADD COLUMN raw_input_pruned_at timestamptz,
  ADD COLUMN output_pruned_at timestamptz,
  ADD COLUMN attempts_pruned_at timestamptz;
ALTER TABLE {schema}.notification_outbox
  ALTER COLUMN payload DROP NOT NULL,
  ADD COLUMN payload_pruned_at timestamptz;
ALTER TABLE {schema}.run_revisions
  ALTER COLUMN previous_output DROP NOT NULL;

-- A completed run has an output, or had one until retention pruned it. (Adding the constraint
-- scans `runs` once under the migration's lock: seconds per million runs.)
ALTER TABLE {schema}.runs
  DROP CONSTRAINT runs_completed_check,
  ADD CONSTRAINT runs_completed_check CHECK (
    status <> 'completed'
    OR ((output IS NOT NULL OR output_pruned_at IS NOT NULL)
      AND completed_at IS NOT NULL AND lease_owner IS NULL)
  );
