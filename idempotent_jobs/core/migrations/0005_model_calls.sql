-- change: additive
-- What the model calls of a logical run cost, accepted or not. One row per model call that ended
-- in a ledger statement: the final commit (the accepted answer, or a stale one refused), or a
-- recorded failure (the call raised, or the validator rejected its answer). Each row names the
-- step that made the call (which may differ from the step that claimed the lease), the Dagster
-- run and op retry, the model and the tokens the provider reported.

CREATE TABLE {schema}.model_calls (
    call_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         text NOT NULL REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    lease_epoch    bigint NOT NULL,
    revision       integer NOT NULL,
    worker_id      text NOT NULL,
    dagster_run_id text,
    step_key       text,
    retry_number   integer,
    model_name     text,
    input_tokens   integer,
    output_tokens  integer,
    outcome        text NOT NULL CONSTRAINT model_calls_outcome_check
                   CHECK (outcome IN ('accepted', 'stale', 'rejected', 'failed')),
    error          text,
    called_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX model_calls_run_idx ON {schema}.model_calls (run_id, call_id);
