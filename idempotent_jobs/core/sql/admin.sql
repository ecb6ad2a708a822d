-- The operator face's statements (core/admin.py: LedgerAdmin), and only those: listings and reads
-- (which the reader role can run), revisions, drills armed and ended, prices and spend, and
-- retention's batches. Each starts with `-- name: <name>` and a one-line purpose; more comment
-- lines may follow before the statement. `{schema}` is replaced by the quoted schema name once per
-- ledger; every value is a parameter. A write here never follows a claim: `revise` takes only a
-- completed run, and retention only what no lease holds.

-- name: arm_drill
-- Arm a failure drill: the next `calls` model calls of the job fail, until it expires.
-- One drill per job (identity job name, or '*' for every job); arming again replaces it.
INSERT INTO {schema}.drills (job_name, remaining, expires_at, armed_by)
VALUES (%(job_name)s, %(calls)s, now() + make_interval(secs => %(seconds)s), %(armed_by)s)
ON CONFLICT (job_name) DO UPDATE SET remaining = EXCLUDED.remaining,
  expires_at = EXCLUDED.expires_at, armed_by = EXCLUDED.armed_by, armed_at = now()
RETURNING job_name, remaining, expires_at, armed_by, armed_at

-- name: disarm_drills
-- End the drill of one job, or every drill (`job_name` NULL).
DELETE FROM {schema}.drills WHERE job_name = %(job_name)s OR %(job_name)s::text IS NULL
RETURNING job_name, remaining, expires_at, armed_by, armed_at

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
    %(set_by)s, at.past
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

-- name: ledger_currency
-- The ledger's currency (no row before the first price).
SELECT currency FROM {schema}.ledger_currency

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

-- name: call_costs
-- One run's calls and the money each was recorded with (NULL: unknown).
SELECT c.call_id, c.money AS cost
FROM {schema}.model_calls AS c
WHERE c.run_id = %(run_id)s
ORDER BY c.call_id

