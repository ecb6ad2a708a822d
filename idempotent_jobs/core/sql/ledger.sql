-- Every runtime statement of the ledger. Each starts with `-- name: <name>` and a one-line
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

-- name: register
-- Create the run row if it is new; return the stored row either way.
-- Idempotent registration: a second one only touches updated_at, never clears output nor moves a
-- completed run back. The same fields under another run id violate runs_identity_key.
INSERT INTO {schema}.runs (run_id, job_name, subject_id, scheduled_at, version)
VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s)
ON CONFLICT (run_id) DO UPDATE SET updated_at = now()
RETURNING *

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
-- lease asks for one only then.
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
  ELSE false END AS drill_armed
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
-- run's state, so updated_at stays.
UPDATE {schema}.runs
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE run_id = %(run_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  AND status = 'running'
RETURNING lease_expires_at, raw_input, attempts, revision, input_fingerprint,
  set_config('synchronous_commit',
    COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)

-- name: save_raw_input
-- Checkpoint the collected input under the lease; the first value wins.
-- Checkpoint of the collected input: the first stored value wins and is returned with its
-- fingerprint (the right-hand sides see the row as it was).
UPDATE {schema}.runs
SET raw_input = COALESCE(raw_input, %(raw_input)s::jsonb),
  input_fingerprint = CASE WHEN raw_input IS NULL THEN %(input_fingerprint)s
    ELSE input_fingerprint END,
  updated_at = now()
WHERE run_id = %(run_id)s AND lease_owner = %(worker_id)s AND lease_epoch = %(epoch)s
  AND status = 'running'
RETURNING raw_input, input_fingerprint,
  set_config('synchronous_commit',
    COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)

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
-- accepted output lives on the run, under the retention policy, and nowhere else.
WITH basis AS (
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
  SET status = CASE WHEN basis.holds THEN 'completed' ELSE 'pending' END,
    output = CASE WHEN basis.holds THEN %(output)s::jsonb ELSE r.output END,
    completed_at = CASE WHEN basis.holds THEN now() ELSE r.completed_at END,
    config_fingerprint = CASE WHEN basis.holds
      THEN %(config_fingerprint)s ELSE r.config_fingerprint END,
    config_parts = CASE WHEN basis.holds THEN %(config_parts)s::jsonb ELSE r.config_parts END,
    last_error = CASE WHEN basis.holds THEN NULL ELSE r.last_error END,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM basis
  WHERE r.run_id = basis.run_id AND basis.mine
  RETURNING r.run_id, r.lease_epoch, r.output, r.revision, r.input_fingerprint,
    r.lease_started_at, r.lease_caller_run_id, r.lease_caller_step, basis.holds AS accepted
), attempt AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens)
  SELECT run_id, lease_epoch, %(worker_id)s, lease_caller_run_id, lease_caller_step,
    COALESCE(lease_started_at, now()), now(),
    CASE WHEN accepted THEN 'completed' ELSE 'superseded' END,
    CASE WHEN NOT accepted THEN 'stale candidate: computed on revision '
      || %(revision)s::integer || ', checkpoint '
      || COALESCE(left(%(input_fingerprint)s::text, 12), 'none')
      || '; the run is at revision ' || revision || ', checkpoint '
      || COALESCE(left(input_fingerprint, 12), 'none') END,
    %(model_name)s, %(input_tokens)s, %(output_tokens)s
  FROM done
), call_again AS (
  UPDATE {schema}.model_calls AS c
  SET outcome = CASE WHEN done.accepted THEN 'accepted' ELSE 'stale' END, error = NULL,
    answer = NULL
  FROM done
  WHERE c.run_id = done.run_id AND c.caller_run_id = %(call_caller_run_id)s
    AND c.caller_step = %(call_caller_step)s AND c.retry_number = %(call_retry)s
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error)
  SELECT run_id, lease_epoch, %(revision)s::integer, %(worker_id)s, %(call_caller_run_id)s,
    %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    CASE WHEN accepted THEN 'accepted' ELSE 'stale' END, NULL
  FROM done
  WHERE NOT EXISTS (SELECT FROM call_again)
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
    WHEN basis.status = 'completed' THEN 'already_done'
    WHEN basis.status = 'pending' AND basis.lease_epoch = %(epoch)s AND NOT basis.holds THEN 'stale'
    ELSE 'lease_lost' END AS outcome,
  CASE WHEN done.run_id IS NOT NULL THEN done.output ELSE basis.output END AS output,
  basis.revision, basis.input_fingerprint, basis.lease_epoch = %(epoch)s AS mine, basis.config_parts
