-- The calls store: paid model calls recorded once (with their answer, a lost lease's, a turn's),
-- and what they cost: spend by job and kind, calls in doubt and their settlement, a job's history.
-- Every write that follows a claim is fenced by lease owner AND lease epoch AND status 'running':
-- a worker whose lease was reclaimed (the epoch moved on) writes nothing. All times are the
-- database's now(): workers pass durations.

-- faces: worker

-- name: record_answer
-- Record a paid call and its answer under the lease, before the answer leaves the step.
-- Fenced by owner, epoch and status: a lost lease records nothing here (the caller records the
-- call as `lease_lost`). Once per caller run, step and retry: a retried statement adds no
-- second row. The outcome `answered` waits for the commit, which updates this row.
INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error, answer,
  input_fingerprint, config_parts, requested_model,
  cache_read_tokens, cache_write_tokens, cache_write_1h_tokens, reasoning_tokens, provider_name, tier)
SELECT r.run_id, r.lease_epoch, %(revision)s::integer, %(worker_id)s, %(c_run)s,
  %(c_step)s, %(c_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'answered', NULL, %(answer)s::jsonb, %(input_fingerprint)s, %(config_parts)s::jsonb,
  %(u_rm)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
FROM {schema}.runs AS r
WHERE r.run_id = %(run_id)s AND r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s
  AND r.status = 'running'
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = r.run_id AND c.caller_run_id = %(c_run)s
      AND c.caller_step = %(c_step)s AND c.retry_number = %(c_retry)s
      AND c.turn IS NULL)
RETURNING call_id, money  -- priced as it was recorded (NULL: unknown)

-- name: recorded_answer
-- The latest recorded answer still waiting for its commit on this revision and checkpoint.
SELECT answer, model_name, input_tokens, output_tokens, caller_run_id, caller_step,
  retry_number, config_parts, requested_model, cache_read_tokens, cache_write_tokens,
  cache_write_1h_tokens, reasoning_tokens, provider_name, tier
FROM {schema}.model_calls
WHERE run_id = %(run_id)s AND outcome = 'answered' AND revision = %(revision)s::integer
  AND input_fingerprint IS NOT DISTINCT FROM %(input_fingerprint)s::text
ORDER BY call_id DESC
LIMIT 1

-- name: record_lost_call
-- Record a paid model call of a lease that was lost before the call could be committed.
-- Only the call's cost is written, never the run's state: the row names an epoch this worker
-- held (the claim that took the run over recorded that attempt as this worker's), once per
-- epoch and worker, so a retried statement adds no second row. A call already recorded from the
-- same caller run, step and retry (`answered` by Dagster's `transform`, then committed by a
-- later claim that lost its lease too) is in the books already: no second row, and it stays
-- as it was (an `answered` one reusable).
-- Turns recorded while the attempt went on (`record_turn`) are other calls: they count for
-- neither check.
INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
  requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
  reasoning_tokens, provider_name, tier)
SELECT a.run_id, a.lease_epoch, %(revision)s::integer, a.worker_id, %(c_run)s,
  %(c_step)s, %(c_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'lease_lost', %(error)s, %(u_rm)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
FROM {schema}.run_attempts AS a
WHERE a.run_id = %(run_id)s AND a.lease_epoch = %(epoch)s AND a.worker_id = %(worker_id)s
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.lease_epoch = a.lease_epoch AND c.worker_id = a.worker_id
      AND c.turn IS NULL)
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.caller_run_id = %(c_run)s
      AND c.caller_step = %(c_step)s AND c.retry_number = %(c_retry)s
      AND c.turn IS NULL)
RETURNING call_id, money

-- name: record_turn
-- Record a paid call made while its attempt goes on, numbered within the attempt (`turn`).
-- Such a call is a structured answer that failed its schema before a repair turn, or a provider
-- call that failed before a retry. Recorded as it ends, so a crash later loses none, and counted in the spend
-- (the trigger). Fenced to an epoch this worker holds (the outcome given) or held
-- (`lease_lost`: another claim took the run over, and the call is still paid for); nothing for
-- an epoch that was never this worker's. A retried statement adds no second row.
INSERT INTO {schema}.model_calls AS c (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
  requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
  reasoning_tokens, provider_name, tier, turn)
