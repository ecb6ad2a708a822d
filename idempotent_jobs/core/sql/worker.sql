-- The worker face's statements (core/ledger.py: RunLedger), and only those. Each starts with `-- name: <name>` and a one-line
-- purpose; more comment lines may follow before the statement. `{schema}` is replaced by the quoted
-- schema name once per ledger; every value is a parameter. Every write that follows a claim is
-- fenced by lease owner AND lease epoch AND status 'running': a worker whose lease was reclaimed
-- (the epoch moved on) writes nothing. All times are the database's now(): workers pass durations.
--
-- Lease-only writes (begin, claim, checkpoint, renew, release) commit without waiting for the WAL
-- flush unless the ledger asks for durable lease commits: `%(lease_commit)s` NULL keeps the
-- session's synchronous_commit. Such a commit is visible to every session at once; only a server
-- crash in the next few hundred milliseconds can lose it, and then the fence refuses the lost
-- lease's later writes. The accepted result, its outbox rows and failures always wait for the
-- flush, and their flush makes every earlier lease write durable too (WAL is written in order).

-- name: run_id_by_identity
-- The run id stored under these identity fields, if it may stand for them.
-- After the identity key refused a registration: a racing first registration's id (the same),
-- or the id an earlier release gave this identity in another Unicode form (migrate put its
-- fields in NFC, kept its id and recorded it, core/upgrade.py). Any other id is a conflict.
SELECT r.run_id FROM {schema}.runs AS r
WHERE (r.job_name, r.subject_id, r.scheduled_at, r.version)
  = (%(job_name)s, %(subject_id)s, %(scheduled_at)s::timestamptz, %(version)s)
  AND (r.run_id = %(run_id)s OR EXISTS (SELECT 1 FROM {schema}.identity_upgrades AS u
    WHERE u.run_id = r.run_id AND u.outcome = 'normalised'))