-- name: spend_by_job
-- What each job's model calls spent in one UTC day.
-- Today when `day` is NULL, by the database clock: calls, tokens, tokens not accepted, the
-- money each call was recorded with, the most any one subject spent, and the calls in doubt
-- (no usage known; apart from the money, which they are not part of until settled).
WITH calls AS (
  SELECT r.job_name, r.subject_id, c.outcome,
    COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0) AS tokens,
    c.money AS cost, c.billing = 'in_doubt' AS unknown
  FROM {schema}.model_calls AS c
  -- Each call's run by its key (LIMIT keeps the planner from turning it into a join that
  -- scans every run).
  CROSS JOIN LATERAL (SELECT job_name, subject_id FROM {schema}.runs AS r
    WHERE r.run_id = c.run_id LIMIT 1) AS r
  -- Written out, so the planner estimates the range (one day's calls).
  WHERE c.called_at >= date_trunc('day', COALESCE(%(day)s::timestamptz, now())
      AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
    AND c.called_at < (date_trunc('day', COALESCE(%(day)s::timestamptz, now())
      AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
), by_subject AS (
  SELECT job_name, subject_id, count(*) AS calls, sum(tokens) AS tokens,
    sum(tokens) FILTER (WHERE outcome <> 'accepted') AS wasted, sum(cost) AS cost,
    bool_and(cost IS NOT NULL OR unknown) AS priced,
    count(*) FILTER (WHERE unknown) AS unknown_calls
  FROM calls GROUP BY job_name, subject_id
)
SELECT job_name,
  date_trunc('day', COALESCE(%(day)s::timestamptz, now()) AT TIME ZONE 'UTC')
    AT TIME ZONE 'UTC' AS day_start,
  sum(calls)::bigint AS calls, sum(tokens)::bigint AS tokens,
  COALESCE(sum(wasted), 0)::bigint AS wasted_tokens, sum(cost) AS cost,
  bool_and(priced) AS priced, max(tokens)::bigint AS top_subject_tokens,
  sum(unknown_calls)::bigint AS unknown_calls
FROM by_subject GROUP BY job_name
ORDER BY 1

-- name: spend_by_kind
-- What each job's calls of a period spent, by model, price in force and kind of token.
-- From `start` (included) to `end` (excluded), by the database clock; each call at the price
-- row it was recorded with (`price_from`: when that price applies from), each kind of token
-- at its own price; `money` NULL where the call had no price (unknown). Calls in doubt are
-- `spend_in_doubt`'s, and calls the provider never billed cost nothing.
WITH calls AS (
  SELECT r.job_name, COALESCE(c.requested_model, c.model_name, '(none)') AS model,
    p.effective_from AS price_from, p.currency,
    GREATEST(COALESCE(c.input_tokens, 0) - COALESCE(c.cache_read_tokens, 0)
      - COALESCE(c.cache_write_tokens, 0), 0) AS input,
    COALESCE(c.cache_read_tokens, 0) AS cache_read,
    GREATEST(COALESCE(c.cache_write_tokens, 0) - COALESCE(c.cache_write_1h_tokens, 0), 0)
      AS cache_write,
    COALESCE(c.cache_write_1h_tokens, 0) AS cache_write_1h,
    GREATEST(COALESCE(c.output_tokens, 0) - COALESCE(c.reasoning_tokens, 0), 0) AS output,
    COALESCE(c.reasoning_tokens, 0) AS reasoning, p
  FROM {schema}.model_calls AS c
  CROSS JOIN LATERAL (SELECT job_name FROM {schema}.runs AS r
    WHERE r.run_id = c.run_id LIMIT 1) AS r
  LEFT JOIN {schema}.price_history AS p ON p.price_id = c.price_id
  WHERE c.called_at >= %(start)s AND c.called_at < %(end)s AND c.billing <> 'in_doubt'
    AND c.billing <> 'unbilled' 
    AND (%(job_name)s::text IS NULL OR r.job_name = %(job_name)s)
)
SELECT job_name, model, price_from, currency, k.kind, sum(k.tokens)::bigint AS tokens,
  sum(k.tokens * k.price / 1000000) AS money, bool_and(k.price IS NOT NULL) AS priced
FROM calls CROSS JOIN LATERAL (VALUES
  (1, 'input', input, (p).input_per_million),
  (2, 'cache read', cache_read, COALESCE((p).cache_read_per_million, (p).input_per_million)),
  (3, 'cache write', cache_write, COALESCE((p).cache_write_per_million, (p).input_per_million)),
  (4, 'cache write 1h', cache_write_1h, COALESCE((p).cache_write_1h_per_million,
    (p).cache_write_per_million, (p).input_per_million)),
  (5, 'output', output, (p).output_per_million),
  (6, 'reasoning', reasoning, COALESCE((p).reasoning_per_million, (p).output_per_million))
) AS k(n, kind, tokens, price)
GROUP BY job_name, model, price_from, currency, k.n, k.kind
HAVING sum(k.tokens) > 0
ORDER BY job_name, model, price_from NULLS FIRST, k.n

-- name: spend_totals
-- What the calls of a period cost in all: the money each was recorded with, and the calls apart.
-- From `start` (included) to `end` (excluded), by the database clock, of one job or all:
-- `money` sums the calls whose money is known (the calls the provider never billed at 0);
-- `priced` is false when a call not in doubt had no price; calls in doubt (no usage known)
-- are counted apart, with nothing in the money until `costs settle` gives their figure.
SELECT sum(c.money) AS money,
  COALESCE(bool_and(c.money IS NOT NULL) FILTER (WHERE c.billing <> 'in_doubt'), true)
    AS priced,
  count(*) FILTER (WHERE c.billing = 'in_doubt') AS in_doubt_calls,
  count(*) FILTER (WHERE c.billing = 'unbilled') AS unbilled_calls,
  count(*) AS calls
FROM {schema}.model_calls AS c
CROSS JOIN LATERAL (SELECT job_name FROM {schema}.runs AS r
  WHERE r.run_id = c.run_id LIMIT 1) AS r
WHERE c.called_at >= %(start)s AND c.called_at < %(end)s
  AND (%(job_name)s::text IS NULL OR r.job_name = %(job_name)s)

-- name: calls_in_doubt
-- The calls whose outcome is in doubt (no usage known), oldest first, of one job or all.
-- Each with its run, job, the model asked for, its provider, the price row it was admitted at
-- and what it holds in doubt of each budget (budget id to amount): what `costs settle` ends.
SELECT c.call_id, c.run_id, r.job_name, r.subject_id, c.called_at, c.requested_model,
  c.model_name, c.provider_name, c.tier, c.outcome, c.error, c.price_id,
  COALESCE((SELECT jsonb_object_agg(d.budget_id, d.amount) FROM {schema}.budget_doubts AS d
    WHERE d.call_id = c.call_id), jsonb_build_object()) AS held
FROM {schema}.model_calls AS c
JOIN {schema}.runs AS r ON r.run_id = c.run_id
WHERE c.billing = 'in_doubt' AND (%(job_name)s::text IS NULL OR r.job_name = %(job_name)s)
ORDER BY c.called_at, c.call_id
LIMIT %(limit)s

-- name: settle_doubt
-- Settle a call in doubt with the provider's figure (its tokens; 0 and 0: not billed).
-- The ledger's function `settle_doubt` (migration 0020): priced at the row the call was
-- admitted at, and what it held of each budget in doubt becomes spend, in one transaction.
SELECT v.outcome, v.money, v.billing FROM {schema}.settle_doubt(%(call_id)s, %(input_tokens)s,
  %(output_tokens)s, %(settled_by)s) AS v

-- name: budget_standings
-- Every budget in the ledger, with where its current period stands.
-- Those covering one job, when `job_name` is given; the current period's counter (for a subject budget, the subject that spent most), and whether it
-- has no room left: what every worker enforces.
SELECT b.*, {schema}.period_start(b.period, now())::timestamp AT TIME ZONE 'UTC'
    AS period_start,
  COALESCE(k.spent, 0) AS spent, COALESCE(k.reserved, 0) AS reserved,
  COALESCE(k.in_doubt, 0) AS in_doubt, COALESCE(k.calls, 0) AS calls, COALESCE(k.unknown_calls, 0) AS unknown_calls,
  COALESCE(k.subject_id, '') AS subject_id,
  COALESCE(k.spent + k.reserved + k.in_doubt >= b.amount, false) AS refusing,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.spend_budgets AS b
LEFT JOIN LATERAL (SELECT * FROM {schema}.budget_counters AS k
  WHERE k.budget_id = b.budget_id AND k.period_start = {schema}.period_start(b.period, now())
  ORDER BY k.spent + k.reserved + k.in_doubt DESC LIMIT 1) AS k ON true
WHERE %(job_name)s::text IS NULL OR %(job_name)s::text = ANY(b.jobs)
ORDER BY b.budget_id

-- name: set_budget
-- An operator sets a budget; it stands over a spec's declaration.
-- A new one starts with its period's spend so far; a changed amount keeps the counters.
WITH added AS (
  INSERT INTO {schema}.spend_budgets AS b (budget_id, scope, scope_name, unit, period, amount,
    jobs, declared_by, set_by)
  VALUES (%(budget_id)s, %(scope)s, %(scope_name)s, %(unit)s, %(period)s, %(amount)s,
    %(jobs)s::text[], 'operator', %(set_by)s)
  ON CONFLICT (budget_id) DO UPDATE SET amount = EXCLUDED.amount, jobs = EXCLUDED.jobs,
    declared_by = 'operator', set_at = now(), set_by = EXCLUDED.set_by
  RETURNING b.budget_id, xmax = 0 AS inserted, CASE WHEN xmax = 0
    THEN {schema}.count_period(b.budget_id, b.scope, b.unit, b.period, b.jobs) END
)
SELECT budget_id, inserted FROM added

-- name: clear_budget
-- Remove a budget (its counters and holds go with it): no call is capped by it any more.
DELETE FROM {schema}.spend_budgets WHERE budget_id = %(budget_id)s RETURNING budget_id

-- name: job_history
-- What a job's runs cost so far, for an estimate.
-- Per accepted run (its accepted call; the latest `sample` runs): p10, median and p90 of tokens
-- and money (as each call was recorded), and the tokens per byte of its
-- checkpointed input (to scale a partition whose input is already collected); and every call
-- not accepted (failed, rejected, stale, lease lost): how many and what they cost. `batch_*`:
-- the same accepted calls at the batch tier's price in force now (NULL where the model has no
-- batch price: unknown, never the standard price).
WITH priced_calls AS (
  SELECT c.run_id, c.outcome, c.called_at,
    COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0) AS tokens,
    c.money AS cost,
    CASE WHEN b.tier = 'batch' THEN {schema}.usage_money(c.input_tokens, c.output_tokens,
      c.cache_read_tokens, c.cache_write_tokens, c.cache_write_1h_tokens, c.reasoning_tokens,
      b) END AS batch_cost
  FROM {schema}.runs AS r
  JOIN {schema}.model_calls AS c ON c.run_id = r.run_id
  LEFT JOIN LATERAL {schema}.price_in_force(c.requested_model, c.model_name, 'batch',
    now()) AS b ON true
  WHERE r.job_name = %(job_name)s
), accepted AS (
  SELECT run_id, sum(tokens) AS tokens, sum(cost) AS cost, bool_and(cost IS NOT NULL) AS priced,
    sum(batch_cost) AS batch_cost, bool_and(batch_cost IS NOT NULL) AS batch_priced
  FROM priced_calls WHERE outcome = 'accepted'
  GROUP BY run_id ORDER BY max(called_at) DESC LIMIT %(sample)s
), sized AS (
  SELECT a.*, octet_length(r.raw_input::text) AS input_bytes
  FROM accepted AS a JOIN {schema}.runs AS r USING (run_id)
), not_accepted AS (
  SELECT count(*) AS calls, COALESCE(sum(tokens), 0)::bigint AS tokens, sum(cost) AS cost,
    COALESCE(bool_and(cost IS NOT NULL), true) AS priced
  FROM priced_calls WHERE outcome <> 'accepted'
), all_accepted AS (
  SELECT count(DISTINCT run_id) AS runs FROM priced_calls WHERE outcome = 'accepted'
)
SELECT all_accepted.runs AS accepted_runs, count(sized.run_id) AS sampled_runs,
  percentile_cont(0.1) WITHIN GROUP (ORDER BY sized.tokens) AS p10_tokens,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY sized.tokens) AS median_tokens,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY sized.tokens) AS p90_tokens,
  percentile_cont(0.1) WITHIN GROUP (ORDER BY sized.cost) AS p10_cost,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY sized.cost) AS median_cost,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY sized.cost) AS p90_cost,
  COALESCE(bool_and(sized.priced), true) AND not_accepted.priced AS priced,
  percentile_cont(0.1) WITHIN GROUP (ORDER BY sized.batch_cost) AS batch_p10_cost,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY sized.batch_cost) AS batch_median_cost,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY sized.batch_cost) AS batch_p90_cost,
  COALESCE(bool_and(sized.batch_priced), false) AS batch_priced,
  not_accepted.calls AS failed_calls, not_accepted.tokens AS failed_tokens,
  not_accepted.cost AS failed_cost,
  sum(sized.tokens) FILTER (WHERE sized.input_bytes > 0)::float8
    / NULLIF(sum(sized.input_bytes) FILTER (WHERE sized.input_bytes > 0), 0)
    AS tokens_per_input_byte,
  sum(sized.cost) FILTER (WHERE sized.input_bytes > 0)::float8
    / NULLIF(sum(sized.input_bytes) FILTER (WHERE sized.input_bytes > 0), 0)
    AS cost_per_input_byte
