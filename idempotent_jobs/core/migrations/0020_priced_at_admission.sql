-- change: additive
-- Costs you can bill by (issue 42): a call is priced once, by the price row in force when its
-- request was admitted; what the provider never billed costs nothing; a call whose outcome is
-- in doubt stays charged apart until an operator settles it. Expand only: the previous
-- release's workers keep inserting calls without the new columns (the trigger below prices
-- them) and keep calling reserve_budget with the same arguments.

-- 1. Every price row has an id a call can name, and says whether it corrected the past.
ALTER TABLE {schema}.price_history
  ADD COLUMN price_id bigint GENERATED ALWAYS AS IDENTITY,
  ADD COLUMN correction boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.price_history ADD CONSTRAINT price_history_price_id UNIQUE (price_id);

-- 2. Each call keeps the price row it was priced by and its money, decided as it is recorded
-- and never again. `billing`: `billed` (usage reported), `unbilled` (the provider answered
-- with an error and reported no usage: it bills nothing, money 0), `in_doubt` (no usage
-- known: a timeout after the request was sent, a connection cut mid-answer; its money is
-- unknown until settled) or `settled` (was in doubt; an operator gave the provider's figure).
ALTER TABLE {schema}.model_calls
  ADD COLUMN price_id bigint,
  ADD COLUMN money numeric,
  ADD COLUMN billing text CHECK (billing IN ('billed', 'unbilled', 'in_doubt', 'settled')),
  ADD COLUMN settled_at timestamptz,
  ADD COLUMN settled_by text;

-- The calls earlier releases recorded: priced as their reports priced them (at the price in
-- force when each was made), once, here.
UPDATE {schema}.model_calls AS c
SET price_id = p.price_id,
  money = {schema}.usage_money(c.input_tokens, c.output_tokens, c.cache_read_tokens,
    c.cache_write_tokens, c.cache_write_1h_tokens, c.reasoning_tokens, p),
  billing = CASE WHEN c.input_tokens IS NULL AND c.output_tokens IS NULL THEN 'in_doubt'
    ELSE 'billed' END
FROM {schema}.model_calls AS x
LEFT JOIN LATERAL {schema}.price_in_force(x.requested_model, x.model_name, x.tier,
  x.called_at) AS p ON true
WHERE x.call_id = c.call_id;

-- 3. A hold fixes the price of the request it admits (`price_fixed`; `price_id` NULL: the
-- model had no price then, and the call stays unpriced whatever is set later).
ALTER TABLE {schema}.budget_holds
  ADD COLUMN price_id bigint,
  ADD COLUMN price_fixed boolean NOT NULL DEFAULT false;

-- 4. What calls in doubt hold of each budget, apart from what was spent: admission counts it,
-- every report shows it apart, and `costs settle` turns it into spend.
ALTER TABLE {schema}.budget_counters
  ADD COLUMN in_doubt numeric NOT NULL DEFAULT 0;

CREATE TABLE {schema}.budget_doubts (
    call_id       bigint NOT NULL,
    budget_id     text NOT NULL REFERENCES {schema}.spend_budgets ON DELETE CASCADE,
    period_start  date NOT NULL,
    subject_id    text NOT NULL,
    amount        numeric NOT NULL,
    PRIMARY KEY (call_id, budget_id)
);

-- The price a call is recorded at: the one its admitting statement fixed (its attempt's hold),
-- else (no budget admitted it) the one in force as it is recorded. Its money follows from it,
-- here and nowhere else.
CREATE FUNCTION {schema}.price_call() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
  h record;
  p {schema}.price_history;
BEGIN
  SELECT x.price_id INTO h FROM {schema}.budget_holds AS x
  WHERE x.run_id = NEW.run_id AND x.lease_epoch = NEW.lease_epoch
    AND x.worker_id = NEW.worker_id AND x.price_fixed
  LIMIT 1;
  IF FOUND THEN
    IF h.price_id IS NOT NULL THEN
      SELECT * INTO p FROM {schema}.price_history AS x WHERE x.price_id = h.price_id;
    END IF;
  ELSE
    SELECT * INTO p FROM {schema}.price_in_force(NEW.requested_model, NEW.model_name, NEW.tier,
      now());
  END IF;
  NEW.price_id := p.price_id;
  NEW.billing := CASE
    WHEN NEW.input_tokens IS NULL AND NEW.output_tokens IS NULL THEN 'in_doubt'
    WHEN NEW.model_name IS NULL AND COALESCE(NEW.input_tokens, 0) = 0
      AND COALESCE(NEW.output_tokens, 0) = 0 THEN 'unbilled'
    ELSE 'billed' END;
  NEW.money := CASE WHEN NEW.billing = 'unbilled' THEN 0
    WHEN p.price_id IS NULL THEN NULL
    ELSE {schema}.usage_money(NEW.input_tokens, NEW.output_tokens, NEW.cache_read_tokens,
      NEW.cache_write_tokens, NEW.cache_write_1h_tokens, NEW.reasoning_tokens, p) END;
  RETURN NEW;
END
$body$;

CREATE TRIGGER model_calls_price BEFORE INSERT ON {schema}.model_calls
  FOR EACH ROW EXECUTE FUNCTION {schema}.price_call();

-- Admit one request, as migration 0018's reserve_budget, and fix its price: the price row in
-- force now is looked up once whenever a budget covers the job, and kept on the hold, so the
-- hold, the settled money and every report use that row. What calls in doubt hold counts
-- against the room as spend does. A check only (no worst case named) needs no price: a money
-- budget refuses an unpriced model when a request names its worst case.
CREATE OR REPLACE FUNCTION {schema}.reserve_budget(p_run_id text, p_epoch integer,
    p_worker text, max_input bigint, max_output bigint, max_total bigint, requested text,
    answered text, call_tier text, fenced_job text DEFAULT NULL,
    fenced_subject text DEFAULT NULL)
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
    IF priced IS NULL THEN  -- the price in force as the request is admitted, looked up once
      SELECT * INTO p FROM {schema}.price_in_force(requested, answered, call_tier, now());
      priced := FOUND;
    END IF;
    IF b.unit = 'tokens' OR num_nonnulls(max_input, max_output, max_total) = 0 THEN
      -- Tokens, or a check only (no worst case named: no price is needed to check).
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
          AND k.subject_id = subject AND k.spent + k.reserved + k.in_doubt >= b.amount);
    ELSIF want IS NOT NULL THEN
      FOR tries IN 1 .. 2 LOOP
        UPDATE {schema}.budget_counters AS k SET reserved = k.reserved + want
        WHERE k.budget_id = b.budget_id AND k.period_start = start
          AND k.subject_id = subject
          AND k.spent + k.reserved + k.in_doubt + want <= b.amount
          AND k.spent + k.reserved + k.in_doubt < b.amount;
        admitted := FOUND;
        EXIT WHEN admitted OR tries = 2;
        INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id)
        VALUES (b.budget_id, start, subject) ON CONFLICT DO NOTHING;
      END LOOP;
    END IF;
    IF want IS NULL OR NOT admitted THEN
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
      RETURN QUERY SELECT 'refused'::text, b.budget_id, b.amount, c.spent + c.in_doubt,
        c.reserved, want, start, subject;
      RETURN;
    END IF;
    ids := ids || b.budget_id;
    starts := starts || start;
    subjects := subjects || subject;
    wants := wants || want;
  END LOOP;
  INSERT INTO {schema}.budget_holds (run_id, lease_epoch, worker_id, budget_id, period_start,
    subject_id, amount, price_id, price_fixed)
  SELECT p_run_id, p_epoch, p_worker, h.id, h.start, h.subject, h.want, p.price_id, true
  FROM unnest(ids, starts, subjects, wants) AS h(id, start, subject, want)
  WHERE h.want > 0;
  RETURN QUERY SELECT 'admitted'::text, NULL::text, NULL::numeric, NULL::numeric,
    NULL::numeric, NULL::numeric, NULL::date, NULL::text;