-- name: begin
-- Register the run and claim its lease in one round trip.
-- Register and claim in one statement: a new run is inserted claimed (epoch 1); an existing one is
-- claimed under the rule of `claim` (and only if its identity fields match), else only updated_at
-- moves. A completed run is only read, never locked or written: reusing a result costs no write
-- (only an explicit revise changes a completed run). `claimed` says whether this statement took
-- the lease. No row back: a first registration raced this one, or the run completed while this
-- statement waited for its row lock; either is committed now: run the statement again.
-- `drill_armed` says whether a failure drill of the job is armed, so a model call under this
-- lease asks for one only then; `budgeted` whether a budget covers the job, so a model call
-- reserves its worst case only then.
WITH inserted AS (
  INSERT INTO {schema}.runs AS r (run_id, job_name, subject_id, scheduled_at, version, status,
    lease_owner, lease_expires_at, lease_epoch, attempts, lease_started_at, lease_caller_run_id,
    lease_caller_step)
  VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s, 'running',
    %(worker_id)s, now() + make_interval(secs => %(lease_seconds)s), 1, 1, now(),
    %(caller_run_id)s, %(caller_step)s)
  ON CONFLICT (run_id) DO NOTHING
  RETURNING r AS run, true AS claimed,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)
), done AS (
  SELECT r AS run, false AS claimed FROM {schema}.runs AS r
  WHERE r.run_id = %(run_id)s AND r.status = 'completed'
), prev AS (
  SELECT r.run_id, r.status, r.lease_owner, r.lease_epoch, r.lease_started_at,
    r.lease_caller_run_id, r.lease_caller_step,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true),
    ((r.lease_owner IS NULL OR r.lease_expires_at < now() OR r.lease_owner = %(worker_id)s)
      AND (r.job_name, r.subject_id, r.scheduled_at, r.version)
        = (%(job_name)s, %(subject_id)s, %(scheduled_at)s::timestamptz, %(version)s)
    ) AS claimable
  FROM {schema}.runs AS r
  WHERE r.run_id = %(run_id)s AND r.status <> 'completed'
  FOR UPDATE
), claimed AS (
  UPDATE {schema}.runs AS r
  SET status = CASE WHEN prev.claimable THEN 'running' ELSE r.status END,
    lease_owner = CASE WHEN prev.claimable THEN %(worker_id)s ELSE r.lease_owner END,
    lease_expires_at = CASE WHEN prev.claimable
      THEN now() + make_interval(secs => %(lease_seconds)s) ELSE r.lease_expires_at END,
    lease_epoch = r.lease_epoch + CASE WHEN prev.claimable THEN 1 ELSE 0 END,
    attempts = r.attempts + CASE WHEN prev.claimable THEN 1 ELSE 0 END,
    lease_started_at = CASE WHEN prev.claimable THEN now() ELSE r.lease_started_at END,
    lease_caller_run_id = CASE WHEN prev.claimable
      THEN %(caller_run_id)s ELSE r.lease_caller_run_id END,
    lease_caller_step = CASE WHEN prev.claimable
      THEN %(caller_step)s ELSE r.lease_caller_step END,
    updated_at = now()
  FROM prev
  WHERE r.run_id = prev.run_id
  RETURNING r AS run, prev.claimable AS claimed, prev.status AS prev_status,
    prev.lease_owner AS prev_owner, prev.lease_epoch AS prev_epoch,
    prev.lease_started_at AS prev_started_at, prev.lease_caller_run_id AS prev_caller_run_id,
    prev.lease_caller_step AS prev_caller_step
), lost AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT (run).run_id, prev_epoch, prev_owner, prev_caller_run_id, prev_caller_step,
    COALESCE(prev_started_at, now()), now(),
    CASE WHEN prev_owner = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END
  FROM claimed
  WHERE claimed AND prev_status = 'running'
  ON CONFLICT (run_id, lease_epoch) DO NOTHING
)
SELECT u.*, CASE WHEN u.claimed THEN EXISTS (SELECT FROM {schema}.drills AS d
    WHERE d.job_name IN (%(job_name)s, '*') AND d.remaining > 0 AND d.expires_at > now())
  ELSE false END AS drill_armed,
  CASE WHEN u.claimed THEN EXISTS (SELECT FROM {schema}.spend_budgets AS b
    WHERE %(job_name)s::text = ANY(b.jobs))
  ELSE false END AS budgeted
FROM (
  SELECT (run).*, claimed FROM inserted
  UNION ALL
  SELECT (run).*, claimed FROM done
  UNION ALL
  SELECT (run).*, claimed FROM claimed
) AS u

-- name: claim
-- Take the run's lease if it is free, bumping the fencing epoch.
-- Atomic claim: takes the lease only if the run is not completed and nobody holds an unexpired
-- lease on it (by the database clock), or the holder is this very worker. Bumps the fencing epoch
-- and records the attempt it supersedes (a vanished or paused holder's, or this worker's own
-- earlier one) in one statement. A run it cannot claim is not even locked: polling writes nothing.
WITH prev AS (
  SELECT r.run_id, r.status, r.lease_owner, r.lease_epoch, r.lease_started_at,
    r.lease_caller_run_id, r.lease_caller_step,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)
  FROM {schema}.runs AS r
  WHERE r.run_id = %(run_id)s AND r.status <> 'completed'
    AND (r.lease_owner IS NULL OR r.lease_expires_at < now() OR r.lease_owner = %(worker_id)s)
  FOR UPDATE
), claimed AS (
  UPDATE {schema}.runs AS r
  SET status = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    lease_epoch = r.lease_epoch + 1,
    attempts = r.attempts + 1,
    lease_started_at = now(),
    lease_caller_run_id = %(caller_run_id)s,
    lease_caller_step = %(caller_step)s,
    updated_at = now()
  FROM prev
  WHERE r.run_id = prev.run_id
  RETURNING r.run_id, r.lease_epoch, r.lease_expires_at, r.raw_input, r.attempts, r.revision,
    r.input_fingerprint, prev.status AS prev_status, prev.lease_owner AS prev_owner,
    prev.lease_epoch AS prev_epoch, prev.lease_started_at AS prev_started_at,
    prev.lease_caller_run_id AS prev_caller_run_id, prev.lease_caller_step AS prev_caller_step
), lost AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT run_id, prev_epoch, prev_owner, prev_caller_run_id, prev_caller_step,
    COALESCE(prev_started_at, now()), now(),
    CASE WHEN prev_owner = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END
  FROM claimed
  WHERE prev_status = 'running'
  ON CONFLICT (run_id, lease_epoch) DO NOTHING
)
SELECT lease_epoch, lease_expires_at, raw_input, attempts, revision, input_fingerprint
FROM claimed