FROM all_accepted, not_accepted LEFT JOIN sized ON true
GROUP BY all_accepted.runs, not_accepted.calls, not_accepted.tokens, not_accepted.cost,
  not_accepted.priced

-- name: run_sizes
-- The stored status of each of these run ids and the bytes of its raw-input checkpoint.
-- For an estimate; ids not registered are left out.
-- The ids come as one comma-separated text (hex ids need no quoting): a text array of
-- thousands is slow to send.
SELECT run_id, status, octet_length(raw_input::text) FROM {schema}.runs
WHERE run_id = ANY(string_to_array(%(run_ids)s, ','))

-- name: run_statuses
-- The stored status of each of these run ids (ids not registered are left out).
SELECT run_id, status FROM {schema}.runs WHERE run_id = ANY(%(run_ids)s)

-- name: list_drills
-- The drills still armed (calls left, not expired).
SELECT job_name, remaining, expires_at, armed_by, armed_at FROM {schema}.drills
WHERE remaining > 0 AND expires_at > now()
ORDER BY job_name

-- name: job_names
-- The identity job names the ledger holds runs of, in order.
-- A skip scan of runs_identity_key (job_name leads it): one index probe per job, however many
-- runs each has.
WITH RECURSIVE job AS (
  SELECT min(job_name) AS name FROM {schema}.runs
  UNION ALL
  SELECT (SELECT min(r.job_name) FROM {schema}.runs AS r WHERE r.job_name > job.name)
  FROM job WHERE job.name IS NOT NULL
)
SELECT name FROM job WHERE name IS NOT NULL

