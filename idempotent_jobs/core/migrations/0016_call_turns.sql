-- change: additive
-- Real models (issue 33). Expand only: the previous release's workers write neither column and
-- never record a turn, so a fleet is rolled worker by worker.
--
-- requested_model: the model a call asked for (`gpt-4o`), beside model_name, the one the
-- provider says answered (`gpt-4o-2024-08-06`). Prices and metrics key on the requested one;
-- a call recorded without it (an older worker's) is keyed on model_name, as before.
--
-- turn: a paid call recorded while its attempt goes on (a structured answer that failed its
-- schema and was followed by a repair turn; a provider call that failed and was retried),
-- numbered within its attempt. The attempt's final call (committed, failed, recorded or lost)
-- has none, and only such a row is the one a commit or a failure updates. A retried statement
-- adds no second row for a turn (the unique index).
ALTER TABLE {schema}.model_calls
  ADD COLUMN requested_model text,
  ADD COLUMN turn integer;

CREATE UNIQUE INDEX model_calls_turns ON {schema}.model_calls (run_id, lease_epoch, worker_id, turn)
  WHERE turn IS NOT NULL;
