-- change: additive
-- Costs you can bill by, and caps that hold (issue 34). Expand only: the previous release's
-- workers keep recording calls without the new columns, reading model_prices and checking
-- budgets against spend_days; none of that is removed here (a later contracting release may).

-- 1. Usage as providers report it. input_tokens counts every input token (cache reads and
-- cache writes included) and output_tokens every output token (reasoning included), as
-- OpenTelemetry's GenAI conventions count them; these columns break the parts out.
-- cache_write_1h_tokens: the part of cache_write_tokens written for an hour (Anthropic's
-- 1-hour cache, priced at twice the input price where the 5-minute cache is 1.25x).
-- tier: the provider's service tier (`batch` for a batch lane); NULL is the standard tier.
ALTER TABLE {schema}.model_calls
  ADD COLUMN cache_read_tokens bigint,
  ADD COLUMN cache_write_tokens bigint,
  ADD COLUMN cache_write_1h_tokens bigint,
  ADD COLUMN reasoning_tokens bigint,
  ADD COLUMN provider_name text,
  ADD COLUMN tier text;

-- 2. One currency per ledger, held by the database: every price names it through a foreign
-- key, so two operators setting prices in two currencies at once cannot both succeed.
CREATE TABLE {schema}.ledger_currency (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    currency  text NOT NULL UNIQUE CHECK (currency ~ '^[A-Z][A-Z][A-Z]$'),
    set_at    timestamptz NOT NULL DEFAULT now()
);

-- 3. Prices with history: a price applies from `effective_from` on, and a call is priced at
-- the price in force when it was made (price_in_force), so a change never re-prices earlier
-- calls. A model is matched by exact name, then by the longest declared prefix (`gpt-4o`
-- covers `gpt-4o-2024-08-06`); a tier's own price (`batch`) over the standard one. Prices are
-- per million tokens, unconstrained numeric: 10^-9 per token (10^-3 per million) is exact.
-- NULL part prices fall back: cache reads and writes to the input price, 1-hour cache writes
-- to the cache write price, reasoning to the output price.
CREATE TABLE {schema}.price_history (
    model_pattern               text NOT NULL CHECK (length(model_pattern) BETWEEN 1 AND 200),
    match_kind                  text NOT NULL DEFAULT 'exact'
                                CHECK (match_kind IN ('exact', 'prefix')),
    tier                        text NOT NULL DEFAULT 'standard',
    effective_from              timestamptz NOT NULL,
    currency                    text NOT NULL REFERENCES {schema}.ledger_currency (currency),
    input_per_million           numeric NOT NULL
                                CHECK (input_per_million >= 0 AND input_per_million < 1e9),
    output_per_million          numeric NOT NULL
                                CHECK (output_per_million >= 0 AND output_per_million < 1e9),
    cache_read_per_million      numeric
                                CHECK (cache_read_per_million >= 0 AND cache_read_per_million < 1e9),
    cache_write_per_million     numeric
                                CHECK (cache_write_per_million >= 0 AND cache_write_per_million < 1e9),
    cache_write_1h_per_million  numeric CHECK (cache_write_1h_per_million >= 0
                                  AND cache_write_1h_per_million < 1e9),
    reasoning_per_million       numeric
                                CHECK (reasoning_per_million >= 0 AND reasoning_per_million < 1e9),
    set_at                      timestamptz NOT NULL DEFAULT now(),
    set_by                      text,
    PRIMARY KEY (model_pattern, match_kind, tier, effective_from)
);

-- The prices an earlier release set apply to every call before and after (their history is
-- unknown: in force from 1900, which the commands show as `always`), in the currency of the
-- latest one.
INSERT INTO {schema}.ledger_currency (currency)
SELECT currency FROM {schema}.model_prices ORDER BY set_at DESC LIMIT 1;
INSERT INTO {schema}.price_history (model_pattern, match_kind, tier, effective_from, currency,
  input_per_million, output_per_million, set_at, set_by)
SELECT p.model_name, 'exact', 'standard', '1900-01-01 00:00:00+00', p.currency,
  p.input_per_million, p.output_per_million, p.set_at, p.set_by
FROM {schema}.model_prices AS p JOIN {schema}.ledger_currency AS c USING (currency);