-- name: renew
-- Extend a held lease by its duration from now; hand back the checkpoint.
-- Heartbeat, or taking over a lease handed on by an earlier step: push the expiry forward by the
-- lease duration, only while still the owner, and hand back the checkpoint. Not a change of the
-- run's state, so updated_at stays. With `hold_tokens`, the next request's worst case is
-- reserved under the job's budgets in the same statement (`hold`: the function's outcome), so
-- a budget adds no round trip to the handover before a model call.
WITH renewed AS (
  UPDATE {schema}.runs
  SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
  WHERE run_id = %(run_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND status = 'running'
  RETURNING lease_expires_at, raw_input, attempts, revision, input_fingerprint, job_name,
    subject_id, set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true) AS commit_mode
)
SELECT r.lease_expires_at, r.raw_input, r.attempts, r.revision, r.input_fingerprint,
  r.commit_mode, h.outcome
FROM renewed AS r
LEFT JOIN LATERAL (SELECT v.outcome FROM {schema}.reserve_budget(%(run_id)s, %(epoch)s,
    %(worker_id)s, NULL, NULL, %(hold_tokens)s::bigint, %(requested)s, NULL, NULL, r.job_name,
    r.subject_id) AS v
  WHERE %(hold_tokens)s::bigint IS NOT NULL) AS h ON true

-- name: save_raw_input
-- Checkpoint the collected input under the lease; the first value wins.
-- Checkpoint of the collected input: the first stored value wins and is returned with its
-- fingerprint (the right-hand sides see the row as it was). With `hold_tokens`, the model
-- call's worst case is reserved as in `renew`.
WITH saved AS (
  UPDATE {schema}.runs
  SET raw_input = COALESCE(raw_input, %(raw_input)s::jsonb),
    input_fingerprint = CASE WHEN raw_input IS NULL THEN %(input_fingerprint)s
      ELSE input_fingerprint END,
    updated_at = now()
  WHERE run_id = %(run_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
    AND status = 'running'
  RETURNING raw_input, input_fingerprint, job_name, subject_id,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true) AS commit_mode
)
SELECT s.raw_input, s.input_fingerprint, s.commit_mode, h.outcome
FROM saved AS s
LEFT JOIN LATERAL (SELECT v.outcome FROM {schema}.reserve_budget(%(run_id)s, %(epoch)s,
    %(worker_id)s, NULL, NULL, %(hold_tokens)s::bigint, %(requested)s, NULL, NULL, s.job_name,
    s.subject_id) AS v
  WHERE %(hold_tokens)s::bigint IS NOT NULL) AS h ON true