-- name: get_run
-- One run's record.
SELECT * FROM {schema}.runs WHERE run_id = %(run_id)s

-- name: list_attempts
-- A run's claims, oldest first: the ended ones and the open one (the `attempts` view).
SELECT * FROM {schema}.attempts WHERE run_id = %(run_id)s ORDER BY lease_epoch

-- name: list_model_calls
-- A run's model calls, oldest first.
SELECT * FROM {schema}.model_calls WHERE run_id = %(run_id)s ORDER BY call_id

-- name: list_outbox
-- Outbox rows with their run's job, of one run or all, of some jobs or all, maybe only undelivered.
-- A row belongs to its run's job: a deliverer names the jobs it owns (`job_names`), and never
-- sees another team's rows on a shared ledger.
SELECT o.*, r.job_name FROM {schema}.notification_outbox AS o
JOIN {schema}.runs AS r ON r.run_id = o.run_id
WHERE (%(run_id)s::text IS NULL OR o.run_id = %(run_id)s)
  AND (NOT %(pending_only)s OR o.delivered_at IS NULL)
  AND (%(job_names)s::text[] IS NULL OR r.job_name = ANY(%(job_names)s::text[]))
ORDER BY o.created_at, o.run_id, o.channel, o.revision
LIMIT %(limit)s

-- name: list_runs
-- Runs by job, subject, status and window, newest window first; every filter is optional.
-- A page starts after the run `after` (keyset: never an OFFSET). The order is total (run_id
-- breaks ties) and is runs_newest_idx's, so `scheduled_at <= cursor` starts the index scan at
-- the cursor; the rest of the comparison only skips the cursor's own window's earlier rows.
WITH page_cursor AS (
  SELECT scheduled_at, job_name, subject_id, run_id FROM {schema}.runs WHERE run_id = %(after)s
)
SELECT r.* FROM {schema}.runs AS r
WHERE (%(job_name)s::text IS NULL OR r.job_name = %(job_name)s)
  AND (%(subject_id)s::text IS NULL OR r.subject_id = %(subject_id)s)
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
  AND (%(since)s::timestamptz IS NULL OR r.scheduled_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR r.scheduled_at < %(until)s)
  AND (%(after)s::text IS NULL OR (
    r.scheduled_at <= (SELECT scheduled_at FROM page_cursor)
    AND (r.scheduled_at < (SELECT scheduled_at FROM page_cursor)
      OR (r.job_name, r.subject_id, r.run_id)
        > (SELECT job_name, subject_id, run_id FROM page_cursor))))
ORDER BY r.scheduled_at DESC, r.job_name, r.subject_id, r.run_id
LIMIT %(limit)s

