"""Every runtime statement of the ledger, one named constant each.

``{schema}`` is replaced by the quoted schema name once per ledger; all values are parameters.
Every write that follows a claim is fenced by ``lock_owner`` AND ``lease_epoch`` AND
``status = 'running'``: a worker whose lease was reclaimed (epoch moved on) writes nothing.
All times are the database's ``now()``; workers pass durations only.
"""

from typing import LiteralString

RUN_COLUMNS: LiteralString = """run_id, job_name, subject_id, scheduled_at, version, status,
    raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error,
    created_at, updated_at, completed_at, revision"""

ATTEMPT_COLUMNS: LiteralString = """run_id, lease_epoch, worker_id, dagster_run_id, step_key,
    started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens"""

OUTBOX_COLUMNS: LiteralString = """run_id, channel, payload, created_at, delivered_at,
    delivery_attempts, last_error, revision"""

REVISION_COLUMNS: LiteralString = """run_id, revision, reason, channels, previous_output,
    previous_completed_at, previous_epoch, recollect, requested_by, requested_at"""

# Idempotent registration: one row per run id; a second registration only touches updated_at,
# never clears output nor moves a completed run back. Same fields under another id violate
# runs_identity_key.
REGISTER: LiteralString = (
    """
INSERT INTO {schema}.runs (run_id, job_name, subject_id, scheduled_at, version)
VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s)
ON CONFLICT (run_id) DO UPDATE SET updated_at = now()
RETURNING """
    + RUN_COLUMNS
)

# Atomic claim: succeeds only if the run is not completed and its lease is free, expired by the
# database clock, or already this worker's. Bumps the fencing epoch, closes the attempt it
# supersedes and opens this one, all in one statement.
CLAIM: LiteralString = """
WITH claimed AS (
    UPDATE {schema}.runs
    SET status = 'running',
        lock_owner = %(worker_id)s,
        lock_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        lease_epoch = lease_epoch + 1,
        attempts = attempts + 1,
        updated_at = now()
    WHERE run_id = %(run_id)s
      AND status <> 'completed'
      AND (lock_owner IS NULL OR lock_expires_at < now() OR lock_owner = %(worker_id)s)
    RETURNING run_id, lease_epoch, lock_expires_at, raw_input, attempts
), closed AS (
    UPDATE {schema}.run_attempts AS a
    SET outcome = CASE WHEN a.worker_id = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END,
        ended_at = now()
    FROM claimed
    WHERE a.run_id = claimed.run_id AND a.outcome IS NULL
), opened AS (
    INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key)
    SELECT run_id, lease_epoch, %(worker_id)s, %(dagster_run_id)s, %(step_key)s FROM claimed
)
SELECT lease_epoch, lock_expires_at, raw_input, attempts FROM claimed
"""

# Register and claim in one statement, one round trip in every case: a new run is inserted already
# claimed (epoch 1); an existing one is claimed under the same rule as CLAIM (and only if its
# identity fields match), otherwise left as it is (updated_at aside, as REGISTER does). `claimed`
# is true when this statement took the lease: then the expiry is exactly this statement's
# now() + duration, which no earlier statement can have set.
_CLAIMABLE: LiteralString = """(r.status <> 'completed'
        AND (r.lock_owner IS NULL OR r.lock_expires_at < now()
             OR r.lock_owner = EXCLUDED.lock_owner)
        AND (r.job_name, r.subject_id, r.scheduled_at, r.version)
            = (EXCLUDED.job_name, EXCLUDED.subject_id, EXCLUDED.scheduled_at, EXCLUDED.version))"""

BEGIN: LiteralString = (
    """
WITH up AS (
    INSERT INTO {schema}.runs AS r (run_id, job_name, subject_id, scheduled_at, version, status,
        lock_owner, lock_expires_at, lease_epoch, attempts)
    VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s, 'running',
        %(worker_id)s, now() + make_interval(secs => %(lease_seconds)s), 1, 1)
    ON CONFLICT (run_id) DO UPDATE
    SET status = CASE WHEN """
    + _CLAIMABLE
    + """ THEN 'running' ELSE r.status END,
        lock_owner = CASE WHEN """
    + _CLAIMABLE
    + """ THEN EXCLUDED.lock_owner ELSE r.lock_owner END,
        lock_expires_at = CASE WHEN """
    + _CLAIMABLE
    + """ THEN EXCLUDED.lock_expires_at ELSE r.lock_expires_at END,
        lease_epoch = r.lease_epoch + CASE WHEN """
    + _CLAIMABLE
    + """ THEN 1 ELSE 0 END,
        attempts = r.attempts + CASE WHEN """
    + _CLAIMABLE
    + """ THEN 1 ELSE 0 END,
        updated_at = now()
    RETURNING """
    + RUN_COLUMNS
    + """,
        (lock_owner IS NOT DISTINCT FROM %(worker_id)s
         AND lock_expires_at = now() + make_interval(secs => %(lease_seconds)s)) AS claimed
), closed AS (
    UPDATE {schema}.run_attempts AS a
    SET outcome = CASE WHEN a.worker_id = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END,
        ended_at = now()
    FROM up
    WHERE up.claimed AND a.run_id = up.run_id AND a.outcome IS NULL
), opened AS (
    INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key)
    SELECT run_id, lease_epoch, %(worker_id)s, %(dagster_run_id)s, %(step_key)s
    FROM up WHERE up.claimed
)
SELECT """
    + RUN_COLUMNS
    + ", claimed FROM up"
)

