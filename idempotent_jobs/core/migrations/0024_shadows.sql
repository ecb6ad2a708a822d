-- change: additive
-- Shadow runs (issue 46): a new version's answer computed on stored runs' raw inputs, paid and
-- recorded like any call, compared with the accepted answer, never accepted nor delivered
-- until a promotion re-delivers the changed ones through revisions. Expand only: the previous
-- release's workers never read these tables, and a shadow's call is an ordinary row of
-- `model_calls` to them (outcome `shadow`, its own worker id), priced and settled by the same
-- triggers, so every budget counts it.
--
-- Lifecycle (`state`): `started` (its items chosen, nothing sent), `submitted` (the batch lane:
-- the provider's batch id recorded), `collected` (every item answered, failed or missing),
-- `compared` (every item has its verdict; `summary` holds the counts), then `promoting` (a
-- promotion under way: revisions being accepted), `promoted` or `dropped`. A shadow has its own
-- lease, fenced by its epoch, so a process killed at any point is taken over by the next one
-- and nothing is paid twice: `submit_started_at` is committed before the create call, and a
-- shadow with one and no provider id is looked up at the provider first.
CREATE TABLE {schema}.shadows (
    shadow_id          text PRIMARY KEY CHECK (shadow_id ~ '^sh-[0-9a-f]+$' AND length(shadow_id) = 15),
    job_name           text NOT NULL,
    baseline_version   text NOT NULL,
    version            text NOT NULL,
    lane               text NOT NULL CHECK (lane IN ('batch', 'online')),
    state              text NOT NULL DEFAULT 'started' CHECK (state IN ('started', 'submitted',
                         'collected', 'compared', 'promoting', 'promoted', 'dropped')),
    -- The most this shadow may spend, in the ledger's currency (NULL: only the job's budgets).
    budget             numeric CHECK (budget > 0 AND budget <= 1e18),
    selection          jsonb NOT NULL,
    -- What its calls cost so far and what its pending items hold, kept as they change, so an
    -- admission under `budget` reads one row whatever the shadow's size.
    spent_total        numeric NOT NULL DEFAULT 0,
    held_total         numeric NOT NULL DEFAULT 0,
    provider           text,
    model              text,
    config_parts       jsonb,
    provider_batch_id  text,
    submit_started_at  timestamptz,
    duplicates         integer NOT NULL DEFAULT 0,
    lease_owner        text,
    lease_epoch        integer NOT NULL DEFAULT 0,
    lease_expires_at   timestamptz,
    summary            jsonb,
    error              text,
    revise             boolean NOT NULL DEFAULT false,
    channels           text[],
    requested_by       text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    promoted_at        timestamptz,
    dropped_at         timestamptz
);
CREATE INDEX shadows_job ON {schema}.shadows (job_name, version, state);

-- One row per stored run a shadow computes: the run's revision and checkpoint as chosen (an
-- answer is promoted only while the run is still on them), what the hold took (`held`, given
-- back when its call is recorded), the answer and whether it is valid, the paid call, and the
-- comparison's verdict: `agree`, `differ`, `new` (the run has no accepted answer: a
-- quarantined run that failed), `invalid` (outside the schema or refused by the
-- job's validator), `failed` (the provider's error for it) or `missing` (no result: nothing
-- paid). `promoted_revision`: the revision its answer was accepted under by the promotion.
CREATE TABLE {schema}.shadow_items (
    shadow_id          text NOT NULL REFERENCES {schema}.shadows ON DELETE CASCADE,
    run_id             text NOT NULL,
    revision           integer NOT NULL,
    input_fingerprint  text,
    state              text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'answered',
                         'failed', 'missing')),
    held               numeric NOT NULL DEFAULT 0,
    answer             jsonb,
    valid              boolean,
    error              text,
    call_id            bigint,
    money              numeric,
    input_tokens       bigint,
    output_tokens      bigint,
    verdict            text CHECK (verdict IN ('agree', 'differ', 'new', 'invalid', 'failed',
                         'missing')),
    score              double precision,
    detail             jsonb,
    answered_at        timestamptz,
    promoted_revision  integer,
    PRIMARY KEY (shadow_id, run_id)
);
CREATE INDEX shadow_items_run ON {schema}.shadow_items (run_id);