-- name: list_revisions
-- The results a run had before each explicit revision, oldest first.
SELECT * FROM {schema}.run_revisions WHERE run_id = %(run_id)s ORDER BY revision

-- name: revise
-- Reopen a completed run for recomputation under the next revision.
-- The only way a completed run is recomputed: its accepted result moves to run_revisions with the
-- reason, and the run becomes claimable again under the next revision number. A run whose raw
-- input retention pruned is reopened only with `recollect` (there is nothing to recompute on).
WITH current AS (
  SELECT run_id, revision, output, completed_at, lease_epoch FROM {schema}.runs
  WHERE run_id = %(run_id)s AND status = 'completed'
    AND (%(recollect)s OR raw_input_pruned_at IS NULL)
  FOR UPDATE
), kept AS (
  INSERT INTO {schema}.run_revisions (run_id, revision, reason, channels, previous_output,
    previous_completed_at, previous_epoch, recollect, requested_by)
  SELECT run_id, revision + 1, %(reason)s, %(channels)s, output, completed_at, lease_epoch,
    %(recollect)s, %(requested_by)s
  FROM current
  RETURNING run_id AS revised_run_id, revision AS new_revision
)
UPDATE {schema}.runs AS r
SET status = 'pending', output = NULL, completed_at = NULL, last_error = NULL,
  revision = new_revision, updated_at = now(), config_fingerprint = NULL, config_parts = NULL,
  raw_input = CASE WHEN %(recollect)s THEN NULL ELSE r.raw_input END,
  input_fingerprint = CASE WHEN %(recollect)s THEN NULL ELSE r.input_fingerprint END,
  raw_input_pruned_at = CASE WHEN %(recollect)s THEN NULL ELSE r.raw_input_pruned_at END,
  output_pruned_at = NULL
FROM kept
WHERE r.run_id = revised_run_id
RETURNING r.*

-- name: expired_leases
-- Running runs whose lease expired (by the database clock) without an outcome.
SELECT * FROM {schema}.runs
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s

-- name: stale_outbox
-- Undelivered notifications queued longer ago than the given number of seconds.
SELECT * FROM {schema}.notification_outbox
WHERE delivered_at IS NULL AND created_at < now() - make_interval(secs => %(older_than_seconds)s)
ORDER BY created_at
LIMIT %(limit)s

-- name: failed_past_retries
-- Failed runs that have used the given number of claims or more.
SELECT * FROM {schema}.runs
WHERE status = 'failed' AND attempts >= %(max_attempts)s
ORDER BY updated_at
LIMIT %(limit)s

-- name: drifted_runs
-- Completed runs whose result was computed under another configuration.
-- Completed runs of a job version whose result was computed under another configuration (runs
-- completed before configurations were recorded have none and are not compared).
SELECT * FROM {schema}.runs
WHERE job_name = %(job_name)s AND version = %(version)s AND status = 'completed'
  AND config_fingerprint IS NOT NULL AND config_fingerprint <> %(config_fingerprint)s
ORDER BY scheduled_at DESC, subject_id
LIMIT %(limit)s

-- name: run_ids_by_prefix
-- The run ids starting with a hex prefix; two rows back mean "ambiguous".
-- A range on the primary key (ids are lowercase hex, and 'g' sorts after 'f' in every collation
-- PostgreSQL offers), where LIKE would read the whole index in a non-C collation.
SELECT run_id FROM {schema}.runs
WHERE run_id >= %(prefix)s AND run_id < %(prefix)s || 'g'
  AND left(run_id, length(%(prefix)s)) = %(prefix)s
ORDER BY run_id
LIMIT 2

-- name: database_now
-- The database's clock (retention cutoffs are computed by it, as leases are).
SELECT now()

