-- change: additive
-- An operator role apart from the worker role (issue 42): operators set prices, budgets and
-- limits and cancel batches; workers read them and change budget counters, holds and doubts
-- only through the functions that admit, settle and prune calls. Expand only: every function
-- here runs as the ledger's owner (SECURITY DEFINER, with a fixed search path), so it works
-- for a worker whatever its table grants; the grants themselves stay as they were until an
-- operator splits the roles (`idempotent-jobs db migrate --split-roles`, recorded below), once
-- every worker runs a release that writes through these functions.

-- Settings of the ledger an operator chose (`split_roles`: the worker role was left only what
-- workers need; migrate keeps it so).
CREATE TABLE {schema}.ledger_options (
    name    text PRIMARY KEY,
    value   text NOT NULL,
    set_at  timestamptz NOT NULL DEFAULT now(),
    set_by  text
);

-- A job's spec declares its budgets (arrays, one element per budget): one the ledger does not
-- hold is added (`spec`), with its period's spend so far; a group budget gains the job as a
-- member; one the ledger holds at another amount is never overwritten, and is returned.
CREATE FUNCTION {schema}.declare_spec_budgets(p_job text, p_ids text[], p_scopes text[],
    p_names text[], p_units text[], p_periods text[], p_amounts numeric[])
RETURNS TABLE (budget_id text, declared numeric, held numeric, held_by text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
  WITH wanted AS (
    SELECT * FROM unnest(p_ids, p_scopes, p_names, p_units, p_periods, p_amounts)
      AS w(budget_id, scope, scope_name, unit, period, amount)
  ), added AS (
    INSERT INTO {schema}.spend_budgets AS b (budget_id, scope, scope_name, unit, period,
      amount, jobs, declared_by)
    SELECT w.budget_id, w.scope, w.scope_name, w.unit, w.period, w.amount, ARRAY[p_job], 'spec'
    FROM wanted AS w
    ON CONFLICT (budget_id) DO UPDATE SET jobs = b.jobs || EXCLUDED.jobs
      WHERE NOT (p_job = ANY(b.jobs))
    RETURNING b.budget_id, CASE WHEN xmax = 0
      THEN {schema}.count_period(b.budget_id, b.scope, b.unit, b.period, b.jobs) END
  )
  SELECT b.budget_id, w.amount, b.amount,
    b.declared_by || COALESCE(' ' || b.set_by, '') || ' at '
      || to_char(b.set_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC'
  FROM wanted AS w JOIN {schema}.spend_budgets AS b USING (budget_id)
  WHERE b.amount <> w.amount
  ORDER BY 1
$body$;

-- A job's spec declares a provider rate limit: written only when it differs from the row, and
-- never over a limit an operator set (`idempotent-jobs limits set` stands until deleted).
CREATE FUNCTION {schema}.declare_spec_rate_limit(p_provider text, p_model text, p_key text,
    p_requests integer, p_tokens bigint, p_window integer, p_by text)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
  INSERT INTO {schema}.rate_limits AS l (provider, model, key_name, requests_per_window,
    tokens_per_window, window_seconds, declared_by)
  SELECT p_provider, p_model, p_key, p_requests, p_tokens, p_window, p_by
  WHERE NOT EXISTS (SELECT FROM {schema}.rate_limits AS d WHERE d.provider = p_provider
    AND d.model = p_model AND d.key_name = p_key
    AND (d.declared_by = 'operator' OR (
      d.requests_per_window IS NOT DISTINCT FROM p_requests
      AND d.tokens_per_window IS NOT DISTINCT FROM p_tokens
      AND d.window_seconds = p_window)))
  ON CONFLICT (provider, model, key_name) DO UPDATE
    SET requests_per_window = EXCLUDED.requests_per_window,
      tokens_per_window = EXCLUDED.tokens_per_window, window_seconds = EXCLUDED.window_seconds,
      declared_by = EXCLUDED.declared_by, updated_at = now()
    WHERE l.declared_by <> 'operator'
  RETURNING l.provider
$body$;

-- Count (or, with `p_apply`, delete) a job's spend rows older than the longest budget period:
-- the current and the previous calendar month (UTC, database clock) are kept, whatever the
-- caller asks, so retention never touches a period a budget still counts. Rows of the job's
-- `spend_days`, and the counters, holds and doubts of budgets covering it, of earlier periods.
CREATE FUNCTION {schema}.prune_spend(p_job text, p_apply boolean) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  before date := (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month')::date;
  ids text[] := ARRAY(SELECT b.budget_id FROM {schema}.spend_budgets AS b
    WHERE p_job = ANY(b.jobs));
  found bigint;
BEGIN
  SELECT (SELECT count(*) FROM {schema}.spend_days WHERE job_name = p_job AND day < before)
    + (SELECT count(*) FROM {schema}.budget_counters
      WHERE budget_id = ANY(ids) AND period_start < before)
    + (SELECT count(*) FROM {schema}.budget_holds
      WHERE budget_id = ANY(ids) AND period_start < before)
    + (SELECT count(*) FROM {schema}.budget_doubts
      WHERE budget_id = ANY(ids) AND period_start < before)
  INTO found;
  IF p_apply THEN
    DELETE FROM {schema}.spend_days WHERE job_name = p_job AND day < before;
    DELETE FROM {schema}.budget_counters WHERE budget_id = ANY(ids) AND period_start < before;
    DELETE FROM {schema}.budget_holds WHERE budget_id = ANY(ids) AND period_start < before;
    DELETE FROM {schema}.budget_doubts WHERE budget_id = ANY(ids) AND period_start < before;
  END IF;
  RETURN found;
END
$body$;

-- What admits and settles a call runs as the ledger's owner, whoever calls it.
ALTER FUNCTION {schema}.reserve_budget(text, integer, text, bigint, bigint, bigint, text, text,
  text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {schema}.release_holds(text, integer, text)
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- Settling writes counters, holds and doubts: as the owner. The triggers around it stay the
-- caller's (a definer's switch costs every recorded call, budget or none): pricing a call
-- reads what workers may read, and `spend_days` (the earlier releases' statistics, which no
-- budget reads) stays theirs to write.
ALTER FUNCTION {schema}.settle_recorded_call({schema}.model_calls)
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {schema}.count_period(text, text, text, text, text[])
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- Settling a call in doubt is the operator's: not every role that may call a function.
ALTER FUNCTION {schema}.settle_doubt(bigint, bigint, bigint, text)
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {schema}.settle_doubt(bigint, bigint, bigint, text) FROM PUBLIC;