-- The price in force for a call of `requested` (else `answered`, the response's model name)
-- at `at` in `tier`: the tier's own price over the standard one, the requested name over the
-- answered one, an exact name over a prefix, a longer prefix over a shorter, the latest
-- `effective_from` not after `at`. No row: no price (the call's money is unknown).
CREATE FUNCTION {schema}.price_in_force(requested text, answered text, call_tier text,
    at timestamptz)
RETURNS SETOF {schema}.price_history LANGUAGE sql STABLE AS $body$
  SELECT p.* FROM {schema}.price_history AS p
  JOIN (VALUES (requested, 0), (answered, 1)) AS n(name, rank) ON n.name IS NOT NULL
  WHERE p.effective_from <= at
    AND p.tier IN (COALESCE(call_tier, 'standard'), 'standard')
    AND ((p.match_kind = 'exact' AND p.model_pattern = n.name)
      OR (p.match_kind = 'prefix' AND starts_with(n.name, p.model_pattern)))
  ORDER BY p.tier = COALESCE(call_tier, 'standard') DESC, n.rank, p.match_kind = 'exact' DESC,
    length(p.model_pattern) DESC, p.effective_from DESC
  LIMIT 1
$body$;

-- What a call's usage costs at a price: each kind of token at its own price. NULL when the
-- call reported no usage, or there is no price (unknown, never 0).
CREATE FUNCTION {schema}.usage_money(input bigint, output bigint, cache_read bigint,
    cache_write bigint, cache_write_1h bigint, reasoning bigint, p {schema}.price_history)
RETURNS numeric LANGUAGE sql IMMUTABLE AS $body$
  SELECT CASE WHEN input IS NULL AND output IS NULL THEN NULL ELSE (
      GREATEST(COALESCE(input, 0) - COALESCE(cache_read, 0) - COALESCE(cache_write, 0), 0)
        * p.input_per_million
    + COALESCE(cache_read, 0) * COALESCE(p.cache_read_per_million, p.input_per_million)
    + GREATEST(COALESCE(cache_write, 0) - COALESCE(cache_write_1h, 0), 0)
        * COALESCE(p.cache_write_per_million, p.input_per_million)
    + COALESCE(cache_write_1h, 0) * COALESCE(p.cache_write_1h_per_million,
        p.cache_write_per_million, p.input_per_million)
    + GREATEST(COALESCE(output, 0) - COALESCE(reasoning, 0), 0) * p.output_per_million
    + COALESCE(reasoning, 0) * COALESCE(p.reasoning_per_million, p.output_per_million)
  ) / 1000000 END
$body$;

-- 4. Budgets, kept in the ledger: what every deployment enforces and every command shows.
-- budget_id: `<scope>:<unit>/<period>:<name>` (`job:tokens/day:daily_digest`,
-- `group:money/month:team-a`). scope `job`: the job's calls; `subject`: each subject of the
-- job on its own; `group`: the calls of every job in `jobs` together (a team's).
-- Periods are UTC days and calendar months by the database clock.
CREATE TABLE {schema}.spend_budgets (
    budget_id    text PRIMARY KEY,
    scope        text NOT NULL CHECK (scope IN ('job', 'subject', 'group')),
    scope_name   text NOT NULL,
    unit         text NOT NULL CHECK (unit IN ('tokens', 'money')),
    period       text NOT NULL CHECK (period IN ('day', 'month')),
    amount       numeric NOT NULL CHECK (amount > 0 AND amount <= 1e18),
    jobs         text[] NOT NULL CHECK (cardinality(jobs) >= 1),
    declared_by  text NOT NULL CHECK (declared_by IN ('operator', 'spec')),
    set_at       timestamptz NOT NULL DEFAULT now(),
    set_by       text,
    -- The id names the budget: one per scope, name, unit and period, kept by the primary key
    -- alone (a second unique index would refuse a racing first declaration ON CONFLICT
    -- (budget_id) lets through).
    CHECK (budget_id = scope || ':' || unit || '/' || period || ':' || scope_name)
);
CREATE INDEX spend_budgets_jobs ON {schema}.spend_budgets USING gin (jobs);

-- One row per budget, period and (for a subject budget) subject: spent (settled calls) and
-- reserved (calls admitted and not yet recorded), in the budget's unit. A call is admitted
-- only while spent + reserved + its worst case <= amount, under the row's lock.
CREATE TABLE {schema}.budget_counters (
    budget_id      text NOT NULL REFERENCES {schema}.spend_budgets ON DELETE CASCADE,
    period_start   date NOT NULL,
    subject_id     text NOT NULL DEFAULT '',
    spent          numeric NOT NULL DEFAULT 0,
    reserved       numeric NOT NULL DEFAULT 0,
    calls          bigint NOT NULL DEFAULT 0,
    unknown_calls  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (budget_id, period_start, subject_id)
);

-- What an admitted request holds of each budget until its call is recorded (then settled to
-- the call's real usage, or charged in full when the call reported none) or until it is
-- released (its attempt ended without sending it).
CREATE TABLE {schema}.budget_holds (
    run_id        text NOT NULL,
    lease_epoch   integer NOT NULL,
    worker_id     text NOT NULL,
    budget_id     text NOT NULL REFERENCES {schema}.spend_budgets ON DELETE CASCADE,
    period_start  date NOT NULL,
    subject_id    text NOT NULL,
    amount        numeric NOT NULL,
    held_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, lease_epoch, worker_id, budget_id)
);

CREATE FUNCTION {schema}.period_start(period text, at timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE AS $body$
  SELECT CASE period WHEN 'day' THEN (at AT TIME ZONE 'UTC')::date
    ELSE date_trunc('month', at AT TIME ZONE 'UTC')::date END
$body$;

-- Count what a new budget's current period has spent already (the calls of its jobs since the
-- period began, each at the price in force when it was made), so a budget set or declared
-- mid-period starts where the period stands. A counter that exists is left as it is.
CREATE FUNCTION {schema}.count_period(p_budget text, p_scope text, p_unit text, p_period text,
    p_jobs text[])
RETURNS void LANGUAGE sql AS $body$
  INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id, spent, calls,
    unknown_calls)
  SELECT p_budget, {schema}.period_start(p_period, now()),
    CASE WHEN p_scope = 'subject' THEN r.subject_id ELSE '' END,
    sum(CASE WHEN p_unit = 'tokens'
      THEN COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0)
      ELSE COALESCE({schema}.usage_money(c.input_tokens, c.output_tokens, c.cache_read_tokens,
        c.cache_write_tokens, c.cache_write_1h_tokens, c.reasoning_tokens, p), 0) END),
    count(*), count(*) FILTER (WHERE c.input_tokens IS NULL AND c.output_tokens IS NULL)
  FROM {schema}.model_calls AS c
  JOIN {schema}.runs AS r ON r.run_id = c.run_id AND r.job_name = ANY(p_jobs)
  LEFT JOIN LATERAL {schema}.price_in_force(c.requested_model, c.model_name, c.tier,
    c.called_at) AS p ON p_unit = 'money'
  WHERE c.called_at >= {schema}.period_start(p_period, now())
  GROUP BY 1, 2, 3
  ON CONFLICT ON CONSTRAINT budget_counters_pkey DO NOTHING
$body$;

-- Give back an attempt's unsettled holds (its request was never sent, or a new request's
-- hold replaces it).
CREATE FUNCTION {schema}.release_holds(p_run_id text, p_epoch integer, p_worker text)
RETURNS void LANGUAGE plpgsql AS $body$
DECLARE
  h record;