-- name: complete
-- Accept a candidate answer and queue its notifications, or refuse it as stale; say which.
-- The final commit, one statement so one transaction: a candidate is accepted only on the revision
-- and raw-input checkpoint it was computed against (a revise moves the revision, a recollect the
-- checkpoint; a basis without a fingerprint binds the revision only). Accepted: output, config
-- fingerprint, the attempt's outcome and usage, the model call, and the outbox rows (one per
-- channel and revision, never twice; a revised run notifies only the channels its revision named).
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
WITH cur AS (
  SELECT run_id, status, lease_epoch, output, revision, input_fingerprint, config_parts,
    COALESCE(lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s AND status = 'running',
      false) AS mine,
    (revision = %(revision)s::integer AND input_fingerprint
      IS NOT DISTINCT FROM COALESCE(%(input_fingerprint)s::text, input_fingerprint)) AS holds
  FROM {schema}.runs
  WHERE run_id = %(run_id)s
  FOR UPDATE
), done AS (
  UPDATE {schema}.runs AS r
  SET status = CASE WHEN cur.holds THEN 'completed' ELSE 'pending' END,
    output = CASE WHEN cur.holds THEN %(output)s::jsonb ELSE r.output END,
    completed_at = CASE WHEN cur.holds THEN now() ELSE r.completed_at END,
    config_fingerprint = CASE WHEN cur.holds
      THEN %(config_fingerprint)s ELSE r.config_fingerprint END,
    config_parts = CASE WHEN cur.holds THEN %(config_parts)s::jsonb ELSE r.config_parts END,
    last_error = CASE WHEN cur.holds THEN NULL ELSE r.last_error END,
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
    c.retry_number) = (%(call_caller_run_id)s, %(call_caller_step)s, %(call_retry)s)
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
    requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    reasoning_tokens, provider_name, tier)
  SELECT run_id, lease_epoch, %(revision)s::integer, %(worker_id)s, %(call_caller_run_id)s,
    %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    CASE WHEN accepted THEN 'accepted' ELSE 'stale' END, NULL, %(requested_model)s,
    %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
  FROM done
  WHERE NOT EXISTS (SELECT FROM again)
  RETURNING money
), outbox AS (
  INSERT INTO {schema}.notification_outbox (run_id, channel, payload, revision)
  SELECT done.run_id, n.key, n.value, done.revision
  FROM done, jsonb_each(%(notifications)s::jsonb) AS n
  WHERE done.accepted AND (done.revision = 0 OR n.key IN (
    SELECT unnest(rv.channels) FROM {schema}.run_revisions AS rv
    WHERE rv.run_id = done.run_id AND rv.revision = done.revision))
  ON CONFLICT (run_id, channel, revision) DO NOTHING
)
SELECT CASE
    WHEN done.run_id IS NOT NULL THEN CASE WHEN done.accepted THEN 'applied' ELSE 'stale' END
    WHEN cur.status = 'completed' THEN 'already_done'
    WHEN cur.status = 'pending' AND cur.lease_epoch = %(epoch)s AND NOT cur.holds THEN 'stale'
    ELSE 'lease_lost' END AS outcome,
  COALESCE(done.output, cur.output),
  cur.revision, cur.input_fingerprint, cur.lease_epoch = %(epoch)s AS mine, cur.config_parts,
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
    AND c.caller_run_id = %(call_caller_run_id)s AND c.caller_step = %(call_caller_step)s
    AND c.retry_number = %(call_retry)s AND c.turn IS NULL
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error,
    requested_model, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens,
    reasoning_tokens, provider_name, tier)
  SELECT run_id, lease_epoch, revision, %(worker_id)s, %(call_caller_run_id)s,
    %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    %(call_outcome)s, %(error)s, %(requested_model)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
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

-- name: record_answer
-- Record a paid call and its answer under the lease, before the answer leaves the step.
-- Fenced by owner, epoch and status: a lost lease records nothing here (the caller records the
-- call as `lease_lost`). Once per caller run, step and retry: a retried statement adds no
-- second row. The outcome `answered` waits for the commit, which updates this row.
INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error, answer,
  input_fingerprint, config_parts, requested_model,
  cache_read_tokens, cache_write_tokens, cache_write_1h_tokens, reasoning_tokens, provider_name, tier)
SELECT r.run_id, r.lease_epoch, %(revision)s::integer, %(worker_id)s, %(call_caller_run_id)s,
  %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'answered', NULL, %(answer)s::jsonb, %(input_fingerprint)s, %(config_parts)s::jsonb,
  %(requested_model)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
FROM {schema}.runs AS r
WHERE r.run_id = %(run_id)s AND r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s
  AND r.status = 'running'
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = r.run_id AND c.caller_run_id = %(call_caller_run_id)s
      AND c.caller_step = %(call_caller_step)s AND c.retry_number = %(call_retry)s
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
SELECT a.run_id, a.lease_epoch, %(revision)s::integer, a.worker_id, %(call_caller_run_id)s,
  %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'lease_lost', %(error)s, %(requested_model)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s
