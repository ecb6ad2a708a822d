-- The shadows store: a new version's answers computed on stored runs' inputs (a shadow and its
-- items), their paid calls, their comparison, and the promotion that accepts changed ones.
-- Every write that follows a claim is fenced by the shadow's lease owner AND epoch: a process
-- whose lease was taken over writes nothing. All times are the database's now().

-- faces: admin

-- name: baseline_version
-- The version of the job's most recently completed run other than `version`.
SELECT version FROM {schema}.runs
WHERE job_name = %(job_name)s AND version <> %(version)s AND status = 'completed'
ORDER BY completed_at DESC NULLS LAST LIMIT 1

-- name: create_shadow
-- A new shadow of the job at `version` on its completed runs at `baseline_version`, and its items.
-- The runs chosen: completed, with their raw input kept, windows from `from` (included) to
-- `to` (excluded), among `subjects` when given; with `quarantined`, only those with an answer
-- that failed validation (an online call rejected, or a shadow's invalid answer), and also
-- such runs that never completed (failed or pending, not held); `sample` of them (NULL: all),
-- drawn by a hash of the run and the shadow, so a shadow's sample is fixed. Each item keeps the
-- run's revision and checkpoint as chosen. Returns the number of items.
WITH s AS (
  INSERT INTO {schema}.shadows (shadow_id, job_name, baseline_version, version, lane, budget,
    selection, provider, model, config_parts, requested_by)
  VALUES (%(shadow_id)s, %(job_name)s, %(baseline_version)s, %(version)s, %(lane)s,
    %(budget)s, %(selection)s::jsonb, %(provider)s, %(model)s, %(config_parts)s::jsonb,
    %(requested_by)s)
  RETURNING shadow_id
), chosen AS (
  INSERT INTO {schema}.shadow_items (shadow_id, run_id, revision, input_fingerprint)
  SELECT s.shadow_id, r.run_id, r.revision, r.input_fingerprint
  FROM s, {schema}.runs AS r
  WHERE r.job_name = %(job_name)s AND r.version = %(baseline_version)s
    AND r.raw_input IS NOT NULL
    AND (r.status = 'completed' AND r.output IS NOT NULL
      OR %(quarantined)s AND r.status IN ('pending', 'failed') AND r.lease_owner IS NULL)
    AND (%(from)s::timestamptz IS NULL OR r.scheduled_at >= %(from)s::timestamptz)
    AND (%(to)s::timestamptz IS NULL OR r.scheduled_at < %(to)s::timestamptz)
    AND (%(subjects)s::text[] IS NULL OR r.subject_id = ANY(%(subjects)s::text[]))
    AND (NOT %(quarantined)s OR EXISTS (SELECT FROM {schema}.model_calls AS c
        WHERE c.run_id = r.run_id AND c.outcome = 'rejected' AND c.shadow_id IS NULL)
      OR EXISTS (SELECT FROM {schema}.shadow_items AS q
        WHERE q.run_id = r.run_id AND q.state = 'answered' AND NOT q.valid))
  ORDER BY md5(r.run_id || s.shadow_id)
  LIMIT %(sample)s
  RETURNING run_id
)
SELECT count(*) FROM chosen

-- name: quarantine
-- The answers that failed validation, online (a call rejected) or in a shadow (an invalid item), newest first.
-- With the run, its input, the failure and the call's money; of one job or one shadow when given.
SELECT * FROM (
  SELECT 'shadow' AS source, i.shadow_id, s.version, r.run_id, r.job_name, r.subject_id,
    r.scheduled_at, r.status, i.error, i.money, r.raw_input, i.answered_at AS at
  FROM {schema}.shadow_items AS i JOIN {schema}.shadows AS s USING (shadow_id)
  JOIN {schema}.runs AS r ON r.run_id = i.run_id
  WHERE i.state = 'answered' AND NOT i.valid
  UNION ALL
  SELECT 'online', NULL, r.version, r.run_id, r.job_name, r.subject_id, r.scheduled_at,
    r.status, c.error, c.money, r.raw_input, c.called_at
  FROM {schema}.model_calls AS c JOIN {schema}.runs AS r ON r.run_id = c.run_id
  WHERE c.outcome = 'rejected' AND c.shadow_id IS NULL
) AS q
WHERE (%(job_name)s::text IS NULL OR q.job_name = %(job_name)s)
  AND (%(shadow_id)s::text IS NULL OR q.shadow_id = %(shadow_id)s)
ORDER BY q.at DESC NULLS LAST, q.run_id
LIMIT %(limit)s

-- name: list_shadows
-- The shadows of a job (every job when NULL), newest first.
SELECT * FROM {schema}.shadows
WHERE %(job_name)s::text IS NULL OR job_name = %(job_name)s
ORDER BY created_at DESC, shadow_id

-- faces: worker admin

-- name: get_shadow
-- One shadow, with its items' counts by state and verdict and its calls' money and tokens.
SELECT s.*,
  (SELECT jsonb_object_agg(x.state, x.n) FROM (SELECT i.state, count(*) AS n
    FROM {schema}.shadow_items AS i WHERE i.shadow_id = s.shadow_id GROUP BY i.state) AS x)
    AS item_states,
  (SELECT count(*) FROM {schema}.shadow_items AS i WHERE i.shadow_id = s.shadow_id) AS items,
  (SELECT sum(c.money) FROM {schema}.model_calls AS c WHERE c.shadow_id = s.shadow_id) AS money,
  (SELECT count(*) FROM {schema}.model_calls AS c WHERE c.shadow_id = s.shadow_id) AS calls,
  (SELECT count(*) FROM {schema}.model_calls AS c WHERE c.shadow_id = s.shadow_id
    AND c.money IS NULL AND c.billing <> 'in_doubt') AS unpriced,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.shadows AS s WHERE s.shadow_id = %(shadow_id)s

-- name: shadow_items
-- A shadow's items with their runs: identity, status, revision, accepted output and its calls' cost.
-- `run_money`: what the run's own accepted answer cost (its calls of the accepted revision).
SELECT i.*, r.subject_id, r.scheduled_at, r.status AS run_status, r.revision AS run_revision,
  r.input_fingerprint AS run_fingerprint, r.output AS accepted, r.raw_input,
  (SELECT sum(c.money) FROM {schema}.model_calls AS c WHERE c.run_id = r.run_id
    AND c.shadow_id IS NULL AND c.revision = i.revision) AS run_money,
  (SELECT sum(COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0))
    FROM {schema}.model_calls AS c WHERE c.run_id = r.run_id AND c.shadow_id IS NULL
    AND c.revision = i.revision) AS run_tokens
