-- The retention store: what the ledger keeps (storage by table) and the pruning of what it may
-- drop, in batches no lease holds.

-- faces: admin

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

-- name: prune_spend
-- Count (or, with `apply`, delete) a job's spend rows older than the longest budget period.
-- The ledger's function `prune_spend` (migration 0021, run as the ledger's owner, so the
-- retention job needs no write on budget counters): the current and the previous calendar
-- month (UTC, database clock) are kept, whatever the caller asks.
SELECT {schema}.prune_spend(%(job_name)s, %(apply)s)