-- name: prune_batch
-- One retention batch of a job: count, and with `apply` prune, what its policy lets go.
-- The job's next `batch_size` runs in identity order after the cursor (an index range of
-- runs_identity_key: a job's batches read only its runs). Of those, completed runs lose their
-- raw input (completed before `raw_input_before`), output (before `output_before`) and attempt
-- rows (ended before `attempts_before`), and delivered notifications their payload (delivered
-- before `payloads_before`), and results a revision replaced lose their output (by when they
-- completed, as outputs); a NULL cutoff keeps that part. Only completed runs, delivered rows and
-- replaced results: no lease is held on them, so no claim waits on this. With `apply`, each run
-- is locked and rechecked first (still completed, at the same completion): a run revised (or
-- revised and completed again) since the statement's snapshot is skipped whole, its attempt rows
-- included, and every part pruned sets its pruned-at marker. The counts are what the dry run
-- found, or with `apply` the rows changed. The run row, its counts and the outbox row stay.
WITH batch AS (
  SELECT run_id, subject_id, scheduled_at, version FROM {schema}.runs
  WHERE job_name = %(job_name)s
    AND (job_name, subject_id, scheduled_at, version)
      > (%(job_name)s, %(after_subject)s, %(after_scheduled_at)s::timestamptz, %(after_version)s)
  ORDER BY job_name, subject_id, scheduled_at, version
  LIMIT %(batch_size)s
), done AS (
  SELECT r.run_id, r.completed_at,
    COALESCE(r.raw_input IS NOT NULL AND r.completed_at < %(raw_input_before)s, false)
      AS drop_raw,
    COALESCE(r.output IS NOT NULL AND r.completed_at < %(output_before)s, false) AS drop_output,
    EXISTS (SELECT FROM {schema}.run_attempts AS a
      WHERE a.run_id = r.run_id AND a.ended_at < %(attempts_before)s) AS drop_attempts,
    COALESCE(pg_column_size(r.raw_input), 0) AS raw_bytes,
    COALESCE(pg_column_size(r.output), 0) AS output_bytes
  FROM {schema}.runs AS r JOIN batch USING (run_id)
  WHERE r.status = 'completed'
), locked AS (
  SELECT r.run_id, d.drop_raw, d.drop_output, d.drop_attempts, d.raw_bytes, d.output_bytes
  FROM {schema}.runs AS r JOIN done AS d USING (run_id)
  WHERE %(apply)s AND (d.drop_raw OR d.drop_output OR d.drop_attempts)
    AND r.status = 'completed' AND r.completed_at = d.completed_at
  FOR UPDATE OF r
), deleted_attempts AS (
  DELETE FROM {schema}.run_attempts AS a USING locked AS l
  WHERE l.drop_attempts AND a.run_id = l.run_id AND a.ended_at < %(attempts_before)s
  RETURNING a.run_id, pg_column_size(a.*) AS bytes
), pruned_runs AS (
  UPDATE {schema}.runs AS r
  SET raw_input = CASE WHEN l.drop_raw THEN NULL ELSE r.raw_input END,
    raw_input_pruned_at = CASE WHEN l.drop_raw THEN now() ELSE r.raw_input_pruned_at END,
    output = CASE WHEN l.drop_output THEN NULL ELSE r.output END,
    output_pruned_at = CASE WHEN l.drop_output THEN now() ELSE r.output_pruned_at END,
    attempts_pruned_at = CASE WHEN l.run_id IN (SELECT run_id FROM deleted_attempts)
      THEN now() ELSE r.attempts_pruned_at END
  FROM locked AS l
  WHERE r.run_id = l.run_id
  RETURNING r.run_id, l.drop_raw, l.drop_output, l.raw_bytes, l.output_bytes
), old_attempts AS (
  SELECT a.run_id, a.lease_epoch, pg_column_size(a.*) AS bytes
  FROM {schema}.run_attempts AS a JOIN done USING (run_id)
  WHERE done.drop_attempts AND a.ended_at < %(attempts_before)s
), old_payloads AS (
  SELECT o.run_id, o.channel, o.revision, pg_column_size(o.payload) AS bytes
  FROM {schema}.notification_outbox AS o JOIN batch USING (run_id)
  WHERE o.payload IS NOT NULL AND o.delivered_at < %(payloads_before)s
), cleared_payloads AS (
  UPDATE {schema}.notification_outbox AS o SET payload = NULL, payload_pruned_at = now()
  FROM old_payloads AS p
  WHERE %(apply)s AND o.run_id = p.run_id AND o.channel = p.channel AND o.revision = p.revision
    AND o.delivered_at IS NOT NULL AND o.payload IS NOT NULL
  RETURNING o.run_id, p.bytes
), old_revisions AS (
  SELECT v.run_id, v.revision, pg_column_size(v.previous_output) AS bytes
  FROM {schema}.run_revisions AS v JOIN batch USING (run_id)
  WHERE v.previous_output IS NOT NULL AND v.previous_completed_at < %(output_before)s
), cleared_revisions AS (
  UPDATE {schema}.run_revisions AS v SET previous_output = NULL
  FROM old_revisions AS o
  WHERE %(apply)s AND v.run_id = o.run_id AND v.revision = o.revision
    AND v.previous_output IS NOT NULL
  RETURNING v.run_id, o.bytes
), last AS (
  SELECT subject_id, scheduled_at, version FROM batch
  ORDER BY subject_id DESC, scheduled_at DESC, version DESC LIMIT 1
)
SELECT (SELECT subject_id FROM last) AS last_subject,
  (SELECT scheduled_at FROM last) AS last_scheduled_at,
  (SELECT version FROM last) AS last_version,
  CASE WHEN %(apply)s THEN (SELECT count(*) FROM pruned_runs WHERE drop_raw)
    ELSE (SELECT count(*) FROM done WHERE drop_raw) END AS raw_rows,
  CASE WHEN %(apply)s THEN (SELECT COALESCE(sum(raw_bytes), 0) FROM pruned_runs WHERE drop_raw)
    ELSE (SELECT COALESCE(sum(raw_bytes), 0) FROM done WHERE drop_raw) END::bigint AS raw_bytes,
  CASE WHEN %(apply)s THEN (SELECT count(*) FROM pruned_runs WHERE drop_output)
      + (SELECT count(*) FROM cleared_revisions)
    ELSE (SELECT count(*) FROM done WHERE drop_output)
      + (SELECT count(*) FROM old_revisions) END AS output_rows,
  CASE WHEN %(apply)s
    THEN (SELECT COALESCE(sum(output_bytes), 0) FROM pruned_runs WHERE drop_output)
      + (SELECT COALESCE(sum(bytes), 0) FROM cleared_revisions)
    ELSE (SELECT COALESCE(sum(output_bytes), 0) FROM done WHERE drop_output)
      + (SELECT COALESCE(sum(bytes), 0) FROM old_revisions) END::bigint AS output_bytes,
  CASE WHEN %(apply)s THEN (SELECT count(*) FROM deleted_attempts)
    ELSE (SELECT count(*) FROM old_attempts) END AS attempt_rows,
  CASE WHEN %(apply)s THEN (SELECT COALESCE(sum(bytes), 0) FROM deleted_attempts)
    ELSE (SELECT COALESCE(sum(bytes), 0) FROM old_attempts) END::bigint AS attempt_bytes,
  CASE WHEN %(apply)s THEN (SELECT count(*) FROM cleared_payloads)
    ELSE (SELECT count(*) FROM old_payloads) END AS payload_rows,
  CASE WHEN %(apply)s THEN (SELECT COALESCE(sum(bytes), 0) FROM cleared_payloads)
    ELSE (SELECT COALESCE(sum(bytes), 0) FROM old_payloads) END::bigint AS payload_bytes,
  (SELECT count(*) FROM pruned_runs) + (SELECT count(*) FROM deleted_attempts)
    + (SELECT count(*) FROM cleared_payloads) + (SELECT count(*) FROM cleared_revisions)
    AS changed

