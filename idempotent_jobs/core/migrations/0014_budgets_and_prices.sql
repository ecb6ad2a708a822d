-- change: additive
-- Token budgets and model prices (issue 24).
--
-- A model call refused because its job's token budget is spent ends its attempt with its own
-- outcome, `budget`: no call was made, and the job's code did not fail.
ALTER TABLE {schema}.run_attempts
  DROP CONSTRAINT run_attempts_outcome_check,
  ADD CONSTRAINT run_attempts_outcome_check
    CHECK (outcome IN ('completed', 'failed', 'lease_lost', 'superseded', 'drill', 'budget'));

-- A day's model calls, read by call time (`runs stats`).
CREATE INDEX model_calls_called_at ON {schema}.model_calls (called_at)
  INCLUDE (run_id, input_tokens, output_tokens);

-- What each job spent per subject and UTC day (by the call's database time), kept by a trigger
-- on model_calls in the transaction that records the call: the budget check before a model
-- call reads a job's rows of the day (one per subject) instead of summing its calls.
CREATE TABLE {schema}.spend_days (
    job_name    text NOT NULL,
    day         date NOT NULL,
    subject_id  text NOT NULL,
    calls       bigint NOT NULL,
    tokens      bigint NOT NULL,
    PRIMARY KEY (job_name, day, subject_id)
);

CREATE FUNCTION {schema}.count_spend() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  INSERT INTO {schema}.spend_days AS s (job_name, day, subject_id, calls, tokens)
  SELECT r.job_name, (NEW.called_at AT TIME ZONE 'UTC')::date, r.subject_id, 1,
    COALESCE(NEW.input_tokens, 0) + COALESCE(NEW.output_tokens, 0)
  FROM {schema}.runs AS r WHERE r.run_id = NEW.run_id
  ON CONFLICT (job_name, day, subject_id)
    DO UPDATE SET calls = s.calls + 1, tokens = s.tokens + EXCLUDED.tokens;
  RETURN NULL;
END
$body$;

CREATE TRIGGER model_calls_spend AFTER INSERT ON {schema}.model_calls
  FOR EACH ROW EXECUTE FUNCTION {schema}.count_spend();

-- The calls an earlier release recorded.
INSERT INTO {schema}.spend_days (job_name, day, subject_id, calls, tokens)
SELECT r.job_name, (c.called_at AT TIME ZONE 'UTC')::date, r.subject_id, count(*),
  sum(COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0))
FROM {schema}.model_calls AS c JOIN {schema}.runs AS r ON r.run_id = c.run_id
GROUP BY 1, 2, 3;

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
