-- change: additive
-- A worker changes what a budget counts only by admitting and settling its own calls (issue
-- 42: "the worker role can disable budgets"). Migration 0021 took the tables' writes from the
-- worker role and left it the functions that run as the ledger's owner; their arguments were
-- trusted. A worker could call `reserve_budget` with a negative worst case, which lowered what
-- the budget held (a 5 USD budget then showed -1000 USD held and 1005 USD left), and with a
-- job of its choosing (`fenced_job`), which skipped the lease check, so against any budget of
-- any run. It could call `settle_recorded_call` with a model call row of its own making, whose
-- negative money lowered what the budget had spent, or insert a call with negative tokens,
-- which the trigger priced below zero; and it could declare another job's budget at 10^18
-- before that job's own spec did. Expand only: the previous release's workers call the
-- same names with the same arguments, and their prepared statements plan the new function.

-- 1. The admission checks what it is given, then admits as before: a worst case is never
-- negative; the run's job and subject are read from the run under the caller's lease (0020's
-- own check), or, for a shadow (epoch 0, worker `shadow:<id>`), with a pending item of a shadow
-- still running. The job and subject a caller passes are not used: the statements that passed
-- them (begin, the checkpoint, a request's admission) have just written the run's row, which
-- the lease check sees. The admission itself is 0020's function, kept under a name only the
-- ledger's owner may call.
ALTER FUNCTION {schema}.reserve_budget(text, integer, text, bigint, bigint, bigint, text, text,
  text, text, text) RENAME TO reserve_under_budgets;
REVOKE EXECUTE ON FUNCTION {schema}.reserve_under_budgets(text, integer, text, bigint, bigint,
  bigint, text, text, text, text, text) FROM PUBLIC;

CREATE FUNCTION {schema}.reserve_budget(p_run_id text, p_epoch integer, p_worker text,
    max_input bigint, max_output bigint, max_total bigint, requested text, answered text,
    call_tier text, fenced_job text DEFAULT NULL, fenced_subject text DEFAULT NULL)
RETURNS TABLE (outcome text, budget_id text, amount numeric, spent numeric,
    reserved numeric, wanted numeric, period_start date, subject_id text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  job text;
  subject text;
BEGIN
  IF max_input < 0 OR max_output < 0 OR max_total < 0 THEN
    RAISE EXCEPTION 'reserve_budget: a worst case is a number of tokens from 0, got input %, '
      'output %, total %', max_input, max_output, max_total
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_epoch = 0 AND starts_with(p_worker, 'shadow:') THEN
    SELECT x.job_name, x.subject_id INTO job, subject FROM {schema}.runs AS x
    WHERE x.run_id = p_run_id AND EXISTS (SELECT FROM {schema}.shadow_items AS i
      JOIN {schema}.shadows AS s ON s.shadow_id = i.shadow_id
      WHERE i.shadow_id = substr(p_worker, 8) AND i.run_id = p_run_id
        AND i.state = 'pending' AND s.state IN ('started', 'submitted'));
  END IF;
  -- No job given: the admission reads it from the run under the caller's lease, or says the
  -- lease was lost.
  RETURN QUERY SELECT * FROM {schema}.reserve_under_budgets(p_run_id, p_epoch, p_worker,
    max_input, max_output, max_total, requested, answered, call_tier, job, subject);
END
$body$;

-- 2. A spec declares its own job's budgets (and groups, which any job may join): a budget of
-- another job's name, or an id that does not say its scope, unit, period and name, is refused.
-- A worker could declare `job:tokens/day:<another job>` at 10^18 before that job's own spec
-- did, and the other job's declaration then found it held and kept it.
ALTER FUNCTION {schema}.declare_spec_budgets(text, text[], text[], text[], text[], text[],
  numeric[]) RENAME TO declare_spec_budgets_as_given;
REVOKE EXECUTE ON FUNCTION {schema}.declare_spec_budgets_as_given(text, text[], text[],
  text[], text[], text[], numeric[]) FROM PUBLIC;

CREATE FUNCTION {schema}.declare_spec_budgets(p_job text, p_ids text[], p_scopes text[],
    p_names text[], p_units text[], p_periods text[], p_amounts numeric[])
RETURNS TABLE (budget_id text, declared numeric, held numeric, held_by text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  bad text;
BEGIN
  SELECT w.id INTO bad
  FROM unnest(p_ids, p_scopes, p_names, p_units, p_periods) AS w(id, scope, name, unit, period)
  WHERE w.id IS DISTINCT FROM w.scope || ':' || w.unit || '/' || w.period || ':' || w.name
    OR (w.scope <> 'group' AND w.name IS DISTINCT FROM p_job)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'declare_spec_budgets: job % may declare its own budgets and groups, not %',
      p_job, bad USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY SELECT * FROM {schema}.declare_spec_budgets_as_given(p_job, p_ids, p_scopes,
    p_names, p_units, p_periods, p_amounts);
END
$body$;

-- 3. Settling is the trigger's alone: the trigger runs as the ledger's owner, and the functions
-- it calls may no longer be called by anyone else with a row of their own making.
ALTER FUNCTION {schema}.settle_call() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {schema}.settle_recorded_call({schema}.model_calls) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.settle_budget_by_budget({schema}.model_calls) FROM PUBLIC;

-- 4. A recorded call's token counts are never negative (its money follows from them). Checked
-- for the rows written from now on: the rows already recorded are not read again.
ALTER TABLE {schema}.model_calls ADD CONSTRAINT model_calls_counts_not_negative
  CHECK (input_tokens >= 0 AND output_tokens >= 0 AND cache_read_tokens >= 0
    AND cache_write_tokens >= 0 AND cache_write_1h_tokens >= 0 AND reasoning_tokens >= 0)
  NOT VALID;
