-- change: additive
-- A call whose admission fixed no price is priced by the model it used, at its admission's
-- time. A hold fixes the price in force as the request is admitted, looked up by the model the
-- request names; a claim's hold taken for a job that names no model (`run_idempotent` with no
-- `model` in its configuration) found none, and its call stayed unpriced for good, though the
-- model it reported had a price all along. Such a call is now priced, once, by the price in
-- force when its hold was taken for the model it reported (as asked, else as answered): still
-- no price set later, and unpriced when that model had none then. A hold that fixed a price
-- row prices its call by that row, as before. Expand only: the previous release's workers
-- insert calls as they did.
CREATE OR REPLACE FUNCTION {schema}.price_call() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
  h record;
  p {schema}.price_history;
BEGIN
  SELECT x.price_id, x.held_at INTO h FROM {schema}.budget_holds AS x
  WHERE x.run_id = NEW.run_id AND x.lease_epoch = NEW.lease_epoch
    AND x.worker_id = NEW.worker_id AND x.price_fixed
  LIMIT 1;
  IF NOT FOUND THEN  -- no budget admitted it: the price in force as it is recorded
    SELECT * INTO p FROM {schema}.price_in_force(NEW.requested_model, NEW.model_name, NEW.tier,
      now());
  ELSIF h.price_id IS NOT NULL THEN  -- the row its admission fixed
    SELECT * INTO p FROM {schema}.price_history AS x WHERE x.price_id = h.price_id;
  ELSE  -- its admission knew no price: the one in force then, for the model it used
    SELECT * INTO p FROM {schema}.price_in_force(NEW.requested_model, NEW.model_name, NEW.tier,
      h.held_at);
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
