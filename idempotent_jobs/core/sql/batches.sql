-- The batches store: provider batches of the batch lane, their items, claims and collection.
-- Every write that follows a claim is fenced by lease owner AND lease epoch AND status 'running':
-- a worker whose lease was reclaimed (the epoch moved on) writes nothing. All times are the
-- database's now(): workers pass durations.

-- faces: worker

-- name: open_batch
-- Open a batch under this worker's lease on it (epoch 1): the intent, empty until its items are added.
INSERT INTO {schema}.batches (batch_id, job_name, provider, model, lease_owner, lease_epoch,
  lease_expires_at, lease_seconds, caller_run_id)
VALUES (%(batch_id)s, %(job_name)s, %(provider)s, %(model)s, %(worker_id)s, 1,
  now() + make_interval(secs => %(lease_seconds)s), %(lease_seconds)s, %(caller_run_id)s)
RETURNING lease_epoch, lease_expires_at

-- name: add_batch_items
-- Add the runs the batch holds (owner `batch:<id>`, at their epochs) as its items, while the batch's lease is held.
-- A run the batch does not hold at that epoch is left out (returned rows: the items added).
WITH b AS (
  UPDATE {schema}.batches SET items = items + (SELECT count(*) FROM unnest(%(run_ids)s::text[]))
  WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND state = 'intent' AND submit_started_at IS NULL
  RETURNING batch_id
)
INSERT INTO {schema}.batch_items (batch_id, run_id, lease_epoch, custom_id)
SELECT b.batch_id, u.run_id, u.epoch, u.custom_id
FROM b CROSS JOIN unnest(%(run_ids)s::text[], %(epochs)s::integer[], %(custom_ids)s::text[])
  AS u(run_id, epoch, custom_id)
JOIN {schema}.runs AS r ON r.run_id = u.run_id AND r.lease_owner = 'batch:' || b.batch_id
  AND r.lease_epoch = u.epoch AND r.status = 'running'
RETURNING run_id

-- name: claim_batch
-- Take the batch's lease (free, expired or this worker's) to advance it, and extend the leases it holds on its pending runs.
-- Bumps the batch's epoch: a worker that advanced it before can no longer write to it. A
-- collected batch is not claimed. Returns the batch with its new epoch.
WITH b AS (
  UPDATE {schema}.batches AS x
  SET lease_owner = %(worker_id)s, lease_epoch = x.lease_epoch + 1,
    lease_expires_at = now() + make_interval(secs => x.lease_seconds)
  WHERE x.batch_id = %(batch_id)s AND x.state <> 'collected'
    AND (x.lease_owner IS NULL OR x.lease_expires_at < now() OR x.lease_owner = %(worker_id)s)
  RETURNING x.*
), held AS (
  UPDATE {schema}.runs AS r SET lease_expires_at = b.lease_expires_at
  FROM b, {schema}.batch_items AS i
  WHERE i.batch_id = b.batch_id AND i.state = 'pending' AND r.run_id = i.run_id
    AND r.lease_owner = 'batch:' || b.batch_id AND r.lease_epoch = i.lease_epoch
    AND r.status = 'running'
  RETURNING r.run_id
)
SELECT b.*, (SELECT count(*) FROM held) AS runs_held FROM b

-- name: renew_batch
-- Extend the batch's lease and, with it, the leases it holds on its pending runs; only while this worker holds it.
WITH b AS (
  UPDATE {schema}.batches AS x
  SET lease_expires_at = now() + make_interval(secs => x.lease_seconds)
  WHERE x.batch_id = %(batch_id)s AND x.lease_owner = %(worker_id)s
    AND x.lease_epoch = %(epoch)s AND x.state <> 'collected'
  RETURNING x.batch_id, x.lease_expires_at, x.state
), held AS (
  UPDATE {schema}.runs AS r SET lease_expires_at = b.lease_expires_at
  FROM b, {schema}.batch_items AS i
  WHERE i.batch_id = b.batch_id AND i.state = 'pending' AND r.run_id = i.run_id
    AND r.lease_owner = 'batch:' || b.batch_id AND r.lease_epoch = i.lease_epoch
    AND r.status = 'running'
  RETURNING r.run_id
)
SELECT b.lease_expires_at, b.state, (SELECT count(*) FROM held) AS runs_held FROM b