FROM {schema}.shadow_items AS i JOIN {schema}.runs AS r ON r.run_id = i.run_id
WHERE i.shadow_id = %(shadow_id)s AND (NOT %(pending_only)s OR i.state = 'pending')
ORDER BY r.scheduled_at, r.subject_id

-- name: shadow_gate
-- The shadows of the job at a version that were not dropped, newest first: what its gate reads.
SELECT shadow_id, state, summary, promoted_at FROM {schema}.shadows
WHERE job_name = %(job_name)s AND version = %(version)s AND state <> 'dropped'
ORDER BY state = 'promoted' DESC, created_at DESC

-- faces: worker

-- name: claim_shadow
-- Take the shadow's lease (free, expired or this worker's) to advance it; bumps its epoch.
-- A promoted or dropped shadow is not claimed.
UPDATE {schema}.shadows AS s
SET lease_owner = %(worker_id)s, lease_epoch = s.lease_epoch + 1,
  lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
WHERE s.shadow_id = %(shadow_id)s AND s.state NOT IN ('promoted', 'dropped')
  AND (s.lease_owner IS NULL OR s.lease_expires_at < now() OR s.lease_owner = %(worker_id)s)
RETURNING s.*

-- name: renew_shadow
-- Extend the shadow's lease, only while this worker holds it at this epoch.
UPDATE {schema}.shadows
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE shadow_id = %(shadow_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
RETURNING state

-- name: release_shadow
-- Give the shadow's lease back (the next process takes it at once).
UPDATE {schema}.shadows SET lease_owner = NULL, lease_expires_at = NULL
WHERE shadow_id = %(shadow_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
RETURNING shadow_id

-- name: shadow_to
-- Move the shadow to `state` from one of `from_states`, with its summary, error, provider batch or promotion's choice.
-- Fenced by its lease; returns the state it is in now (no row: the lease was lost).
UPDATE {schema}.shadows AS s
SET state = CASE WHEN s.state = ANY(%(from_states)s::text[]) THEN %(state)s ELSE s.state END,
  summary = COALESCE(%(summary)s::jsonb, s.summary), error = COALESCE(%(error)s, s.error),
  provider_batch_id = COALESCE(%(provider_batch_id)s, s.provider_batch_id),
  revise = CASE WHEN %(state)s = 'promoting' AND s.state = 'compared' THEN %(revise)s
    ELSE s.revise END,
  channels = CASE WHEN %(state)s = 'promoting' AND s.state = 'compared' THEN %(channels)s
    ELSE s.channels END,
  duplicates = s.duplicates + %(duplicates)s,
  promoted_at = CASE WHEN %(state)s = 'promoted' THEN COALESCE(s.promoted_at, now())
    ELSE s.promoted_at END,
  dropped_at = CASE WHEN %(state)s = 'dropped' THEN COALESCE(s.dropped_at, now())
    ELSE s.dropped_at END,
  updated_at = now()
WHERE s.shadow_id = %(shadow_id)s AND s.lease_owner = %(worker_id)s
  AND s.lease_epoch = %(epoch)s
RETURNING s.state

-- name: shadow_start_submit
-- Mark, and commit, that the shadow's batch create is about to be made; `earlier`: an earlier mark (a create that may have reached the provider).
-- The first mark is kept: a search after a later crash looks back to the first create.
WITH prev AS (
  SELECT submit_started_at FROM {schema}.shadows
  WHERE shadow_id = %(shadow_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND state = 'started' AND provider_batch_id IS NULL
  FOR UPDATE
)
UPDATE {schema}.shadows AS s
SET submit_started_at = COALESCE(prev.submit_started_at, now()), updated_at = now()
FROM prev WHERE s.shadow_id = %(shadow_id)s
RETURNING prev.submit_started_at AS earlier, s.submit_started_at AS started

-- name: admit_shadow_item
-- Admit one item's request under the shadow's budget and the job's (the ledger's function `admit_shadow_item`).
SELECT v.*, r.job_name, COALESCE(v.subject_id, r.subject_id) AS subject,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.admit_shadow_item(%(shadow_id)s, %(worker_id)s, %(epoch)s, %(run_id)s,
  %(max_input)s::bigint, %(max_output)s::bigint, %(requested)s, %(tier)s) AS v
LEFT JOIN {schema}.runs AS r ON r.run_id = %(run_id)s

-- name: record_shadow_call
-- Record a pending item's paid call and its answer (or its error), once; fenced by the shadow's lease.
-- The call is the job's (`model_calls`, outcome `shadow`, the shadow's worker id at epoch 0),
-- priced by its hold and settled against every budget by the ledger's triggers. `outcome`:
-- `applied`, `already_done` (the item was recorded before: nothing added) or `lease_lost`.
-- Not `final` (a request of the online lane whose answer a repair turn follows): the call only.
-- The final call is the one a promotion's commit accepts (caller `shadow:<id>`, retry 0).
WITH s AS (
  SELECT shadow_id FROM {schema}.shadows
  WHERE shadow_id = %(shadow_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  FOR UPDATE
), item AS (
  SELECT i.run_id, i.revision, i.held FROM {schema}.shadow_items AS i JOIN s USING (shadow_id)
  WHERE i.run_id = %(run_id)s AND i.state = 'pending'
  FOR UPDATE OF i
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
    requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    reasoning_tokens, provider_name, tier, shadow_id)
  SELECT run_id, 0, revision, 'shadow:' || %(shadow_id)s, 'shadow:' || %(shadow_id)s,
    'shadow', CASE WHEN %(final)s THEN 0 END, %(model_name)s, %(input_tokens)s, %(output_tokens)s, 'shadow', %(error)s,
    %(u_rm)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s, %(u_rt)s, %(u_pn)s, %(u_tier)s,
    %(shadow_id)s
  FROM item
  RETURNING call_id, money
), done AS (
  UPDATE {schema}.shadow_items AS i
  SET state = %(state)s, answer = %(answer)s::jsonb, valid = %(valid)s, error = %(error)s,
    held = 0, answered_at = now(), input_tokens = %(input_tokens)s,
    output_tokens = %(output_tokens)s,
    call_id = (SELECT call_id FROM call), money = (SELECT money FROM call)
  FROM item
  WHERE i.shadow_id = %(shadow_id)s AND i.run_id = item.run_id AND %(final)s
  RETURNING i.run_id
), totals AS (
  UPDATE {schema}.shadows AS x
  SET spent_total = x.spent_total + COALESCE((SELECT money FROM call), 0),
    held_total = x.held_total - CASE WHEN %(final)s THEN item.held ELSE 0 END
  FROM item WHERE x.shadow_id = %(shadow_id)s
)
SELECT CASE WHEN NOT EXISTS (SELECT FROM s) THEN 'lease_lost'
    WHEN EXISTS (SELECT FROM item) THEN 'applied' ELSE 'already_done' END,
  (SELECT money FROM call), (SELECT count(*) FROM done)

-- name: end_shadow_item
-- End a pending item with no paid call (no result: expired, cancelled; or its request could not be built), giving its holds back.
WITH s AS (
  SELECT shadow_id FROM {schema}.shadows
  WHERE shadow_id = %(shadow_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  FOR UPDATE
), before AS (
  SELECT i.run_id, i.held FROM {schema}.shadow_items AS i JOIN s USING (shadow_id)
  WHERE i.run_id = %(run_id)s AND i.state = 'pending'
  FOR UPDATE OF i
), item AS (
  UPDATE {schema}.shadow_items AS i
  SET state = %(state)s, error = %(error)s, held = 0, answered_at = now()
  FROM before WHERE i.shadow_id = %(shadow_id)s AND i.run_id = before.run_id
  RETURNING i.run_id
), totals AS (
  UPDATE {schema}.shadows AS x SET held_total = x.held_total - before.held
  FROM before WHERE x.shadow_id = %(shadow_id)s
)
SELECT {schema}.release_holds(item.run_id, 0, 'shadow:' || %(shadow_id)s) FROM item

-- name: judge_shadow_item
-- Record an item's verdict (its comparison with the accepted answer), once; fenced by the shadow's lease.
UPDATE {schema}.shadow_items AS i
SET verdict = %(verdict)s, score = %(score)s, detail = %(detail)s::jsonb
FROM {schema}.shadows AS s
WHERE i.shadow_id = %(shadow_id)s AND i.run_id = %(run_id)s AND i.verdict IS NULL
  AND s.shadow_id = i.shadow_id AND s.lease_owner = %(worker_id)s
  AND s.lease_epoch = %(epoch)s
RETURNING i.run_id

-- name: mark_item_promoted
-- Record the revision an item's answer was accepted under by the promotion; fenced by the shadow's lease.
UPDATE {schema}.shadow_items AS i SET promoted_revision = %(revision)s
FROM {schema}.shadows AS s
WHERE i.shadow_id = %(shadow_id)s AND i.run_id = %(run_id)s
  AND s.shadow_id = i.shadow_id AND s.lease_owner = %(worker_id)s
  AND s.lease_epoch = %(epoch)s
RETURNING i.run_id
