-- The prices store: append-only price history and the ledger's currency.

-- faces: worker admin

-- name: ledger_currency
-- The ledger's currency (no row before the first price).
SELECT currency FROM {schema}.ledger_currency

-- faces: admin

-- name: set_price
-- Add a model's price per million tokens of each kind, from a time on: history is append-only.
-- In force from `effective_from` (now when NULL) on, for the model's exact name or every name
-- under a prefix, in a tier. Nothing is updated in place: a second price of the same model,
-- kind, tier and time is refused by the key. A time in the past is a correction: refused when a
-- call of a model it matches was priced since (`blocked_at`: the first such call's time, and
-- no row added); otherwise it prices the calls recorded since with no price (money unknown),
-- and only those. The first price sets the ledger's currency; a price in another is refused
-- by the foreign key, whatever races it.
WITH currency AS (
  INSERT INTO {schema}.ledger_currency (currency) VALUES (%(currency)s) ON CONFLICT DO NOTHING
), at AS (
  SELECT COALESCE(%(effective_from)s::timestamptz, now()) AS t,
    COALESCE(%(effective_from)s::timestamptz < now(), false) AS past
), matching AS (
  SELECT c.* FROM {schema}.model_calls AS c, at
  WHERE at.past AND c.called_at >= at.t AND c.billing IN ('billed', 'settled')
    AND (%(tier)s::text = 'standard' OR c.tier = %(tier)s)
    AND EXISTS (SELECT FROM (VALUES (c.requested_model), (c.model_name)) AS n(name)
      WHERE CASE WHEN %(match_kind)s = 'prefix' THEN starts_with(n.name, %(model_pattern)s)
        ELSE n.name = %(model_pattern)s END)
), blocked AS (
  SELECT min(called_at) AS blocked_at FROM matching WHERE price_id IS NOT NULL
), added AS (
  INSERT INTO {schema}.price_history AS p (model_pattern, match_kind, tier, effective_from,
    currency, input_per_million, output_per_million, cache_read_per_million,
    cache_write_per_million, cache_write_1h_per_million, reasoning_per_million, set_by,
    correction)
  SELECT %(model_pattern)s, %(match_kind)s, %(tier)s, at.t, %(currency)s,
    %(input_per_million)s, %(output_per_million)s, %(cache_read_per_million)s,
    %(cache_write_per_million)s, %(cache_write_1h_per_million)s, %(reasoning_per_million)s,
    COALESCE(%(set_by)s, session_user), at.past
  FROM at, blocked WHERE blocked.blocked_at IS NULL
  RETURNING p.*
), repriced AS (
  UPDATE {schema}.model_calls AS c
  SET price_id = a.price_id, money = {schema}.usage_money(c.input_tokens, c.output_tokens,
    c.cache_read_tokens, c.cache_write_tokens, c.cache_write_1h_tokens, c.reasoning_tokens,
    a::{schema}.price_history)
  FROM added AS a, matching AS m
  WHERE c.call_id = m.call_id AND m.price_id IS NULL
  RETURNING c.call_id
)
SELECT a.*, b.blocked_at, (SELECT count(*) FROM repriced) AS priced_calls
FROM blocked AS b LEFT JOIN added AS a ON true

-- name: delete_prices
-- Remove a model's (or prefix's) prices that never priced anything, of one tier or every tier.
-- A price row a call was priced by (or an admitted request holds) is history and stays: its
-- rows come back with `kept` true, and nothing is removed when any does.
WITH wanted AS (
  SELECT p.*, EXISTS (SELECT FROM {schema}.model_calls AS c WHERE c.price_id = p.price_id)
    OR EXISTS (SELECT FROM {schema}.budget_holds AS h WHERE h.price_id = p.price_id) AS kept
  FROM {schema}.price_history AS p
  WHERE p.model_pattern = %(model_pattern)s AND p.match_kind = %(match_kind)s
    AND (%(tier)s::text IS NULL OR p.tier = %(tier)s)
), gone AS (
  DELETE FROM {schema}.price_history AS p USING wanted AS w
  WHERE p.price_id = w.price_id AND NOT EXISTS (SELECT FROM wanted WHERE kept)
  RETURNING p.price_id
)
SELECT w.*, (SELECT count(*) FROM gone) AS removed FROM wanted AS w
ORDER BY w.tier, w.effective_from

-- name: list_prices
-- Every price with its history, by model, tier and the time it applies from.
SELECT * FROM {schema}.price_history
ORDER BY model_pattern, match_kind, tier, effective_from

-- name: price_matches
-- Which calls of the last `days` days each price priced.
-- Each call by the price row it was priced by; the row with no pattern holds the calls no
-- price covered, and their models.
SELECT p.model_pattern, p.match_kind, p.tier, p.effective_from, count(*) AS calls,
  array_agg(DISTINCT COALESCE(c.requested_model, c.model_name, '(none)')) AS models
FROM {schema}.model_calls AS c
LEFT JOIN {schema}.price_history AS p ON p.price_id = c.price_id
WHERE c.called_at >= now() - make_interval(days => %(days)s)
GROUP BY 1, 2, 3, 4
ORDER BY 1, 2, 3, 4
