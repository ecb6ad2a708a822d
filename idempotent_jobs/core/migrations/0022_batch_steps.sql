-- change: additive
-- The batch lane, to the end (issue 43): each batch counts the steps that failed one after
-- another (`failed_steps`, reset by a step that ends well) and keeps the last one's error, so
-- a batch that keeps failing is a `doctor` problem and is shown in its sensor's tick. Expand
-- only: a previous release's lane never writes them.
ALTER TABLE {schema}.batches
  ADD COLUMN failed_steps integer NOT NULL DEFAULT 0,
  ADD COLUMN last_step_error text;
