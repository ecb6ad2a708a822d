-- Token budgets and model prices (issue 24).
--
-- A model call refused because its job's token budget is spent ends its attempt with its own
-- outcome, `budget`: no call was made, and the job's code did not fail.
ALTER TABLE {schema}.run_attempts
  DROP CONSTRAINT run_attempts_outcome_check,
  ADD CONSTRAINT run_attempts_outcome_check
    CHECK (outcome IN ('completed', 'failed', 'lease_lost', 'superseded', 'drill', 'budget'));

-- The spend of a day is read from the model calls made since its start (budget_check, stats,
-- estimate): by call time, carrying what the sum needs.
CREATE INDEX model_calls_called_at ON {schema}.model_calls (called_at)
  INCLUDE (run_id, input_tokens, output_tokens);

-- The budget each job's workers last enforced (declared by the job spec in code), so operator
-- commands show spend against it without loading code. NULL: no limit of that kind.
CREATE TABLE {schema}.budgets (
    job_name                    text PRIMARY KEY,
    tokens_per_day              bigint CHECK (tokens_per_day > 0),
    tokens_per_subject_per_day  bigint CHECK (tokens_per_subject_per_day > 0),
    declared_at                 timestamptz NOT NULL DEFAULT now()
);

-- The price of a model's tokens, per million, set by an operator (`idempotent-jobs prices set`):
-- what turns recorded tokens into money in `runs show`, `runs stats`, `estimate` and metrics.
CREATE TABLE {schema}.model_prices (
    model_name                 text PRIMARY KEY,
    input_per_million          numeric(14, 6) NOT NULL CHECK (input_per_million >= 0),
    output_per_million         numeric(14, 6) NOT NULL CHECK (output_per_million >= 0),
    currency                   text NOT NULL DEFAULT 'USD',
    set_at                     timestamptz NOT NULL DEFAULT now(),
    set_by                     text
);