FROM {schema}.run_attempts AS a
WHERE a.run_id = %(run_id)s AND a.lease_epoch = %(epoch)s AND a.worker_id = %(worker_id)s
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.lease_epoch = a.lease_epoch AND c.worker_id = a.worker_id
      AND c.turn IS NULL)
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.caller_run_id = %(call_caller_run_id)s
      AND c.caller_step = %(call_caller_step)s AND c.retry_number = %(call_retry)s
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
SELECT r.run_id, %(epoch)s, %(revision)s::integer, %(worker_id)s, %(call_caller_run_id)s,
  %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  CASE WHEN r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s
    AND r.status = 'running' THEN %(call_outcome)s ELSE 'lease_lost' END,
  %(error)s, %(requested_model)s, %(u_cr)s, %(u_cw)s, %(u_cw1h)s,
  %(u_rt)s, %(u_pn)s, %(u_tier)s, %(turn)s
FROM {schema}.runs AS r
WHERE r.run_id = %(run_id)s
  AND ((r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s AND r.status = 'running')
    OR EXISTS (SELECT FROM {schema}.run_attempts AS a WHERE a.run_id = r.run_id
      AND a.lease_epoch = %(epoch)s AND a.worker_id = %(worker_id)s))
ON CONFLICT (run_id, lease_epoch, worker_id, turn) WHERE turn IS NOT NULL DO NOTHING
RETURNING c.outcome, c.money

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

-- name: store_step_output
-- Keep what a Dagster step hands the next; a re-run of the same step replaces it.
INSERT INTO {schema}.step_outputs (dagster_run_id, step_key, output_name, run_id, value)
SELECT %(dagster_run_id)s, %(step_key)s, %(output_name)s, r.run_id, %(value)s::jsonb
FROM (SELECT %(run_id)s::text AS wanted) AS w
LEFT JOIN {schema}.runs AS r ON r.run_id = w.wanted
ON CONFLICT (dagster_run_id, step_key, output_name)
DO UPDATE SET value = EXCLUDED.value, run_id = EXCLUDED.run_id, created_at = now()
RETURNING created_at

-- name: load_step_output
-- What a Dagster step handed the next, by the run, step and output that produced it.
SELECT value FROM {schema}.step_outputs
WHERE dagster_run_id = %(dagster_run_id)s AND step_key = %(step_key)s
  AND output_name = %(output_name)s

-- name: take_drill
-- Use up one drilled failure for a model call of this job, if a drill is armed for it.
-- The job's own drill first, else the one for every job ('*'); locked, so concurrent workers
-- take exactly `remaining` failures between them.
WITH pick AS (
  SELECT job_name FROM {schema}.drills
  WHERE job_name IN (%(job_name)s, '*') AND remaining > 0 AND expires_at > now()
  ORDER BY job_name = '*'
  LIMIT 1
  FOR UPDATE
)
UPDATE {schema}.drills AS d SET remaining = d.remaining - 1
FROM pick WHERE d.job_name = pick.job_name
RETURNING d.job_name, d.remaining

-- name: run_job
-- The identity job and subject of a run.
SELECT job_name, subject_id FROM {schema}.runs WHERE run_id = %(run_id)s

-- name: declare_budgets
-- Declare the budgets a job's spec names (arrays, one element per budget).
-- The ledger's function `declare_spec_budgets` (migration 0021, run as the ledger's owner): one
-- the ledger does not hold is added (`spec`), with its period's spend so far; a group budget
-- gains the job as a member; one the ledger holds at another amount is never overwritten, and
-- is returned.
SELECT v.budget_id, v.declared, v.held, v.held_by
FROM {schema}.declare_spec_budgets(%(job_name)s, %(ids)s::text[], %(scopes)s::text[],
  %(names)s::text[], %(units)s::text[], %(periods)s::text[], %(amounts)s::numeric[]) AS v