BEGIN
  FOR h IN DELETE FROM {schema}.budget_holds
    WHERE run_id = p_run_id AND lease_epoch = p_epoch AND worker_id = p_worker
    RETURNING budget_id, period_start, subject_id, amount
  LOOP
    UPDATE {schema}.budget_counters SET reserved = reserved - h.amount
    WHERE budget_id = h.budget_id AND period_start = h.period_start
      AND subject_id = h.subject_id;
  END LOOP;
END
$body$;

-- Admit one request of a run under every budget that covers its job, or refuse it.
-- Fenced to the lease (`lease_lost`). The worst case is `max_input` tokens at the dearest
-- input price (a cache write may cost more than a plain read) plus `max_output` at the
-- dearest output price, plus `max_total` (a step's declared ceiling, input or output) at the
-- dearest of all. With none given the request is only checked: admitted while spent and held
-- are under the cap. Each counter row is taken in budget order by one conditional UPDATE
-- (admitted: the worst case is added under the row's lock); a refusal under one budget gives
-- back what this call added to those before it: admitted under all, or under none. A money
-- budget and a model with no price refuse (`unpriced`): a call that cannot be priced cannot
-- be capped.
-- Returns one row: outcome `admitted`, `refused`, `unpriced` or `lease_lost`, and for a
-- refusal the budget, its amount, what was spent and reserved, and what the call wanted.
-- `fenced_job` and `fenced_subject`: the run's, given by a statement that has just proved the
-- lease under its row lock (the checkpoint, the takeover), which need not be proved again.
CREATE FUNCTION {schema}.reserve_budget(p_run_id text, p_epoch integer, p_worker text,
    max_input bigint, max_output bigint, max_total bigint, requested text, answered text,
    call_tier text, fenced_job text DEFAULT NULL, fenced_subject text DEFAULT NULL)
RETURNS TABLE (outcome text, budget_id text, amount numeric, spent numeric,
    reserved numeric, wanted numeric, period_start date, subject_id text)
LANGUAGE plpgsql AS $body$
DECLARE
  r record;
  b record;
  c record;
  p {schema}.price_history;
  priced boolean;
  want numeric;
  start date;
  subject text;
  ids text[] := ARRAY[]::text[];
  starts date[] := ARRAY[]::date[];
  subjects text[] := ARRAY[]::text[];
  wants numeric[] := ARRAY[]::numeric[];
  admitted boolean;
BEGIN
  IF fenced_job IS NOT NULL THEN
    SELECT fenced_job AS job_name, fenced_subject AS subject_id INTO r;
  ELSE
    SELECT x.job_name, x.subject_id INTO r FROM {schema}.runs AS x
    WHERE x.run_id = p_run_id AND x.status = 'running' AND x.lease_owner = p_worker
      AND x.lease_epoch = p_epoch;
  END IF;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'lease_lost'::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, NULL::numeric, NULL::date, NULL::text;
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM {schema}.budget_holds AS x WHERE x.run_id = p_run_id
      AND x.lease_epoch = p_epoch AND x.worker_id = p_worker) THEN
    PERFORM {schema}.release_holds(p_run_id, p_epoch, p_worker);  -- replaced by this one
  END IF;
  FOR b IN SELECT * FROM {schema}.spend_budgets AS s WHERE r.job_name = ANY(s.jobs)
    ORDER BY s.budget_id
  LOOP
    IF b.unit = 'money' AND priced IS NULL THEN  -- looked up once, for a money budget only
      SELECT * INTO p FROM {schema}.price_in_force(requested, answered, call_tier, now());
      priced := FOUND;
    END IF;
    IF b.unit = 'tokens' THEN
      want := COALESCE(max_input, 0) + COALESCE(max_output, 0) + COALESCE(max_total, 0);
    ELSIF NOT priced THEN
      want := NULL;
    ELSE
      want := (COALESCE(max_input, 0) * GREATEST(p.input_per_million,
          COALESCE(p.cache_write_per_million, 0), COALESCE(p.cache_write_1h_per_million, 0),
          COALESCE(p.cache_read_per_million, 0))
        + COALESCE(max_output, 0) * GREATEST(p.output_per_million,
          COALESCE(p.reasoning_per_million, 0))
        + COALESCE(max_total, 0) * GREATEST(p.input_per_million, p.output_per_million,
          COALESCE(p.cache_write_per_million, 0), COALESCE(p.cache_write_1h_per_million, 0),
          COALESCE(p.cache_read_per_million, 0), COALESCE(p.reasoning_per_million, 0))
        ) / 1000000;
    END IF;
    start := {schema}.period_start(b.period, now());
    subject := CASE WHEN b.scope = 'subject' THEN r.subject_id ELSE '' END;
    IF want = 0 THEN  -- only checked: read, not written (no row yet: nothing spent)
      admitted := NOT EXISTS (SELECT FROM {schema}.budget_counters AS k
        WHERE k.budget_id = b.budget_id AND k.period_start = start
          AND k.subject_id = subject AND k.spent + k.reserved >= b.amount);
    ELSIF want IS NOT NULL THEN
      FOR tries IN 1 .. 2 LOOP
        UPDATE {schema}.budget_counters AS k SET reserved = k.reserved + want
        WHERE k.budget_id = b.budget_id AND k.period_start = start
          AND k.subject_id = subject
          AND k.spent + k.reserved + want <= b.amount AND k.spent + k.reserved < b.amount;
        admitted := FOUND;
        EXIT WHEN admitted OR tries = 2;
        -- No row (the period's first call, perhaps made by a racing call meanwhile) or no
        -- room: with the row there now, tried once more.
        INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id)
        VALUES (b.budget_id, start, subject) ON CONFLICT DO NOTHING;
      END LOOP;
    END IF;
    IF want IS NULL OR NOT admitted THEN
      -- Refused (or unpriced): what this call added to the budgets before this one goes back.
      FOR i IN 1 .. COALESCE(cardinality(ids), 0) LOOP
        UPDATE {schema}.budget_counters AS k SET reserved = k.reserved - wants[i]
        WHERE k.budget_id = ids[i] AND k.period_start = starts[i]
          AND k.subject_id = subjects[i];
      END LOOP;
      IF want IS NULL THEN
        RETURN QUERY SELECT 'unpriced'::text, b.budget_id, b.amount, NULL::numeric,
          NULL::numeric, NULL::numeric, NULL::date, NULL::text;
        RETURN;
      END IF;
      SELECT * INTO c FROM {schema}.budget_counters AS k
      WHERE k.budget_id = b.budget_id AND k.period_start = start AND k.subject_id = subject;
      RETURN QUERY SELECT 'refused'::text, b.budget_id, b.amount, c.spent, c.reserved, want,
        start, subject;
      RETURN;
    END IF;
    ids := ids || b.budget_id;
    starts := starts || start;
    subjects := subjects || subject;
    wants := wants || want;
  END LOOP;
  -- A check only (nothing wanted) holds nothing.
  INSERT INTO {schema}.budget_holds (run_id, lease_epoch, worker_id, budget_id, period_start,
    subject_id, amount)
  SELECT p_run_id, p_epoch, p_worker, h.id, h.start, h.subject, h.want
  FROM unnest(ids, starts, subjects, wants) AS h(id, start, subject, want)
  WHERE h.want > 0;
  RETURN QUERY SELECT 'admitted'::text, NULL::text, NULL::numeric, NULL::numeric,
    NULL::numeric, NULL::numeric, NULL::date, NULL::text;
END
$body$;

-- Every recorded call is settled against every budget that covers its job, in the transaction
-- that records it: its hold (if its request was admitted under one) is replaced by what the
-- call really cost; a call that reported no usage is charged its hold and counted unknown. A
-- call with no hold (an earlier release's worker, a model step that declared no worst case, a
-- budget set since) is charged what it cost, in the current period.
CREATE FUNCTION {schema}.settle_call() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
  r record;
  b record;
  p {schema}.price_history;
  priced boolean;
  unknown boolean := NEW.input_tokens IS NULL AND NEW.output_tokens IS NULL;
  cost numeric;
  actual numeric;
  held_ids text[];
  held_starts date[];
  held_subjects text[];
  held_amounts numeric[];
  i integer;
BEGIN
  IF NOT EXISTS (SELECT FROM {schema}.spend_budgets) THEN
    RETURN NULL;
  END IF;
  SELECT x.job_name, x.subject_id INTO r FROM {schema}.runs AS x WHERE x.run_id = NEW.run_id;
  -- The attempt's holds, taken off at once (in budget order, as reserve_budget took them).
  WITH gone AS (
    DELETE FROM {schema}.budget_holds AS x
    WHERE x.run_id = NEW.run_id AND x.lease_epoch = NEW.lease_epoch
      AND x.worker_id = NEW.worker_id
    RETURNING x.budget_id, x.period_start, x.subject_id, x.amount
  )
  SELECT array_agg(g.budget_id ORDER BY g.budget_id), array_agg(g.period_start ORDER BY
      g.budget_id), array_agg(g.subject_id ORDER BY g.budget_id),
    array_agg(g.amount ORDER BY g.budget_id)
  INTO held_ids, held_starts, held_subjects, held_amounts FROM gone AS g;
  -- In budget order, as reserve_budget locks counter rows: two statements never wait on each
  -- other's rows in opposite orders.
  FOR b IN SELECT * FROM {schema}.spend_budgets AS s
    WHERE r.job_name = ANY(s.jobs) OR s.budget_id = ANY(held_ids)
    ORDER BY s.budget_id
  LOOP
    IF b.unit = 'money' AND priced IS NULL THEN  -- priced once, for a money budget only
      SELECT * INTO p FROM {schema}.price_in_force(NEW.requested_model, NEW.model_name,
        NEW.tier, NEW.called_at);
      priced := FOUND;
      cost := CASE WHEN priced THEN {schema}.usage_money(NEW.input_tokens, NEW.output_tokens,
        NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.cache_write_1h_tokens,
        NEW.reasoning_tokens, p) END;
    END IF;
    actual := CASE WHEN b.unit = 'tokens'
      THEN COALESCE(NEW.input_tokens, 0) + COALESCE(NEW.output_tokens, 0) ELSE cost END;
    i := array_position(held_ids, b.budget_id);
    IF i IS NOT NULL THEN
      UPDATE {schema}.budget_counters AS k
      SET reserved = k.reserved - held_amounts[i],
        spent = k.spent + CASE WHEN unknown THEN held_amounts[i]
          ELSE COALESCE(actual, held_amounts[i]) END,
        calls = k.calls + 1, unknown_calls = k.unknown_calls + unknown::integer
      WHERE k.budget_id = b.budget_id AND k.period_start = held_starts[i]
        AND k.subject_id = held_subjects[i];
    ELSE
      -- No hold: charged what it cost; a call that reported no usage (or cannot be priced)
      -- and declared no worst case is charged all the room its budget had left, so the cap
      -- holds whatever it really cost.
      INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id, spent,
        calls, unknown_calls)
      VALUES (b.budget_id, {schema}.period_start(b.period, NEW.called_at),
        CASE WHEN b.scope = 'subject' THEN r.subject_id ELSE '' END,
        CASE WHEN unknown OR actual IS NULL THEN b.amount ELSE actual END, 1, unknown::integer)
      ON CONFLICT ON CONSTRAINT budget_counters_pkey DO UPDATE
      SET spent = k.spent + CASE WHEN unknown OR actual IS NULL
          THEN GREATEST(b.amount - k.spent - k.reserved, 0) ELSE actual END,
        calls = k.calls + 1, unknown_calls = k.unknown_calls + EXCLUDED.unknown_calls;
    END IF;
  END LOOP;
  RETURN NULL;