END
$body$;

-- Settle a recorded call against every budget covering its job, in the transaction that
-- records it, at the money the call was priced at (price_call, above): its hold is replaced by
-- what it cost. A call the provider never billed costs 0: its hold is given back at once. A
-- call in doubt keeps its hold charged as `in_doubt` (a call with no hold: the room its budget
-- had left), recorded per budget in budget_doubts until `costs settle` or the period's end.
CREATE FUNCTION {schema}.settle_recorded_call(c {schema}.model_calls) RETURNS void
LANGUAGE plpgsql AS $body$
DECLARE
  r record;
  b record;
  doubt boolean := c.billing = 'in_doubt';
  actual numeric;
  charge numeric;
  room numeric;
  start date;
  subject text;
  held_ids text[];
  held_starts date[];
  held_subjects text[];
  held_amounts numeric[];
  i integer;
BEGIN
  SELECT x.job_name, x.subject_id INTO r FROM {schema}.runs AS x WHERE x.run_id = c.run_id;
  WITH gone AS (
    DELETE FROM {schema}.budget_holds AS x
    WHERE x.run_id = c.run_id AND x.lease_epoch = c.lease_epoch
      AND x.worker_id = c.worker_id
    RETURNING x.budget_id, x.period_start, x.subject_id, x.amount
  )
  SELECT array_agg(g.budget_id ORDER BY g.budget_id), array_agg(g.period_start ORDER BY
      g.budget_id), array_agg(g.subject_id ORDER BY g.budget_id),
    array_agg(g.amount ORDER BY g.budget_id)
  INTO held_ids, held_starts, held_subjects, held_amounts FROM gone AS g;
  FOR b IN SELECT * FROM {schema}.spend_budgets AS s
    WHERE r.job_name = ANY(s.jobs) OR s.budget_id = ANY(held_ids)
    ORDER BY s.budget_id
  LOOP
    actual := CASE WHEN b.unit = 'tokens'
      THEN COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0) ELSE c.money END;
    i := array_position(held_ids, b.budget_id);
    IF i IS NOT NULL THEN
      start := held_starts[i];
      subject := held_subjects[i];
      charge := held_amounts[i];
      UPDATE {schema}.budget_counters AS k
      SET reserved = k.reserved - charge,
        spent = k.spent + CASE WHEN doubt THEN 0 ELSE COALESCE(actual, charge) END,
        in_doubt = k.in_doubt + CASE WHEN doubt THEN charge ELSE 0 END,
        calls = k.calls + 1, unknown_calls = k.unknown_calls + doubt::integer
      WHERE k.budget_id = b.budget_id AND k.period_start = start AND k.subject_id = subject;
    ELSE
      -- No hold: charged what it cost; a call in doubt (or that cannot be priced) that
      -- declared no worst case is charged all the room its budget had left, so the cap holds
      -- whatever it really cost.
      start := {schema}.period_start(b.period, c.called_at);
      subject := CASE WHEN b.scope = 'subject' THEN r.subject_id ELSE '' END;
      INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id)
      VALUES (b.budget_id, start, subject) ON CONFLICT ON CONSTRAINT budget_counters_pkey
      DO NOTHING;
      SELECT GREATEST(b.amount - k.spent - k.reserved - k.in_doubt, 0) INTO room
      FROM {schema}.budget_counters AS k
      WHERE k.budget_id = b.budget_id AND k.period_start = start AND k.subject_id = subject
      FOR UPDATE;
      charge := CASE WHEN doubt THEN room END;
      UPDATE {schema}.budget_counters AS k
      SET spent = k.spent + CASE WHEN doubt THEN 0 ELSE COALESCE(actual, room) END,
        in_doubt = k.in_doubt + COALESCE(charge, 0),
        calls = k.calls + 1, unknown_calls = k.unknown_calls + doubt::integer
      WHERE k.budget_id = b.budget_id AND k.period_start = start AND k.subject_id = subject;
    END IF;
    IF doubt THEN
      INSERT INTO {schema}.budget_doubts (call_id, budget_id, period_start, subject_id, amount)
      VALUES (c.call_id, b.budget_id, start, subject, COALESCE(charge, 0))
      ON CONFLICT DO NOTHING;
    END IF;
  END LOOP;
