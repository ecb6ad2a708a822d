-- The runs store: a run's identity, its registration and lease, its raw-input checkpoint;
-- and the operator's reads of runs (listings, health).
-- Every write that follows a claim is fenced by lease owner AND lease epoch AND status 'running':
-- a worker whose lease was reclaimed (the epoch moved on) writes nothing. All times are the
-- database's now(): workers pass durations.
--
-- Lease-only writes (begin, claim, checkpoint, renew, release) commit without waiting for the WAL
-- flush unless the ledger asks for durable lease commits: `%(lease_commit)s` NULL keeps the
-- session's synchronous_commit. Such a commit is visible to every session at once; only a server
-- crash in the next few hundred milliseconds can lose it, and then the fence refuses the lost
-- lease's later writes. The accepted result, its outbox rows and failures always wait for the
-- flush, and their flush makes every earlier lease write durable too (WAL is written in order).

-- faces: worker

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
-- (only an explicit revise changes a completed run), and its checkpoint is not read: `raw_input`
-- comes back NULL (nothing needs it, and it may be large). Each part names the columns it returns
-- (a column a later migration adds is not among them). `claimed` says whether this statement took
-- the lease. No row back: a first registration raced this one, or the run completed while this
-- statement waited for its row lock; either is committed now: run the statement again.
-- `drill_armed` says whether a failure drill of the job is armed, so a model call under this
-- lease asks for one only then; `budgeted` whether a budget covers the job, so a model call
-- reserves its worst case only then. With `hold_tokens`, a claim under a budget reserves the
-- coming model call's worst case too (`held`: the ledger's `reserve_budget`'s outcome), so a
-- budget adds no round trip to a run, whether its checkpoint is collected now or was stored by
-- an earlier attempt. Only a claim holds: the function is called inside the CASE, which runs it
-- only for a row this statement claimed (a function in a lateral FROM would run for every row,
-- the filter applied after: a reused or busy run would hold the worst case and never settle).
WITH inserted AS (
  INSERT INTO {schema}.runs AS r (run_id, job_name, subject_id, scheduled_at, version, status,
    lease_owner, lease_expires_at, lease_epoch, attempts, lease_started_at, lease_caller_run_id,
    lease_caller_step)
  VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s, 'running',
    %(worker_id)s, now() + make_interval(secs => %(lease_seconds)s), 1, 1, now(),
    %(caller_run_id)s, %(caller_step)s)
  ON CONFLICT (run_id) DO NOTHING
  RETURNING r.run_id, r.job_name, r.subject_id, r.scheduled_at, r.version, r.status, r.raw_input,
    r.output, r.lease_owner, r.lease_expires_at, r.lease_epoch, r.attempts, r.last_error,
    r.created_at, r.updated_at, r.completed_at, r.revision, r.input_fingerprint,
    r.config_fingerprint, r.config_parts, r.raw_input_pruned_at, r.output_pruned_at,
    r.attempts_pruned_at, true AS claimed,
    set_config('synchronous_commit',
      COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)
), done AS (
  SELECT r.run_id, r.job_name, r.subject_id, r.scheduled_at, r.version, r.status,
    NULL::jsonb AS raw_input, r.output, r.lease_owner, r.lease_expires_at, r.lease_epoch,
    r.attempts, r.last_error, r.created_at, r.updated_at, r.completed_at, r.revision,
    r.input_fingerprint, r.config_fingerprint, r.config_parts, r.raw_input_pruned_at,
    r.output_pruned_at, r.attempts_pruned_at, false AS claimed
  FROM {schema}.runs AS r
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
  RETURNING r.run_id, r.job_name, r.subject_id, r.scheduled_at, r.version, r.status, r.raw_input,
    r.output, r.lease_owner, r.lease_expires_at, r.lease_epoch, r.attempts, r.last_error,
    r.created_at, r.updated_at, r.completed_at, r.revision, r.input_fingerprint,
    r.config_fingerprint, r.config_parts, r.raw_input_pruned_at, r.output_pruned_at,
    r.attempts_pruned_at,
    prev.claimable AS claimed, prev.status AS prev_status,
    prev.lease_owner AS prev_owner, prev.lease_epoch AS prev_epoch,
    prev.lease_started_at AS prev_started_at, prev.lease_caller_run_id AS prev_caller_run_id,
    prev.lease_caller_step AS prev_caller_step
), lost AS (
  INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, caller_run_id, caller_step,
    started_at, ended_at, outcome)
  SELECT run_id, prev_epoch, prev_owner, prev_caller_run_id, prev_caller_step,
    COALESCE(prev_started_at, now()), now(),
    CASE WHEN prev_owner = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END
  FROM claimed
  WHERE claimed AND prev_status = 'running'
  ON CONFLICT (run_id, lease_epoch) DO NOTHING
)
SELECT u.*, CASE WHEN u.budgeted AND %(hold_tokens)s::bigint IS NOT NULL THEN (
    SELECT v.outcome FROM {schema}.reserve_budget(u.run_id, u.lease_epoch::int, %(worker_id)s,
      NULL, NULL, %(hold_tokens)s::bigint, %(requested)s, NULL, NULL, u.job_name, u.subject_id)
      AS v) END AS held