END
$body$;

CREATE TRIGGER model_calls_settle AFTER INSERT ON {schema}.model_calls
  FOR EACH ROW EXECUTE FUNCTION {schema}.settle_call();

-- The budgets earlier releases' workers declared become the ledger's, with today's spend.
INSERT INTO {schema}.spend_budgets (budget_id, scope, scope_name, unit, period, amount, jobs,
  declared_by, set_at)
SELECT 'job:tokens/day:' || job_name, 'job', job_name, 'tokens', 'day', tokens_per_day,
  ARRAY[job_name], 'spec', declared_at
FROM {schema}.budgets WHERE tokens_per_day IS NOT NULL
UNION ALL
SELECT 'subject:tokens/day:' || job_name, 'subject', job_name, 'tokens', 'day',
  tokens_per_subject_per_day, ARRAY[job_name], 'spec', declared_at
FROM {schema}.budgets WHERE tokens_per_subject_per_day IS NOT NULL;

INSERT INTO {schema}.budget_counters (budget_id, period_start, subject_id, spent, calls)
SELECT b.budget_id, s.day, CASE WHEN b.scope = 'subject' THEN s.subject_id ELSE '' END,
  sum(s.tokens), sum(s.calls)
FROM {schema}.spend_budgets AS b
JOIN {schema}.spend_days AS s ON s.job_name = b.scope_name
  AND s.day = (now() AT TIME ZONE 'UTC')::date
GROUP BY 1, 2, 3;