-- name: start_submit
-- Mark, and commit, that the batch's create call is about to be made; say whether one may have been made before.
-- `earlier`: the time an earlier start was marked (a create that may have reached the
-- provider), NULL on the first. Only an intent with no provider id, under the batch's lease.
WITH prev AS (
  SELECT submit_started_at FROM {schema}.batches
  WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND state = 'intent' AND provider_batch_id IS NULL
  FOR UPDATE
)
UPDATE {schema}.batches AS x SET submit_started_at = COALESCE(x.submit_started_at, now())
FROM prev
WHERE x.batch_id = %(batch_id)s
RETURNING prev.submit_started_at AS earlier, x.submit_started_at AS started

-- name: record_submitted
-- Record the provider's batch id for the intent (once: a batch keeps the first id recorded), under the batch's lease.
WITH b AS (
  UPDATE {schema}.batches
  SET provider_batch_id = %(provider_batch_id)s, state = 'submitted', submitted_at = now()
  WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND state = 'intent' AND provider_batch_id IS NULL
  RETURNING batch_id
)
INSERT INTO {schema}.batch_submissions (batch_id, provider_batch_id, role, how)
SELECT batch_id, %(provider_batch_id)s, 'adopted', %(how)s FROM b
RETURNING provider_batch_id

-- name: record_duplicate
-- Record a second provider batch found for the batch's intent, and when it was cancelled.
INSERT INTO {schema}.batch_submissions AS s (batch_id, provider_batch_id, role, how,
  cancelled_at)
SELECT batch_id, %(provider_batch_id)s, 'duplicate', %(how)s,
  CASE WHEN %(cancelled)s THEN now() END
FROM {schema}.batches
WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
ON CONFLICT (batch_id, provider_batch_id) DO UPDATE
SET cancelled_at = COALESCE(s.cancelled_at, EXCLUDED.cancelled_at)
RETURNING role

-- name: record_batch_status
-- Record what the provider says of the batch (its state and counts), under the batch's lease.
-- An ended state (`completed`, `expired`, `failed`, `cancelled`) is kept once reached.
UPDATE {schema}.batches
SET state = CASE WHEN state = 'submitted' THEN %(state)s ELSE state END,
  provider_status = %(status)s::jsonb, checked_at = now(),
  ended_at = CASE WHEN %(state)s <> 'submitted' THEN COALESCE(ended_at, now()) END,
  error = COALESCE(%(error)s, error)
WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  AND state IN ('submitted', 'completed', 'expired', 'failed', 'cancelled')
RETURNING state

-- name: fail_batch_intent
-- End an intent that will not be submitted (a budget refused it, it has no items, an operator cancelled it), under the batch's lease.
UPDATE {schema}.batches SET state = %(state)s, error = %(error)s, ended_at = now()
WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  AND state = 'intent' AND provider_batch_id IS NULL
RETURNING state

-- name: batch_cancel_sent
-- Record that the provider was asked to cancel the batch an operator cancelled, under the batch's lease.
UPDATE {schema}.batches SET cancel_sent_at = COALESCE(cancel_sent_at, now())
WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
RETURNING cancel_sent_at

-- name: batch_items
-- The batch's items with their runs' checkpoints, in custom_id order.
SELECT i.run_id, i.lease_epoch, i.custom_id, i.state, r.raw_input, r.revision,
  r.input_fingerprint, r.job_name, r.subject_id, r.scheduled_at, r.version