SELECT r.run_id, %(epoch)s, %(revision)s::integer, %(worker_id)s, %(c_run)s,
  %(c_step)s, %(c_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  CASE WHEN r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s
    AND r.status = 'running' THEN %(call_outcome)s ELSE 'lease_lost' END,
  %(error)s, %(u_rm)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s, %(turn)s
FROM {schema}.runs AS r
WHERE r.run_id = %(run_id)s
  AND ((r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s AND r.status = 'running')
    OR EXISTS (SELECT FROM {schema}.run_attempts AS a WHERE a.run_id = r.run_id
      AND a.lease_epoch = %(epoch)s AND a.worker_id = %(worker_id)s))
ON CONFLICT (run_id, lease_epoch, worker_id, turn) WHERE turn IS NOT NULL DO NOTHING
RETURNING c.outcome, c.money

-- name: admit_request
-- Admit one request of a model call in one round trip: lease, budget hold, rate-limit place.
-- Each part is asked for by its parameter and runs only once the one before it admitted the
-- request: `renew` extends the lease (else the fence is only checked), `hold` reserves the
-- request's worst case under every budget covering its job (the ledger's `reserve_budget`,
-- which fixes the price in force), `provider` asks its place under that provider's limit (the
-- ledger's `take_rate_place`). A lost lease holds and places nothing; a budget's refusal takes
-- no place. The hold commits as the lease does (`lease_commit`, see runs.sql).
WITH renewed AS (
  UPDATE {schema}.runs SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
  WHERE %(renew)s AND run_id = %(run_id)s AND lease_owner = %(worker_id)s
    AND lease_epoch = %(epoch)s AND status = 'running'
  RETURNING job_name, subject_id, set_config('synchronous_commit',
    COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true) AS mode
), fence AS (
  SELECT job_name, subject_id FROM renewed
  UNION ALL
  SELECT job_name, subject_id FROM {schema}.runs
  WHERE NOT %(renew)s AND run_id = %(run_id)s AND lease_owner = %(worker_id)s
    AND lease_epoch = %(epoch)s AND status = 'running'
), hold AS (
  SELECT v.* FROM fence AS f, LATERAL {schema}.reserve_budget(%(run_id)s, %(epoch)s,
    %(worker_id)s, %(max_input)s::bigint, %(max_output)s::bigint, %(max_total)s::bigint,
    %(requested)s, NULL, NULL, f.job_name, f.subject_id) AS v
  WHERE %(hold)s
), place AS (
  SELECT p.* FROM fence, LATERAL {schema}.take_rate_place(%(run_id)s, %(provider)s,
    %(model)s, %(key_name)s, %(tokens)s::bigint, %(burst)s::float8, %(pace)s::float8) AS p
  WHERE %(provider)s::text IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM hold WHERE hold.outcome <> 'admitted')
)
SELECT f.job_name, f.subject_id, h.outcome, h.budget_id, h.amount, h.spent, h.reserved,
  h.wanted, h.period_start, (SELECT currency FROM {schema}.ledger_currency) AS currency,
  (SELECT p.granted FROM place AS p) AS granted,
  (SELECT p.wait_seconds FROM place AS p) AS wait_seconds
FROM fence AS f LEFT JOIN hold AS h ON true

-- faces: worker admin

-- name: list_model_calls
-- A run's model calls, oldest first.
SELECT * FROM {schema}.model_calls WHERE run_id = %(run_id)s ORDER BY call_id

-- faces: admin

-- name: call_costs
-- One run's calls and the money each was recorded with (NULL: unknown).
SELECT c.call_id, c.money AS cost
FROM {schema}.model_calls AS c
WHERE c.run_id = %(run_id)s
ORDER BY c.call_id

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