_FENCE: LiteralString = """run_id = %(run_id)s AND lock_owner = %(worker_id)s
      AND lease_epoch = %(epoch)s AND status = 'running'"""

# Heartbeat, or taking over a lease handed on by an earlier step: push the expiry forward by the
# lease duration, only while still the owner; hands back the checkpoint too. Not a change of the
# run's state, so updated_at stays.
RENEW: LiteralString = (
    """
UPDATE {schema}.runs
SET lock_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE """
    + _FENCE
    + """
RETURNING lock_expires_at, raw_input, attempts"""
)

# Checkpoint of the collected input: the first stored value wins and is returned.
SAVE_RAW_INPUT: LiteralString = (
    """
UPDATE {schema}.runs
SET raw_input = COALESCE(raw_input, %(raw_input)s::jsonb), updated_at = now()
WHERE """
    + _FENCE
    + """
RETURNING raw_input"""
)

# The final commit, one statement so one transaction: accepted output, the attempt's outcome and
# usage, and the outbox rows (one per channel and revision, never twice). A revised run notifies
# only the channels its revision named.
COMPLETE: LiteralString = (
    """
WITH done AS (
    UPDATE {schema}.runs
    SET status = 'completed', output = %(output)s::jsonb, completed_at = now(),
        lock_owner = NULL, lock_expires_at = NULL, last_error = NULL, updated_at = now()
    WHERE """
    + _FENCE
    + """
    RETURNING run_id, lease_epoch, output, revision
), attempt AS (
    UPDATE {schema}.run_attempts AS a
    SET outcome = 'completed', ended_at = now(), model_name = %(model_name)s,
        input_tokens = %(input_tokens)s, output_tokens = %(output_tokens)s
    FROM done
    WHERE a.run_id = done.run_id AND a.lease_epoch = done.lease_epoch
), outbox AS (
    INSERT INTO {schema}.notification_outbox (run_id, channel, payload, revision)
    SELECT done.run_id, n.key, n.value, done.revision
    FROM done, jsonb_each(%(notifications)s::jsonb) AS n
    WHERE done.revision = 0 OR n.key IN (
        SELECT unnest(r.channels) FROM {schema}.run_revisions AS r
        WHERE r.run_id = done.run_id AND r.revision = done.revision)
    ON CONFLICT (run_id, channel, revision) DO NOTHING
)
SELECT output FROM done"""
)

# A failed attempt: the run becomes claimable again; the reason is kept on run and attempt.
FAIL: LiteralString = (
    """
WITH failed AS (
    UPDATE {schema}.runs
    SET status = 'failed', last_error = %(error)s, lock_owner = NULL, lock_expires_at = NULL,
        updated_at = now()
    WHERE """
    + _FENCE
    + """
    RETURNING run_id, lease_epoch
), attempt AS (
    UPDATE {schema}.run_attempts AS a
    SET outcome = 'failed', ended_at = now(), error = %(error)s, model_name = %(model_name)s,
        input_tokens = %(input_tokens)s, output_tokens = %(output_tokens)s
    FROM failed
    WHERE a.run_id = failed.run_id AND a.lease_epoch = failed.lease_epoch
)
SELECT run_id FROM failed"""
)

# Hand the run back untouched (for example between ops running in different processes).
RELEASE: LiteralString = (
    """
WITH released AS (
    UPDATE {schema}.runs
    SET status = 'pending', lock_owner = NULL, lock_expires_at = NULL, updated_at = now()
    WHERE """
    + _FENCE
    + """
    RETURNING run_id, lease_epoch
), attempt AS (
    UPDATE {schema}.run_attempts AS a
    SET outcome = 'superseded', ended_at = now()
    FROM released
    WHERE a.run_id = released.run_id AND a.lease_epoch = released.lease_epoch
)
SELECT run_id FROM released"""
)