FROM {schema}.batch_items AS i JOIN {schema}.runs AS r ON r.run_id = i.run_id
WHERE i.batch_id = %(batch_id)s AND (NOT %(pending_only)s OR i.state = 'pending')
ORDER BY i.custom_id

-- name: end_batch_item
-- Mark one pending item of the batch as taken (accepted, not accepted, failed or released), under the batch's lease.
UPDATE {schema}.batch_items AS i SET state = %(state)s, error = %(error)s, ended_at = now()
FROM {schema}.batches AS b
WHERE i.batch_id = %(batch_id)s AND i.run_id = %(run_id)s AND i.state = 'pending'
  AND b.batch_id = i.batch_id AND b.lease_owner = %(worker_id)s AND b.lease_epoch = %(epoch)s
RETURNING i.state

-- name: batch_item_paid
-- Whether the call of a batch item (its run, epoch and the batch as worker) is recorded already.
SELECT EXISTS (SELECT FROM {schema}.model_calls
  WHERE run_id = %(run_id)s AND lease_epoch = %(lease_epoch)s AND worker_id = %(item_worker)s)

-- name: finish_batch
-- Mark the batch collected once it has no pending item, under the batch's lease; its lease is given back.
UPDATE {schema}.batches AS b
SET state = 'collected', collected_at = now(), lease_owner = NULL, lease_expires_at = NULL,
  failed_steps = 0
WHERE b.batch_id = %(batch_id)s AND b.lease_owner = %(worker_id)s AND b.lease_epoch = %(epoch)s
  AND b.state IN ('completed', 'expired', 'failed', 'cancelled')
  AND NOT EXISTS (SELECT FROM {schema}.batch_items AS i
    WHERE i.batch_id = b.batch_id AND i.state = 'pending')
RETURNING state