-- A shadow's calls are the job's paid calls (every report and budget counts them), told apart
-- by the shadow that made them; never an answer of the run until a promotion accepts it.
ALTER TABLE {schema}.model_calls
  ADD COLUMN shadow_id text,
  DROP CONSTRAINT model_calls_outcome_check,
  ADD CONSTRAINT model_calls_outcome_check
    CHECK (outcome IN ('accepted', 'stale', 'rejected', 'failed', 'lease_lost', 'answered',
      'shadow'));
CREATE INDEX model_calls_shadow ON {schema}.model_calls (shadow_id) WHERE shadow_id IS NOT NULL;

-- Admit one shadow item's request, or refuse it: fenced to the shadow's lease (`lease_lost`);
-- under the shadow's own budget (its calls' money so far and what its pending items hold, kept
-- on its row, plus this request's worst case at the price in force, must fit: `refused`, or `unpriced`
-- when the model has no price), then under every budget of the job, as any request of the
-- run is (`reserve_budget`, holding under the shadow's own worker id and epoch 0, so the
-- call's row finds its hold and is priced by it). A request held already is held again (its
-- hold replaced). Returns reserve_budget's row, with what the shadow itself held.
CREATE FUNCTION {schema}.admit_shadow_item(p_shadow text, p_owner text, p_epoch integer,
    p_run text, max_input bigint, max_output bigint, requested text, call_tier text)
RETURNS TABLE (outcome text, budget_id text, amount numeric, spent numeric,
    reserved numeric, wanted numeric, period_start date, subject_id text)
LANGUAGE plpgsql AS $body$
DECLARE
  s record;
  r record;
  p {schema}.price_history;
  want numeric := 0;
  prior numeric;
  used numeric;
  v record;
BEGIN
  SELECT x.shadow_id, x.budget, x.spent_total, x.held_total INTO s FROM {schema}.shadows AS x
  WHERE x.shadow_id = p_shadow AND x.lease_owner = p_owner AND x.lease_epoch = p_epoch
    AND x.state IN ('started', 'submitted')
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'lease_lost'::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, NULL::numeric, NULL::date, NULL::text;
    RETURN;
  END IF;
  SELECT x.job_name, x.subject_id INTO r FROM {schema}.runs AS x WHERE x.run_id = p_run;
  SELECT i.held INTO prior FROM {schema}.shadow_items AS i
  WHERE i.shadow_id = p_shadow AND i.run_id = p_run;
  prior := COALESCE(prior, 0);
  IF s.budget IS NOT NULL THEN
    SELECT * INTO p FROM {schema}.price_in_force(requested, NULL, call_tier, now());
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'unpriced'::text, 'shadow:money/total:' || p_shadow, s.budget, NULL::numeric,
        NULL::numeric, NULL::numeric, NULL::date, NULL::text;
      RETURN;
    END IF;
    want := (COALESCE(max_input, 0) * GREATEST(p.input_per_million,
        COALESCE(p.cache_write_per_million, 0), COALESCE(p.cache_write_1h_per_million, 0),
        COALESCE(p.cache_read_per_million, 0))
      + COALESCE(max_output, 0) * GREATEST(p.output_per_million,
        COALESCE(p.reasoning_per_million, 0))) / 1000000;
    used := s.spent_total + s.held_total - prior;
    IF used + want > s.budget THEN
      RETURN QUERY SELECT 'refused'::text, 'shadow:money/total:' || p_shadow, s.budget, used,
        0::numeric, want, NULL::date, NULL::text;
      RETURN;
    END IF;
  END IF;
  SELECT * INTO v FROM {schema}.reserve_budget(p_run, 0, 'shadow:' || p_shadow, max_input,
    max_output, NULL, requested, NULL, call_tier, r.job_name, r.subject_id);
  IF v.outcome = 'admitted' THEN
    UPDATE {schema}.shadow_items AS i SET held = want
    WHERE i.shadow_id = p_shadow AND i.run_id = p_run;
    UPDATE {schema}.shadows AS x SET held_total = x.held_total - prior + want
    WHERE x.shadow_id = p_shadow;
  END IF;
  RETURN QUERY SELECT v.outcome, v.budget_id, v.amount, v.spent, v.reserved, v.wanted,
    v.period_start, v.subject_id;
END
$body$;
