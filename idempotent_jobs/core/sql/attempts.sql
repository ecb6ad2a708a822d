-- The attempts store: how an attempt ends (the fenced commit of an answer, a failure, the
-- end of an attempt a Dagster run holds), and the operator's read of them.
-- Every write that follows a claim is fenced by lease owner AND lease epoch AND status 'running':
-- a worker whose lease was reclaimed (the epoch moved on) writes nothing. All times are the
-- database's now(): workers pass durations.

-- faces: worker

-- name: complete
-- Accept a candidate answer and queue its notifications, or refuse it as stale; say which.
-- The final commit, one statement so one transaction: a candidate is accepted only on the revision
-- and raw-input checkpoint it was computed against (a revise moves the revision, a recollect the
-- checkpoint; a basis without a fingerprint binds the revision only). Accepted: output, config
-- fingerprint, the attempt's outcome and usage, the model call, and the outbox rows (one per
-- channel and revision, never twice: the outbox's key; a revised run notifies only the channels its
-- revision named).
-- Stale: nothing of it is stored or sent, the lease is given back (the run waits, pending, for an
-- answer on its current basis), and the attempt and the model call end `superseded`/`stale`.
-- `outcome` states what happened: `applied` (accepted now), `stale` (refused now, or by this
-- lease's earlier statement whose answer was lost), `already_done` (the run is completed; `mine`
-- says whether by this lease) or `lease_lost`. The row is read under its lock, so the outcome is
-- the row's latest committed state, not the statement's snapshot. A model call is one row however
-- often its answer is committed: a call already recorded from the same caller run, step and
-- retry (a re-execution committing the answer an earlier Dagster run paid for, after that run's
-- commit failed or was refused as stale) has its outcome updated, never a second row. A caller
-- that names no run or retry (run_idempotent's own calls are committed once) is not matched.
-- A recorded answer (`answered`) is dropped from the call's row once its commit decides it: the
-- accepted output lives on the run, under the retention policy, and nowhere else. The output
-- returned is the row's (a stale commit left it as it was); last, the money of the call this
-- statement recorded (NULL: none recorded here, no price, or in doubt), for the metrics.
-- `carried` (with its fingerprint, `carried_fp`): the raw-input checkpoint the answer was
-- computed on, when it travelled with the model call rather than before it (run_idempotent):
-- stored here if no checkpoint is yet (the first value wins, as in `save_raw_input`), accepted
-- or stale; a stored one is the basis the answer is checked against (`basis_fp`, the answer's,
-- is the carried one's).
WITH cur AS (
  SELECT k.*, (lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s AND status = 'running')
      IS TRUE AS mine,
    (revision = %(revision)s::integer AND fp IS NOT DISTINCT FROM COALESCE(%(basis_fp)s, fp))
      AS holds
  FROM (SELECT run_id, status, lease_epoch, lease_owner, output, revision,
      config_parts, CASE WHEN raw_input IS NULL THEN COALESCE(%(carried_fp)s, input_fingerprint)
        ELSE input_fingerprint END AS fp
    FROM {schema}.runs WHERE run_id = %(run_id)s FOR UPDATE) AS k
), done AS (
  UPDATE {schema}.runs AS r
  SET status = CASE WHEN cur.holds THEN 'completed' ELSE 'pending' END,
    output = CASE WHEN cur.holds THEN %(output)s::jsonb ELSE r.output END,
    completed_at = CASE WHEN cur.holds THEN now() ELSE r.completed_at END,
    config_fingerprint = CASE WHEN cur.holds
      THEN %(config_fp)s ELSE r.config_fingerprint END,
    config_parts = CASE WHEN cur.holds THEN %(config_parts)s::jsonb ELSE r.config_parts END,
    last_error = CASE WHEN cur.holds THEN NULL ELSE r.last_error END,
    raw_input = COALESCE(r.raw_input, %(carried)s::jsonb), input_fingerprint = cur.fp,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM cur
  WHERE r.run_id = cur.run_id AND cur.mine
  RETURNING r.run_id, r.lease_epoch, r.output, r.revision, r.input_fingerprint,
    r.lease_started_at, r.lease_caller_run_id, r.lease_caller_step, cur.holds AS accepted
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens)
  SELECT run_id, lease_epoch, %(worker_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(),
    CASE WHEN accepted THEN 'completed' ELSE 'superseded' END,
    CASE WHEN NOT accepted THEN %(computed_on)s::text || revision || ', checkpoint '
      || COALESCE(left(input_fingerprint, 12), 'none') END,
    %(model_name)s, %(input_tokens)s, %(output_tokens)s
  FROM done
), again AS (
  UPDATE {schema}.model_calls AS c
  SET outcome = CASE WHEN done.accepted THEN 'accepted' ELSE 'stale' END, error = NULL,
    answer = NULL
  FROM done
  WHERE c.run_id = done.run_id AND c.turn IS NULL AND (c.caller_run_id, c.caller_step,
    c.retry_number) = (%(c_run)s, %(c_step)s, %(c_retry)s)
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome,
    requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    reasoning_tokens, provider_name, tier)
  SELECT run_id, lease_epoch, %(revision)s::integer, %(worker_id)s, %(c_run)s,
    %(c_step)s, %(c_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    CASE WHEN accepted THEN 'accepted' ELSE 'stale' END, %(u_rm)s,
    %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
  FROM done
  WHERE NOT EXISTS (SELECT FROM again)
  RETURNING money
), outbox AS (
  INSERT INTO {schema}.notification_outbox (run_id, channel, payload, revision)
  SELECT done.run_id, n.key, n.value, done.revision
  FROM done, jsonb_each(%(messages)s::jsonb) AS n
  WHERE done.accepted AND (done.revision = 0 OR n.key IN (
    SELECT unnest(rv.channels) FROM {schema}.run_revisions AS rv
    WHERE rv.run_id = done.run_id AND rv.revision = done.revision))
  ON CONFLICT DO NOTHING
)
SELECT CASE
    WHEN done.run_id IS NOT NULL THEN CASE WHEN done.accepted THEN 'applied' ELSE 'stale' END
    WHEN cur.status = 'completed' THEN 'already_done'
    WHEN cur.status = 'pending' AND cur.lease_epoch = %(epoch)s AND NOT cur.holds THEN 'stale'
    ELSE 'lease_lost' END,
  COALESCE(done.output, cur.output),
  cur.revision, cur.fp, cur.lease_epoch = %(epoch)s, cur.config_parts,
  (SELECT money FROM call)
FROM cur LEFT JOIN done ON true

-- name: fail
-- Record a failed attempt under the lease and free the run for a retry; say what happened.
-- A failed attempt: the run becomes claimable again; the reason is kept on run and attempt, and
-- on the model call's row when a model call failed or its answer was rejected. `outcome`:
-- `applied`, `already_done` (this very failure landed before: a retry after a lost answer) or
-- `lease_lost` (another claim moved the run on: nothing written). A call already recorded from
-- the same caller run, step and retry gets the new outcome instead of a second row (see
-- `complete`). Last, the money of the call row this statement added, and whether it added one
-- (the metrics count each call once).
WITH cur AS (
  SELECT run_id, status, lease_epoch, last_error,
    COALESCE(lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s AND status = 'running',
      false) AS mine
  FROM {schema}.runs
  WHERE run_id = %(run_id)s
  FOR UPDATE
), failed AS (
  UPDATE {schema}.runs AS r
  SET status = 'failed', last_error = %(error)s, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()
  FROM cur
  WHERE r.run_id = cur.run_id AND cur.mine
  RETURNING r.run_id, r.lease_epoch, r.revision, r.lease_started_at, r.lease_caller_run_id,
    r.lease_caller_step
), call_again AS (
  UPDATE {schema}.model_calls AS c SET outcome = %(call_outcome)s, error = %(error)s,
    answer = NULL
  FROM failed
  WHERE %(call_outcome)s::text IS NOT NULL AND c.run_id = failed.run_id
    AND c.caller_run_id = %(c_run)s AND c.caller_step = %(c_step)s
    AND c.retry_number = %(c_retry)s AND c.turn IS NULL
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
    requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    reasoning_tokens, provider_name, tier)
  SELECT run_id, lease_epoch, revision, %(worker_id)s, %(c_run)s,
    %(c_step)s, %(c_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    %(call_outcome)s, %(error)s, %(u_rm)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
  FROM failed
  WHERE %(call_outcome)s::text IS NOT NULL AND NOT EXISTS (SELECT FROM call_again)
  RETURNING money
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens)
  SELECT run_id, lease_epoch, %(worker_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(), %(attempt_outcome)s, %(error)s, %(model_name)s,
    %(input_tokens)s, %(output_tokens)s
  FROM failed
)
SELECT CASE
    WHEN EXISTS (SELECT FROM failed) THEN 'applied'
    WHEN cur.status = 'failed' AND cur.lease_epoch = %(epoch)s AND cur.last_error = %(error)s
      THEN 'already_done'
    ELSE 'lease_lost' END AS outcome, (SELECT money FROM call) AS money,
  EXISTS (SELECT FROM call) AS added
FROM cur

-- name: fail_by_caller
-- End the attempt a Dagster run holds when one of its steps failed before it could end it.
-- For a step that failed outside its body (its input could not be loaded, its output not
-- stored): the lease is fenced by the Dagster run that claimed it, and only while running, so
-- a lease another Dagster run or worker has since taken is never touched. A model call already
-- recorded keeps its outcome (an `answered` call stays reusable). `outcome`: `applied`, or
-- `lease_lost` (nothing of this Dagster run held the run).
WITH cur AS (
  SELECT run_id, lease_owner FROM {schema}.runs
  WHERE run_id = %(run_id)s AND status = 'running' AND lease_caller_run_id = %(caller_run_id)s
  FOR UPDATE
), failed AS (
  UPDATE {schema}.runs AS r
  SET status = 'failed', last_error = %(error)s, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()
  FROM cur
  WHERE r.run_id = cur.run_id AND r.status = 'running'
    AND r.lease_caller_run_id = %(caller_run_id)s
  RETURNING r.run_id, r.lease_epoch, r.lease_started_at, r.lease_caller_run_id,
    r.lease_caller_step
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome, error)
  SELECT failed.run_id, failed.lease_epoch, cur.lease_owner, failed.lease_caller_run_id,
    failed.lease_caller_step, COALESCE(failed.lease_started_at, now()), now(), 'failed',
    %(error)s
  FROM failed, cur
)
SELECT CASE WHEN EXISTS (SELECT FROM failed) THEN 'applied' ELSE 'lease_lost' END AS outcome

-- faces: admin

-- name: list_attempts
-- A run's claims, oldest first: the ended ones and the open one (the `attempts` view).
SELECT * FROM {schema}.attempts WHERE run_id = %(run_id)s ORDER BY lease_epoch