-- name: get_batch
-- One batch, with its items counted by state and the money of its recorded calls.
-- Money as each call was recorded; `unpriced`: calls with none (no price, or in doubt).
SELECT b.*, (SELECT jsonb_object_agg(s.state, s.n) FROM (SELECT i.state, count(*) AS n
    FROM {schema}.batch_items AS i WHERE i.batch_id = b.batch_id GROUP BY i.state) AS s)
  AS item_states,
  m.money, m.unpriced, (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.batches AS b
LEFT JOIN LATERAL (
  SELECT sum(c.money) AS money, count(*) FILTER (WHERE c.money IS NULL) AS unpriced
  FROM {schema}.batch_items AS i
  JOIN {schema}.model_calls AS c ON c.run_id = i.run_id AND c.lease_epoch = i.lease_epoch
    AND c.worker_id = 'batch:' || i.batch_id
  WHERE i.batch_id = b.batch_id
) AS m ON true
WHERE b.batch_id = %(batch_id)s

-- name: open_batches
-- The batches not yet collected, of some jobs or all, oldest first.
SELECT batch_id FROM {schema}.batches
WHERE state <> 'collected'
  AND (%(job_names)s::text[] IS NULL OR job_name = ANY(%(job_names)s::text[]))
ORDER BY created_at

-- name: last_collected
-- When the newest collected batch of some jobs was collected (NULL: none yet).
SELECT max(collected_at) FROM {schema}.batches
WHERE state = 'collected' AND job_name = ANY(%(job_names)s::text[])

-- name: collected_runs
-- The items of the batches collected after a time, with what became of each, oldest batch first (the lane's sensor requests a run of each accepted partition and names the others).
SELECT b.batch_id, b.collected_at, r.subject_id, r.scheduled_at, i.state
FROM {schema}.batches AS b
JOIN {schema}.batch_items AS i ON i.batch_id = b.batch_id
JOIN {schema}.runs AS r ON r.run_id = i.run_id
WHERE b.state = 'collected' AND b.job_name = ANY(%(job_names)s::text[])
  AND b.collected_at > %(since)s::timestamptz
ORDER BY b.collected_at, b.batch_id, r.subject_id, r.scheduled_at

-- name: recorded_provider_batches
-- Which of these provider batch ids a batch of the ledger has recorded (adopted or as a duplicate).
SELECT provider_batch_id FROM {schema}.batch_submissions
WHERE provider_batch_id = ANY(%(ids)s::text[])
UNION
SELECT provider_batch_id FROM {schema}.batches WHERE provider_batch_id = ANY(%(ids)s::text[])

-- name: release_batch
-- Give the batch's lease back (the process that opened it hands it to the lane's sensor); the leases it holds on its runs stay.
UPDATE {schema}.batches SET lease_owner = NULL, lease_expires_at = NULL
WHERE batch_id = %(batch_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
RETURNING batch_id

-- name: give_back_strays
-- Give back what the batch claimed and never made an item (its opener died, or lost the batch, between its claims and its items): their holds and their runs, under the batch's lease.
-- Found by their holds (`batch:<id>`, not a pending item's); each run still held at that epoch
-- goes back to pending, its attempt ended superseded. A stray with no hold (no budget) is left
-- to its own lease, which lapsed with the batch's.
WITH b AS (
  SELECT x.batch_id FROM {schema}.batches AS x
  WHERE x.batch_id = %(batch_id)s AND x.lease_owner = %(worker_id)s AND x.lease_epoch = %(epoch)s
), stray AS (
  SELECT DISTINCT h.run_id, h.lease_epoch, h.worker_id FROM {schema}.budget_holds AS h, b
  WHERE h.worker_id = 'batch:' || b.batch_id
    AND NOT EXISTS (SELECT FROM {schema}.batch_items AS i WHERE i.batch_id = b.batch_id
      AND i.run_id = h.run_id AND i.state = 'pending')
), freed AS (
  SELECT {schema}.release_holds(s.run_id, s.lease_epoch, s.worker_id) FROM stray AS s
), released AS (
  UPDATE {schema}.runs AS r
  SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM stray AS i
  WHERE r.run_id = i.run_id AND r.lease_owner = 'batch:' || %(batch_id)s
    AND r.lease_epoch = i.lease_epoch AND r.status = 'running'
  RETURNING r.run_id, r.lease_epoch, r.lease_started_at, r.lease_caller_run_id,
    r.lease_caller_step
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT run_id, lease_epoch, 'batch:' || %(batch_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(), 'superseded'
  FROM released
  ON CONFLICT (run_id, lease_epoch) DO NOTHING
)
SELECT (SELECT count(*) FROM freed) AS holds, (SELECT count(*) FROM released) AS runs

-- name: discard_batch_intent
-- Forget an intent that claimed nothing (every run of its range was done or held elsewhere): no batch is recorded for it, under the batch's lease.
DELETE FROM {schema}.batches AS b
WHERE b.batch_id = %(batch_id)s AND b.lease_owner = %(worker_id)s AND b.lease_epoch = %(epoch)s
  AND b.state = 'intent' AND b.submit_started_at IS NULL
  AND NOT EXISTS (SELECT FROM {schema}.batch_items AS i WHERE i.batch_id = b.batch_id)
  AND NOT EXISTS (SELECT FROM {schema}.budget_holds AS h
    WHERE h.worker_id = 'batch:' || b.batch_id)
RETURNING b.batch_id

-- name: end_batch_step
-- Record how the batch's step ended: a failure counts one more in a row (with its error), a step that ended well resets the count; under the batch's lease, or as the last owner whose lease lapsed.
UPDATE {schema}.batches AS b
SET failed_steps = CASE WHEN %(error)s::text IS NULL THEN 0 ELSE b.failed_steps + 1 END,
  last_step_error = %(error)s::text
WHERE b.batch_id = %(batch_id)s AND b.lease_owner = %(worker_id)s AND b.lease_epoch = %(epoch)s
RETURNING b.failed_steps

-- faces: admin

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
