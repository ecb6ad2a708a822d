-- The outbox store: notifications queued by the commit, delivered once.

-- faces: worker

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

-- faces: worker admin

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

-- faces: admin

-- name: stale_outbox
-- Undelivered notifications queued longer ago than the given number of seconds.
SELECT * FROM {schema}.notification_outbox
WHERE delivered_at IS NULL AND created_at < now() - make_interval(secs => %(older_than_seconds)s)
ORDER BY created_at
LIMIT %(limit)s