END
$body$;

-- The trigger: with no budget in the ledger there is nothing to settle (one cheap read on
-- every recorded call); otherwise the call is settled as above.
CREATE OR REPLACE FUNCTION {schema}.settle_call() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
  IF EXISTS (SELECT FROM {schema}.spend_budgets) THEN
    PERFORM {schema}.settle_recorded_call(NEW);
  END IF;
  RETURN NULL;
END
$body$;

-- Settle a call in doubt with the provider's figure (its tokens, priced at the row the call
-- was priced by) or as not billed: what it held of each budget in doubt becomes spend. Only a
-- call in doubt; `outcome`: `settled`, `not_in_doubt` or `missing`.
CREATE FUNCTION {schema}.settle_doubt(p_call_id bigint, p_input bigint, p_output bigint,
    p_by text)
RETURNS TABLE (outcome text, money numeric, billing text)
LANGUAGE plpgsql AS $body$
DECLARE
  c record;
  d record;
  p {schema}.price_history;
  settled numeric;
BEGIN
  SELECT * INTO c FROM {schema}.model_calls AS x WHERE x.call_id = p_call_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'missing'::text, NULL::numeric, NULL::text;
    RETURN;
  END IF;
  IF c.billing IS DISTINCT FROM 'in_doubt' THEN
    RETURN QUERY SELECT 'not_in_doubt'::text, c.money, c.billing;
    RETURN;
  END IF;
  IF c.price_id IS NOT NULL THEN
    SELECT * INTO p FROM {schema}.price_history AS x WHERE x.price_id = c.price_id;
  END IF;
  settled := CASE WHEN COALESCE(p_input, 0) + COALESCE(p_output, 0) = 0 THEN 0
    WHEN p.price_id IS NULL THEN NULL
    ELSE {schema}.usage_money(p_input, p_output, NULL, NULL, NULL, NULL, p) END;
  UPDATE {schema}.model_calls AS x
  SET input_tokens = COALESCE(p_input, 0), output_tokens = COALESCE(p_output, 0),
    money = settled, billing = 'settled', settled_at = now(), settled_by = p_by
  WHERE x.call_id = p_call_id;
  FOR d IN DELETE FROM {schema}.budget_doubts AS x WHERE x.call_id = p_call_id
    RETURNING x.budget_id, x.period_start, x.subject_id, x.amount
  LOOP
    UPDATE {schema}.budget_counters AS k
    SET in_doubt = GREATEST(k.in_doubt - d.amount, 0),
      spent = k.spent + CASE WHEN (SELECT s.unit FROM {schema}.spend_budgets AS s
          WHERE s.budget_id = d.budget_id) = 'tokens'
        THEN COALESCE(p_input, 0) + COALESCE(p_output, 0)
        ELSE COALESCE(settled, d.amount) END,
      unknown_calls = GREATEST(k.unknown_calls - 1, 0)
    WHERE k.budget_id = d.budget_id AND k.period_start = d.period_start
      AND k.subject_id = d.subject_id;
  END LOOP;
  RETURN QUERY SELECT 'settled'::text, settled, 'settled'::text;