-- name: storage_tables
-- The ledger's tables: estimated rows (NULL: never analysed) and bytes on disk (all included).
SELECT c.relname AS table_name,
  CASE WHEN c.reltuples < 0 THEN NULL ELSE c.reltuples::bigint END AS estimated_rows,
  pg_total_relation_size(c.oid) AS total_bytes
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind = 'r'
ORDER BY c.relname

-- name: storage_runs
-- Runs per job with the stored bytes of their rows, raw inputs and outputs (a page sample).
-- Over `percent` % of the table's pages (100: all of them, exact); the caller scales it up.
SELECT r.job_name, count(*) AS rows, COALESCE(sum(pg_column_size(r.*)), 0)::bigint AS row_bytes,
  COALESCE(sum(pg_column_size(r.raw_input)), 0)::bigint AS raw_input_bytes,
  COALESCE(sum(pg_column_size(r.output)), 0)::bigint AS output_bytes
FROM {schema}.runs AS r TABLESAMPLE SYSTEM (%(percent)s)
GROUP BY r.job_name
ORDER BY r.job_name

-- name: storage_attempts
-- Attempt rows per job and their stored bytes (a page sample, as storage_runs).
SELECT r.job_name, count(*) AS rows, COALESCE(sum(pg_column_size(a.*)), 0)::bigint AS bytes
FROM {schema}.run_attempts AS a TABLESAMPLE SYSTEM (%(percent)s)
JOIN {schema}.runs AS r USING (run_id)
GROUP BY r.job_name
ORDER BY r.job_name

-- name: storage_outbox
-- Outbox rows per job and the stored bytes of their payloads (a page sample, as storage_runs).
SELECT r.job_name, count(*) AS rows, COALESCE(sum(pg_column_size(o.payload)), 0)::bigint AS bytes
FROM {schema}.notification_outbox AS o TABLESAMPLE SYSTEM (%(percent)s)
JOIN {schema}.runs AS r USING (run_id)
GROUP BY r.job_name
ORDER BY r.job_name

-- name: prune_spend
-- Count (or, with `apply`, delete) a job's spend rows older than the longest budget period.
-- The ledger's function `prune_spend` (migration 0021, run as the ledger's owner, so the
-- retention job needs no write on budget counters): the current and the previous calendar
-- month (UTC, database clock) are kept, whatever the caller asks.
SELECT {schema}.prune_spend(%(job_name)s, %(apply)s)

-- name: prune_step_outputs
-- Count, and with `apply` delete, up to `batch_size` step hand-overs of a job's runs completed before the cutoff.
-- What the ledger IO manager kept between a Dagster run's steps is history once the run is
-- completed (a re-execution of it finds the run done from the ledger): it goes with the attempt
-- rows' retention. Only completed runs: a run in progress keeps what its next step loads.
WITH old AS (
  SELECT s.dagster_run_id, s.step_key, s.output_name, pg_column_size(s.*) AS bytes
  FROM {schema}.step_outputs AS s JOIN {schema}.runs AS r ON r.run_id = s.run_id
  WHERE r.job_name = %(job_name)s AND r.status = 'completed'
    AND r.completed_at < %(before)s AND s.created_at < %(before)s
  LIMIT %(batch_size)s::bigint
), gone AS (
  DELETE FROM {schema}.step_outputs AS s USING old
  WHERE %(apply)s AND (s.dagster_run_id, s.step_key, s.output_name)
    = (old.dagster_run_id, old.step_key, old.output_name)
  RETURNING s.dagster_run_id
)
SELECT count(*)::bigint, COALESCE(sum(bytes), 0)::bigint FROM old