FROM basis LEFT JOIN done ON true

-- name: fail
-- Record a failed attempt under the lease and free the run for a retry; say what happened.
-- A failed attempt: the run becomes claimable again; the reason is kept on run and attempt, and
-- on the model call's row when a model call failed or its answer was rejected. `outcome`:
-- `applied`, `already_done` (this very failure landed before: a retry after a lost answer) or
-- `lease_lost` (another claim moved the run on: nothing written). A call already recorded from
-- the same caller run, step and retry gets the new outcome instead of a second row (see
-- `complete`).
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
    AND c.retry_number = %(call_retry)s
  RETURNING c.call_id
), call AS (
  INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
    caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error)
  SELECT run_id, lease_epoch, revision, %(worker_id)s, %(call_caller_run_id)s,
    %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
    %(call_outcome)s, %(error)s
  FROM failed
  WHERE %(call_outcome)s::text IS NOT NULL AND NOT EXISTS (SELECT FROM call_again)
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
    ELSE 'lease_lost' END AS outcome
FROM cur

-- name: record_lost_call
-- Record a paid model call of a lease that was lost before the call could be committed.
-- Only the call's cost is written, never the run's state: the row names an epoch this worker
-- held (the claim that took the run over recorded that attempt as this worker's), once per
-- epoch and worker, so a retried statement adds no second row. A call already recorded from the
-- same caller run, step and retry (`answered` by Dagster's `transform`, then committed by a
-- later claim that lost its lease too) is in the books already: no second row, and it stays
-- as it was (an `answered` one reusable).
INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error)
SELECT a.run_id, a.lease_epoch, %(revision)s::integer, a.worker_id, %(call_caller_run_id)s,
  %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'lease_lost', %(error)s
FROM {schema}.run_attempts AS a
WHERE a.run_id = %(run_id)s AND a.lease_epoch = %(epoch)s AND a.worker_id = %(worker_id)s
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.lease_epoch = a.lease_epoch AND c.worker_id = a.worker_id)
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = a.run_id AND c.caller_run_id = %(call_caller_run_id)s
      AND c.caller_step = %(call_caller_step)s AND c.retry_number = %(call_retry)s)
RETURNING call_id

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

-- name: declare_budget
-- Record the budget a job's workers enforce, for the operator commands to show spend against.
-- Written only when it differs from the row, so workers that agree take no lock after the first.
INSERT INTO {schema}.budgets AS b (job_name, tokens_per_day, tokens_per_subject_per_day)
SELECT %(job_name)s, %(tokens_per_day)s, %(tokens_per_subject_per_day)s
WHERE NOT EXISTS (SELECT FROM {schema}.budgets AS d WHERE d.job_name = %(job_name)s
  AND d.tokens_per_day IS NOT DISTINCT FROM %(tokens_per_day)s::bigint
  AND d.tokens_per_subject_per_day IS NOT DISTINCT FROM %(tokens_per_subject_per_day)s::bigint)
ON CONFLICT (job_name) DO UPDATE SET tokens_per_day = EXCLUDED.tokens_per_day,
  tokens_per_subject_per_day = EXCLUDED.tokens_per_subject_per_day, declared_at = now()
RETURNING b.job_name