-- name: reserve_budget
-- Admit one request of the run under every budget covering its job, or refuse it.
-- The ledger's function `reserve_budget` (migration 0018), with the run's job and subject for
-- the refusal's message.
SELECT v.*, r.job_name, r.subject_id,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.reserve_budget(%(run_id)s, %(epoch)s, %(worker_id)s, %(max_input)s::bigint,
  %(max_output)s::bigint, %(max_total)s::bigint, %(requested)s, %(answered)s, %(tier)s) AS v
LEFT JOIN {schema}.runs AS r ON r.run_id = %(run_id)s

-- name: release_budget
-- Give back what this attempt's unsent request holds of its budgets.
SELECT {schema}.release_holds(%(run_id)s, %(epoch)s, %(worker_id)s)

-- name: ledger_currency
-- The ledger's currency (no row before the first price).
SELECT currency FROM {schema}.ledger_currency

-- name: get_run
-- One run's record.
SELECT * FROM {schema}.runs WHERE run_id = %(run_id)s

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

-- name: pending_outbox_by_job
-- How many undelivered rows each job outside `job_names` has: what a deliverer left pending.
SELECT r.job_name, count(*) AS pending FROM {schema}.notification_outbox AS o
JOIN {schema}.runs AS r ON r.run_id = o.run_id
WHERE o.delivered_at IS NULL AND NOT (r.job_name = ANY(%(job_names)s::text[]))
  AND (%(run_id)s::text IS NULL OR o.run_id = %(run_id)s)
GROUP BY r.job_name
ORDER BY r.job_name

-- name: lock_undelivered
-- One undelivered row and its run's job under FOR UPDATE SKIP LOCKED: sent by one deliverer at once.
SELECT o.*, r.job_name FROM {schema}.notification_outbox AS o
JOIN {schema}.runs AS r ON r.run_id = o.run_id
WHERE o.run_id = %(run_id)s AND o.channel = %(channel)s AND o.revision = %(revision)s
  AND o.delivered_at IS NULL
FOR UPDATE OF o SKIP LOCKED

-- name: mark_delivered
-- The row was sent: it is never sent again.
UPDATE {schema}.notification_outbox
SET delivered_at = now(), delivery_attempts = delivery_attempts + 1, last_error = NULL
WHERE run_id = %(run_id)s AND channel = %(channel)s AND revision = %(revision)s
  AND delivered_at IS NULL

-- name: mark_delivery_failed
-- The receiver failed: count the attempt and keep the reason; the row stays undelivered.
UPDATE {schema}.notification_outbox
SET delivery_attempts = delivery_attempts + 1, last_error = %(error)s
WHERE run_id = %(run_id)s AND channel = %(channel)s AND revision = %(revision)s
  AND delivered_at IS NULL

-- name: release
-- Hand the run back untouched, ending the attempt as superseded; say what happened.
-- For a step that stops early. `outcome`: `applied`, `already_done` (this release landed
-- before) or `lease_lost`.
WITH cur AS (
  SELECT run_id, status, lease_epoch, lease_owner,
    COALESCE(lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s AND status = 'running',
      false) AS mine
  FROM {schema}.runs
  WHERE run_id = %(run_id)s
  FOR UPDATE
), released AS (
  UPDATE {schema}.runs AS r
  SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM cur
  WHERE r.run_id = cur.run_id AND cur.mine
  RETURNING r.run_id, r.lease_epoch, r.lease_started_at, r.lease_caller_run_id,
    r.lease_caller_step,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT run_id, lease_epoch, %(worker_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(), 'superseded'
  FROM released
)
SELECT CASE
    WHEN EXISTS (SELECT FROM released) THEN 'applied'
    WHEN cur.status = 'pending' AND cur.lease_epoch = %(epoch)s AND cur.lease_owner IS NULL
      THEN 'already_done'
    ELSE 'lease_lost' END AS outcome
FROM cur

-- name: declare_rate_limit
-- Record a rate limit a job's spec declares, for every worker of every deployment to keep.
-- The ledger's function `declare_spec_rate_limit` (migration 0021, run as the ledger's owner):
-- written only when it differs from the row, so workers that agree take no lock after the
-- first, and never over a limit an operator set (`idempotent-jobs limits set` stands until
-- deleted).
SELECT v FROM {schema}.declare_spec_rate_limit(%(provider)s, %(model)s, %(key_name)s,
  %(requests)s::integer, %(tokens)s::bigint, %(window_seconds)s::integer, %(declared_by)s) AS v