-- name: set_rate_limit
-- Set a provider rate limit as an operator (it stands over the one a job's spec declares).
INSERT INTO {schema}.rate_limits AS l (provider, model, key_name, requests_per_window,
  tokens_per_window, window_seconds, declared_by)
VALUES (%(provider)s, %(model)s, %(key_name)s, %(requests)s, %(tokens)s, %(window_seconds)s,
  'operator')
ON CONFLICT (provider, model, key_name) DO UPDATE
  SET requests_per_window = EXCLUDED.requests_per_window,
    tokens_per_window = EXCLUDED.tokens_per_window, window_seconds = EXCLUDED.window_seconds,
    declared_by = 'operator', updated_at = now()
RETURNING l.*

-- name: delete_rate_limit
-- Remove a provider rate limit (workers stop pacing that model within half a minute).
DELETE FROM {schema}.rate_limits
WHERE provider = %(provider)s AND model = %(model)s AND key_name = %(key_name)s
RETURNING provider

-- name: list_rate_limits
-- Every provider rate limit, by provider, model and key name.
SELECT * FROM {schema}.rate_limits ORDER BY provider, model, key_name

-- name: batch_ids_like
-- The ids of the batches that start with a prefix of hex digits (at most two: one, or ambiguous).
SELECT batch_id FROM {schema}.batches
WHERE batch_id >= %(prefix)s AND batch_id < %(prefix)s || 'g'
ORDER BY batch_id LIMIT 2

-- name: list_batches
-- Batches, newest first, of one job or all, in one state or any, with their items by state and their money.
-- Money: the calls recorded under the batch (worker `batch:<id>`), each at the money it was
-- recorded with; `unpriced` counts those with none (no price, in doubt: the money is a floor).
SELECT b.batch_id, b.job_name, b.provider, b.model, b.state, b.provider_batch_id, b.items,
  b.lease_owner, b.lease_expires_at, b.lease_seconds, b.checked_at, b.created_at,
  b.submitted_at, b.ended_at, b.collected_at,
  b.cancel_requested_at, b.cancel_requested_by, b.error, b.provider_status,
  b.failed_steps, b.last_step_error,
  COALESCE((SELECT jsonb_object_agg(s.state, s.n) FROM (SELECT i.state, count(*) AS n
    FROM {schema}.batch_items AS i WHERE i.batch_id = b.batch_id GROUP BY i.state) AS s),
    jsonb_build_object()) AS item_states,
  m.calls, m.money, m.unpriced,
  (SELECT count(*) FROM {schema}.batch_submissions AS d
    WHERE d.batch_id = b.batch_id AND d.role = 'duplicate') AS duplicates,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.batches AS b
LEFT JOIN LATERAL (
  SELECT count(*) AS calls,
    sum(c.money) AS money, count(*) FILTER (WHERE c.money IS NULL) AS unpriced
  FROM {schema}.batch_items AS i
  JOIN {schema}.model_calls AS c ON c.run_id = i.run_id AND c.lease_epoch = i.lease_epoch
    AND c.worker_id = 'batch:' || i.batch_id
  WHERE i.batch_id = b.batch_id
) AS m ON true
WHERE (%(batch_id)s::text IS NULL OR b.batch_id = %(batch_id)s)
  AND (%(job_name)s::text IS NULL OR b.job_name = %(job_name)s)
  AND (%(state)s::text IS NULL OR b.state = %(state)s)
ORDER BY b.created_at DESC
LIMIT %(limit)s

-- name: batch_runs
-- A batch's runs: each item's run, subject, state, error and its recorded call's tokens.
SELECT i.run_id, r.subject_id, r.scheduled_at, i.lease_epoch, i.custom_id, i.state, i.error,
  r.status AS run_status, c.outcome AS call_outcome, c.input_tokens, c.output_tokens
FROM {schema}.batch_items AS i
JOIN {schema}.runs AS r ON r.run_id = i.run_id
LEFT JOIN {schema}.model_calls AS c ON c.run_id = i.run_id AND c.lease_epoch = i.lease_epoch
  AND c.worker_id = 'batch:' || i.batch_id
WHERE i.batch_id = %(batch_id)s
ORDER BY r.subject_id, r.scheduled_at

-- name: request_batch_cancel
-- Ask for a batch to be cancelled (the lane cancels it at the provider at its next step); not one already collected.
UPDATE {schema}.batches
SET cancel_requested_at = COALESCE(cancel_requested_at, now()),
  cancel_requested_by = COALESCE(cancel_requested_by, %(requested_by)s)
WHERE batch_id = %(batch_id)s AND state NOT IN ('collected', 'cancelled', 'expired', 'failed')
RETURNING batch_id, state, cancel_requested_at