-- name: budget_check
-- Decide whether a model call of this run may start under the job's token budget.
-- What the run's job (and its subject) has spent today (UTC day, database clock) in recorded
-- model calls (spend_days, kept by model_calls' trigger: one row per subject), and which
-- limit, if any, is spent. A call is refused once spend >= limit; a call already started is
-- never stopped, so concurrent workers overshoot by at most the one call each has in flight.
WITH run AS (
  SELECT job_name, subject_id FROM {schema}.runs WHERE run_id = %(run_id)s
), today AS (
  SELECT (now() AT TIME ZONE 'UTC')::date AS day
), spend AS (
  SELECT COALESCE(sum(s.tokens), 0)::bigint AS job_tokens,
    COALESCE(sum(s.tokens) FILTER (WHERE s.subject_id = run.subject_id), 0)::bigint
      AS subject_tokens
  FROM run, today, {schema}.spend_days AS s
  WHERE s.job_name = run.job_name AND s.day = today.day
)
SELECT run.job_name, run.subject_id, today.day::timestamp AT TIME ZONE 'UTC' AS day_start,
  spend.job_tokens, spend.subject_tokens,
  CASE
    WHEN spend.job_tokens >= %(tokens_per_day)s::bigint THEN 'day'
    WHEN spend.subject_tokens >= %(tokens_per_subject_per_day)s::bigint THEN 'subject'
  END AS refused
FROM run, today, spend

-- name: set_price
-- Set a model's price per million input and output tokens (an operator's write; no run).
INSERT INTO {schema}.model_prices AS p (model_name, input_per_million, output_per_million,
  currency, set_by)
VALUES (%(model_name)s, %(input_per_million)s, %(output_per_million)s, %(currency)s,
  %(set_by)s)
ON CONFLICT (model_name) DO UPDATE SET input_per_million = EXCLUDED.input_per_million,
  output_per_million = EXCLUDED.output_per_million, currency = EXCLUDED.currency,
  set_at = now(), set_by = EXCLUDED.set_by
RETURNING p.*

-- name: list_prices
-- Every model's price, by model name.
SELECT * FROM {schema}.model_prices ORDER BY model_name

-- name: spend_by_job
-- What each job's model calls spent in one UTC day, against its declared budget.
-- By the database clock; today when `day` is NULL: calls, tokens, tokens not accepted, money at the models' prices, the most any one
-- subject spent, and the budget the job's workers declared. A job with a budget and no call
-- that day is listed with zeros.
WITH day AS (
  SELECT (date_trunc('day', COALESCE(%(day)s::timestamptz, now()) AT TIME ZONE 'UTC')
    AT TIME ZONE 'UTC') AS start
), calls AS (
  SELECT r.job_name, r.subject_id, c.outcome,
    COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0) AS tokens,
    (COALESCE(c.input_tokens, 0) * p.input_per_million
      + COALESCE(c.output_tokens, 0) * p.output_per_million) / 1000000 AS cost,
    c.model_name IS NULL OR p.model_name IS NOT NULL AS priced
  FROM {schema}.model_calls AS c
  -- Each call's run by its key (LIMIT keeps the planner from turning it into a join that
  -- scans every run).
  CROSS JOIN LATERAL (SELECT job_name, subject_id FROM {schema}.runs AS r
    WHERE r.run_id = c.run_id LIMIT 1) AS r
  LEFT JOIN {schema}.model_prices AS p ON p.model_name = c.model_name
  -- Written out, not read from `day`, so the planner estimates the range (one day's calls).
  WHERE c.called_at >= date_trunc('day', COALESCE(%(day)s::timestamptz, now())
      AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
    AND c.called_at < (date_trunc('day', COALESCE(%(day)s::timestamptz, now())
      AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
), by_subject AS (
  SELECT job_name, subject_id, count(*) AS calls, sum(tokens) AS tokens,
    sum(tokens) FILTER (WHERE outcome <> 'accepted') AS wasted, sum(cost) AS cost,
    bool_and(priced) AS priced
  FROM calls GROUP BY job_name, subject_id
), by_job AS (
  SELECT job_name, sum(calls)::bigint AS calls, sum(tokens)::bigint AS tokens,
    COALESCE(sum(wasted), 0)::bigint AS wasted_tokens, sum(cost) AS cost,
    bool_and(priced) AS priced, max(tokens)::bigint AS top_subject_tokens
  FROM by_subject GROUP BY job_name
)
SELECT COALESCE(j.job_name, b.job_name) AS job_name, day.start AS day_start,
  COALESCE(j.calls, 0) AS calls, COALESCE(j.tokens, 0) AS tokens,
  COALESCE(j.wasted_tokens, 0) AS wasted_tokens, j.cost, COALESCE(j.priced, true) AS priced,
  COALESCE(j.top_subject_tokens, 0) AS top_subject_tokens, b.tokens_per_day,
  b.tokens_per_subject_per_day
FROM day, by_job AS j
FULL JOIN {schema}.budgets AS b ON b.job_name = j.job_name
ORDER BY 1

-- name: job_history
-- What a job's runs cost so far, for an estimate.
-- Per accepted run (its accepted call; the latest `sample` runs) the median and p90 of tokens and money, and every call not accepted
-- (failed, rejected, stale, lease lost): how many and what they cost.
WITH priced_calls AS (
  SELECT c.run_id, c.outcome, c.called_at,
    COALESCE(c.input_tokens, 0) + COALESCE(c.output_tokens, 0) AS tokens,
    (COALESCE(c.input_tokens, 0) * p.input_per_million
      + COALESCE(c.output_tokens, 0) * p.output_per_million) / 1000000 AS cost,
    c.model_name IS NULL OR p.model_name IS NOT NULL AS priced
  FROM {schema}.runs AS r
  JOIN {schema}.model_calls AS c ON c.run_id = r.run_id
  LEFT JOIN {schema}.model_prices AS p ON p.model_name = c.model_name
  WHERE r.job_name = %(job_name)s
), accepted AS (
  SELECT run_id, sum(tokens) AS tokens, sum(cost) AS cost, bool_and(priced) AS priced
  FROM priced_calls WHERE outcome = 'accepted'
  GROUP BY run_id ORDER BY max(called_at) DESC LIMIT %(sample)s
), not_accepted AS (
  SELECT count(*) AS calls, COALESCE(sum(tokens), 0)::bigint AS tokens, sum(cost) AS cost,
    COALESCE(bool_and(priced), true) AS priced
  FROM priced_calls WHERE outcome <> 'accepted'
), all_accepted AS (
  SELECT count(DISTINCT run_id) AS runs FROM priced_calls WHERE outcome = 'accepted'
)
SELECT all_accepted.runs AS accepted_runs, count(accepted.run_id) AS sampled_runs,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY accepted.tokens) AS median_tokens,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY accepted.tokens) AS p90_tokens,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY accepted.cost) AS median_cost,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY accepted.cost) AS p90_cost,
  COALESCE(bool_and(accepted.priced), true) AND not_accepted.priced AS priced,
  not_accepted.calls AS failed_calls, not_accepted.tokens AS failed_tokens,
  not_accepted.cost AS failed_cost