-- name: list_rate_limits
-- Every provider rate limit, by provider, model and key name.
SELECT * FROM {schema}.rate_limits ORDER BY provider, model, key_name

-- name: acquire_rate
-- Reserve one request's place under a provider's rate limit; say how long to wait for it.
-- Each measure (requests, tokens) is a token bucket kept as its theoretical arrival time
-- (GCRA): the bucket holds `burst` of a window's worth and refills at `pace` of the limit's rate
-- (both a little under the provider's, so arrival jitter never meets its own bucket empty). A
-- request may start once every bucket has room for it; reserving moves each time on by what it
-- takes. The limit row is locked for the decision, so reservations are serialised per limit.
-- Fairness: a subject whose last reservation has not started yet may reserve at most half a
-- window ahead, any other a whole window; past that nothing is reserved and the worker asks
-- again after `wait_seconds`. No row: no such limit. Database clock throughout.
WITH run AS (
  SELECT job_name, subject_id FROM {schema}.runs WHERE run_id = %(run_id)s
), lim AS (
  SELECT l.provider, l.model, l.key_name, l.requests_tat, l.tokens_tat, now() AS now,
    make_interval(secs => l.window_seconds) AS win,
    make_interval(secs => l.window_seconds * %(burst)s::float8) AS room,
    make_interval(secs => l.window_seconds / (l.requests_per_window * %(pace)s::float8))
      AS req_step,
    make_interval(secs => l.window_seconds * %(tokens)s::bigint
      / (l.tokens_per_window * %(pace)s::float8)) AS tok_step
  FROM {schema}.rate_limits AS l
  WHERE l.provider = %(provider)s AND l.model = %(model)s AND l.key_name = %(key_name)s
  FOR UPDATE
), plan AS (
  SELECT lim.*, GREATEST(lim.now,
      COALESCE(lim.requests_tat + lim.req_step - lim.room, lim.now),
      COALESCE(lim.tokens_tat + lim.tok_step - lim.room, lim.now)) AS start,
    COALESCE((SELECT s.reserved_until > lim.now FROM {schema}.rate_subjects AS s, run
      WHERE s.provider = lim.provider AND s.model = lim.model AND s.key_name = lim.key_name
        AND s.job_name = run.job_name AND s.subject_id = run.subject_id), false) AS pending
  FROM lim
), decided AS (
  SELECT plan.*, CASE WHEN pending THEN win / 2 ELSE win END AS horizon
  FROM plan
), granted AS (
  SELECT decided.* FROM decided WHERE start - now <= horizon
), reserved AS (
  UPDATE {schema}.rate_limits AS l
  SET requests_tat = COALESCE(GREATEST(l.requests_tat, g.start) + g.req_step, l.requests_tat),
    tokens_tat = COALESCE(GREATEST(l.tokens_tat, g.start) + g.tok_step, l.tokens_tat)
  FROM granted AS g
  WHERE l.provider = g.provider AND l.model = g.model AND l.key_name = g.key_name
  RETURNING l.provider
), mine AS (
  INSERT INTO {schema}.rate_subjects AS s (provider, model, key_name, job_name, subject_id,
    reserved_until)
  SELECT g.provider, g.model, g.key_name, run.job_name, run.subject_id, g.start
  FROM granted AS g, run
  ON CONFLICT (provider, model, key_name, job_name, subject_id)
    DO UPDATE SET reserved_until = GREATEST(s.reserved_until, EXCLUDED.reserved_until)
)
SELECT d.start - d.now <= d.horizon AS granted,
  GREATEST(0, extract(epoch FROM d.start - d.now)
    - CASE WHEN d.start - d.now <= d.horizon THEN 0 ELSE extract(epoch FROM d.horizon) END)
    ::float8 AS wait_seconds
FROM decided AS d

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