FROM (
  SELECT u.*, u.claimed AND EXISTS (SELECT FROM {schema}.drills AS d
      WHERE d.job_name IN (%(job_name)s, '*') AND d.remaining > 0 AND d.expires_at > now())
    AS drill_armed,
    u.claimed AND EXISTS (SELECT FROM {schema}.spend_budgets AS b
      WHERE %(job_name)s::text = ANY(b.jobs)) AS budgeted
  FROM (
    SELECT run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output,
      lease_owner, lease_expires_at, lease_epoch, attempts, last_error, created_at, updated_at,
      completed_at, revision, input_fingerprint, config_fingerprint, config_parts,
      raw_input_pruned_at, output_pruned_at, attempts_pruned_at, claimed FROM inserted
    UNION ALL
    SELECT run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output,
      lease_owner, lease_expires_at, lease_epoch, attempts, last_error, created_at, updated_at,
      completed_at, revision, input_fingerprint, config_fingerprint, config_parts,
      raw_input_pruned_at, output_pruned_at, attempts_pruned_at, claimed FROM done
    UNION ALL
    SELECT run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output,
      lease_owner, lease_expires_at, lease_epoch, attempts, last_error, created_at, updated_at,
      completed_at, revision, input_fingerprint, config_fingerprint, config_parts,
      raw_input_pruned_at, output_pruned_at, attempts_pruned_at, claimed FROM claimed
  ) AS u
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
-- a budget adds no round trip to the handover before a model call. A handover names its step
-- (`caller_step`): the attempt then says which step it ended in, not only the one that claimed.
WITH renewed AS (
  UPDATE {schema}.runs
  SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    lease_caller_step = COALESCE(%(caller_step)s, lease_caller_step)
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

-- name: run_job
-- The identity job and subject of a run.
SELECT job_name, subject_id FROM {schema}.runs WHERE run_id = %(run_id)s

-- faces: worker admin

-- name: get_run
-- One run's record.
SELECT * FROM {schema}.runs WHERE run_id = %(run_id)s

-- faces: admin

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

-- name: run_ids_by_prefix
-- The run ids starting with a hex prefix; two rows back mean "ambiguous".
-- A range on the primary key (ids are lowercase hex, and 'g' sorts after 'f' in every collation
-- PostgreSQL offers), where LIKE would read the whole index in a non-C collation.
SELECT run_id FROM {schema}.runs
WHERE run_id >= %(prefix)s AND run_id < %(prefix)s || 'g'
  AND left(run_id, length(%(prefix)s)) = %(prefix)s
ORDER BY run_id
LIMIT 2

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

-- name: database_now
-- The database's clock (retention cutoffs are computed by it, as leases are).
SELECT now()

-- name: expired_leases
-- Running runs whose lease expired (by the database clock) without an outcome.
SELECT * FROM {schema}.runs
WHERE status = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at
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

-- name: run_statuses
-- The stored status of each of these run ids (ids not registered are left out).
SELECT run_id, status FROM {schema}.runs WHERE run_id = ANY(%(run_ids)s)

-- name: run_sizes
-- The stored status of each of these run ids and the bytes of its raw-input checkpoint.
-- For an estimate; ids not registered are left out.
-- The ids come as one comma-separated text (hex ids need no quoting): a text array of
-- thousands is slow to send.
SELECT run_id, status, octet_length(raw_input::text) FROM {schema}.runs
WHERE run_id = ANY(string_to_array(%(run_ids)s, ','))