FROM all_accepted, not_accepted LEFT JOIN accepted ON true
GROUP BY all_accepted.runs, not_accepted.calls, not_accepted.tokens, not_accepted.cost,
  not_accepted.priced

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

-- name: record_answer
-- Record a paid call and its answer under the lease, before the answer leaves the step.
-- Fenced by owner, epoch and status: a lost lease records nothing here (the caller records the
-- call as `lease_lost`). Once per caller run, step and retry: a retried statement adds no
-- second row. The outcome `answered` waits for the commit, which updates this row.
INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision, worker_id, caller_run_id,
  caller_step, retry_number, model_name, input_tokens, output_tokens, outcome, error, answer,
  input_fingerprint, config_parts)
SELECT r.run_id, r.lease_epoch, %(revision)s::integer, %(worker_id)s, %(call_caller_run_id)s,
  %(call_caller_step)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
  'answered', NULL, %(answer)s::jsonb, %(input_fingerprint)s, %(config_parts)s::jsonb
FROM {schema}.runs AS r
WHERE r.run_id = %(run_id)s AND r.lease_owner = %(worker_id)s AND r.lease_epoch = %(epoch)s
  AND r.status = 'running'
  AND NOT EXISTS (SELECT FROM {schema}.model_calls AS c
    WHERE c.run_id = r.run_id AND c.caller_run_id = %(call_caller_run_id)s
      AND c.caller_step = %(call_caller_step)s AND c.retry_number = %(call_retry)s)
RETURNING call_id

-- name: recorded_answer
-- The latest recorded answer still waiting for its commit on this revision and checkpoint.
SELECT answer, model_name, input_tokens, output_tokens, caller_run_id, caller_step,
  retry_number, config_parts
FROM {schema}.model_calls
WHERE run_id = %(run_id)s AND outcome = 'answered' AND revision = %(revision)s::integer
  AND input_fingerprint IS NOT DISTINCT FROM %(input_fingerprint)s::text
ORDER BY call_id DESC
LIMIT 1

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