GET_RUN: LiteralString = "SELECT " + RUN_COLUMNS + " FROM {schema}.runs WHERE run_id = %(run_id)s"

LIST_ATTEMPTS: LiteralString = (
    "SELECT "
    + ATTEMPT_COLUMNS
    + " FROM {schema}.run_attempts WHERE run_id = %(run_id)s ORDER BY lease_epoch"
)

LIST_OUTBOX: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """ FROM {schema}.notification_outbox
WHERE (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (NOT %(pending_only)s OR delivered_at IS NULL)
ORDER BY created_at, run_id, channel, revision
LIMIT %(limit)s"""
)

# Delivery takes one undelivered row at a time under FOR UPDATE SKIP LOCKED, so two deliverers
# never send the same row concurrently; the row lock is held while sending.
LOCK_UNDELIVERED: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """ FROM {schema}.notification_outbox
WHERE run_id = %(run_id)s AND channel = %(channel)s AND revision = %(revision)s
  AND delivered_at IS NULL
FOR UPDATE SKIP LOCKED"""
)

MARK_DELIVERED: LiteralString = """
UPDATE {schema}.notification_outbox
SET delivered_at = now(), delivery_attempts = delivery_attempts + 1, last_error = NULL
WHERE run_id = %(run_id)s AND channel = %(channel)s AND revision = %(revision)s
  AND delivered_at IS NULL"""

MARK_DELIVERY_FAILED: LiteralString = """
UPDATE {schema}.notification_outbox
SET delivery_attempts = delivery_attempts + 1, last_error = %(error)s
WHERE run_id = %(run_id)s AND channel = %(channel)s AND revision = %(revision)s
  AND delivered_at IS NULL"""

# Operators list runs by job, subject, status and window; every filter is optional.
LIST_RUNS: LiteralString = (
    "SELECT "
    + RUN_COLUMNS
    + """ FROM {schema}.runs
WHERE (%(job_name)s::text IS NULL OR job_name = %(job_name)s)
  AND (%(subject_id)s::text IS NULL OR subject_id = %(subject_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(since)s::timestamptz IS NULL OR scheduled_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR scheduled_at < %(until)s)
ORDER BY scheduled_at DESC, job_name, subject_id
LIMIT %(limit)s"""
)

LIST_REVISIONS: LiteralString = (
    "SELECT "
    + REVISION_COLUMNS
    + " FROM {schema}.run_revisions WHERE run_id = %(run_id)s ORDER BY revision"
)

# The only way a completed run is recomputed: the accepted result moves to run_revisions with the
# reason, and the run becomes claimable again under the next revision number.
REVISE: LiteralString = (
    """
WITH current AS (
    SELECT run_id, revision, output, completed_at, lease_epoch FROM {schema}.runs
    WHERE run_id = %(run_id)s AND status = 'completed'
    FOR UPDATE
), kept AS (
    INSERT INTO {schema}.run_revisions (run_id, revision, reason, channels, previous_output,
        previous_completed_at, previous_epoch, recollect, requested_by)
    SELECT run_id, revision + 1, %(reason)s, %(channels)s, output, completed_at, lease_epoch,
        %(recollect)s, %(requested_by)s
    FROM current
    RETURNING run_id AS revised_run_id, revision AS new_revision
)
UPDATE {schema}.runs
SET status = 'pending', output = NULL, completed_at = NULL, last_error = NULL,
    revision = new_revision, updated_at = now(),
    raw_input = CASE WHEN %(recollect)s THEN NULL ELSE raw_input END
FROM kept
WHERE run_id = revised_run_id
RETURNING """
    + RUN_COLUMNS
)

# Health: what an operator should look at.
EXPIRED_LEASES: LiteralString = (
    "SELECT "
    + RUN_COLUMNS
    + """ FROM {schema}.runs
WHERE status = 'running' AND lock_expires_at < now()
ORDER BY lock_expires_at"""
)

STALE_OUTBOX: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """ FROM {schema}.notification_outbox
WHERE delivered_at IS NULL AND created_at < now() - make_interval(secs => %(older_than_seconds)s)
ORDER BY created_at"""
)

FAILED_PAST_RETRIES: LiteralString = (
    "SELECT "
    + RUN_COLUMNS
    + """ FROM {schema}.runs
WHERE status = 'failed' AND attempts >= %(max_attempts)s
ORDER BY updated_at"""
)

# Operators may name a run by a prefix of its id; two rows back mean "ambiguous".
RUN_IDS_BY_PREFIX: LiteralString = """
SELECT run_id FROM {schema}.runs WHERE run_id LIKE %(prefix)s || '%%' ORDER BY run_id LIMIT 2"""