END
$body$;

-- A new budget's current period starts where the period stands: the money each call of its
-- jobs was priced at (calls in doubt held apart, at nothing: their figure is not known).
CREATE OR REPLACE FUNCTION {schema}.count_period(p_budget text, p_scope text, p_unit text,
    p_period text, p_jobs text[])
RETURNS void LANGUAGE sql AS $body$
  INSERT INTO {schema}.budget_counters AS k (budget_id, period_start, subject_id, spent, calls,
    unknown_calls)
  SELECT p_budget, {schema}.period_start(p_period, now()),
    CASE WHEN p_scope = 'subject' THEN r.subject_id ELSE '' END,
    sum(CASE WHEN p_unit = 'tokens'
      THEN COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0)
      ELSE COALESCE(c.money, 0) END),
    count(*), count(*) FILTER (WHERE c.billing = 'in_doubt')
  FROM {schema}.model_calls AS c
  JOIN {schema}.runs AS r ON r.run_id = c.run_id AND r.job_name = ANY(p_jobs)
  WHERE c.called_at >= {schema}.period_start(p_period, now())
  GROUP BY 1, 2, 3
  ON CONFLICT ON CONSTRAINT budget_counters_pkey DO NOTHING
$body$;

-- Whether a price row priced any call (`prices delete` keeps such a row: it is history).
CREATE INDEX model_calls_price ON {schema}.model_calls (price_id) WHERE price_id IS NOT NULL;
