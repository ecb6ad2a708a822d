"""Every runtime statement of the ledger, one named constant each.

``{schema}`` is replaced by the quoted schema name once per ledger; all values are parameters.
Every write that follows a claim is fenced by ``lock_owner`` AND ``lease_epoch`` AND
``status = 'running'``: a worker whose lease was reclaimed (epoch moved on) writes nothing.
All times are the database's ``now()``; workers pass durations only.
"""

from typing import LiteralString

RUN_COLUMNS: LiteralString = """run_id, job_name, subject_id, scheduled_at, version, status,
    raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error,
    created_at, updated_at, completed_at, revision, input_fingerprint, config_fingerprint,
    config_parts"""

ATTEMPT_COLUMNS: LiteralString = """run_id, lease_epoch, worker_id, dagster_run_id, step_key,
    started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens"""

OUTBOX_COLUMNS: LiteralString = """run_id, channel, payload, created_at, delivered_at,
    delivery_attempts, last_error, revision"""

MODEL_CALL_COLUMNS: LiteralString = """call_id, run_id, lease_epoch, revision, worker_id,
    dagster_run_id, step_key, retry_number, model_name, input_tokens, output_tokens, outcome, error,
    called_at"""

# A model call's row, written by the statement that ends the call (COMPLETE or FAIL).
_MODEL_CALL: LiteralString = """INSERT INTO {schema}.model_calls (run_id, lease_epoch, revision,
        worker_id, dagster_run_id, step_key, retry_number, model_name, input_tokens,
        output_tokens, outcome, error)"""

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

# Lease-only writes (claim, checkpoint, renew, release) commit without waiting for the WAL flush
# unless the ledger asks for durable lease commits (`%(lease_commit)s` NULL keeps the session's
# setting). Such a commit is visible to every session at once; only a server crash in the next few
# hundred milliseconds can lose it, and then the fence refuses the lost lease's later writes. The
# accepted result, its outbox rows and failures always wait for the flush, and their flush makes
# every earlier lease write durable too (WAL is written in order).
_LEASE_COMMIT: LiteralString = (
    "set_config('synchronous_commit', "
    "COALESCE(%(lease_commit)s::text, current_setting('synchronous_commit')), true)"
)

# A lease is free to take when the run is not completed and nobody holds an unexpired lease on it
# (by the database clock), or the holder is this very worker.
_CLAIMABLE: LiteralString = """r.status <> 'completed'
      AND (r.lock_owner IS NULL OR r.lock_expires_at < now() OR r.lock_owner = %(worker_id)s)"""

# The run as it was before this statement, locked (so it is the latest version), with whether
# this statement may take its lease: the claim knows what it supersedes (a vanished or paused
# holder, or this worker's own earlier claim) and decides on the row it then updates.
_PREVIOUS: LiteralString = (
    """prev AS (
    SELECT run_id, status, lock_owner, lease_epoch, lease_started_at, lease_dagster_run_id,
        lease_step_key, """
    + _LEASE_COMMIT
    + """,
        """
)

# What the update of a claim sets: when `prev.claimable`, the owner, the expiry by the database
# clock, the next fencing epoch and the details of the attempt it opens; always updated_at.
_TAKE_LEASE: LiteralString = """status = CASE WHEN prev.claimable THEN 'running' ELSE r.status END,
        lock_owner = CASE WHEN prev.claimable THEN %(worker_id)s ELSE r.lock_owner END,
        lock_expires_at = CASE WHEN prev.claimable
            THEN now() + make_interval(secs => %(lease_seconds)s) ELSE r.lock_expires_at END,
        lease_epoch = r.lease_epoch + CASE WHEN prev.claimable THEN 1 ELSE 0 END,
        attempts = r.attempts + CASE WHEN prev.claimable THEN 1 ELSE 0 END,
        lease_started_at = CASE WHEN prev.claimable THEN now() ELSE r.lease_started_at END,
        lease_dagster_run_id = CASE WHEN prev.claimable
            THEN %(dagster_run_id)s ELSE r.lease_dagster_run_id END,
        lease_step_key = CASE WHEN prev.claimable THEN %(step_key)s ELSE r.lease_step_key END,
        updated_at = now()"""

# The update itself, on the locked row; returns the run as updated and what it superseded.
_CLAIMED: LiteralString = (
    """claimed AS (
    UPDATE {schema}.runs AS r
    SET """
    + _TAKE_LEASE
    + """
    FROM prev
    WHERE r.run_id = %(run_id)s AND r.run_id = prev.run_id
    RETURNING r.run_id, r.job_name, r.subject_id, r.scheduled_at, r.version, r.status,
        r.raw_input, r.output, r.lock_owner, r.lock_expires_at, r.lease_epoch, r.attempts,
        r.last_error, r.created_at, r.updated_at, r.completed_at, r.revision,
        r.input_fingerprint, r.config_fingerprint, r.config_parts, prev.claimable AS claimed,
        prev.status AS prev_status, prev.lock_owner AS prev_owner,
        prev.lease_epoch AS prev_epoch, prev.lease_started_at AS prev_started_at,
        prev.lease_dagster_run_id AS prev_dagster_run_id, prev.lease_step_key AS prev_step_key,
        """
    + _LEASE_COMMIT
    + """
)"""
)

# The superseded claim's attempt row, written by the claim that ends it.
_LOST_ATTEMPT: LiteralString = """lost AS (
    INSERT INTO {schema}.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key,
        started_at, ended_at, outcome)
    SELECT run_id, prev_epoch, prev_owner, prev_dagster_run_id, prev_step_key,
        COALESCE(prev_started_at, now()), now(),
        CASE WHEN prev_owner = %(worker_id)s THEN 'superseded' ELSE 'lease_lost' END
    FROM claimed
    WHERE claimed AND prev_status = 'running'
    ON CONFLICT (run_id, lease_epoch) DO NOTHING
)"""

# Atomic claim: succeeds only if the lease is free (see _CLAIMABLE). Bumps the fencing epoch and
# records the attempt it supersedes, in one statement that writes one run row (and that attempt).
# A run it cannot claim is not even locked: polling a held run writes nothing.
CLAIM: LiteralString = (
    "WITH "
    + _PREVIOUS
    + """true AS claimable
    FROM {schema}.runs AS r
    WHERE r.run_id = %(run_id)s AND """
    + _CLAIMABLE
    + """
    FOR UPDATE
), """
    + _CLAIMED
    + ", "
    + _LOST_ATTEMPT
    + """
SELECT lease_epoch, lock_expires_at, raw_input, attempts, revision, input_fingerprint
FROM claimed"""
)

# Register and claim in one statement, one round trip in every case: a new run is inserted already
# claimed (epoch 1); an existing one is claimed under the same rule as CLAIM (and only if its
# identity fields match), and otherwise only its updated_at moves, as REGISTER does. `claimed`
# says whether this statement took the lease. No row back means a first registration raced this
# one and is now committed: run the statement again.
BEGIN: LiteralString = (
    """WITH inserted AS (
    INSERT INTO {schema}.runs AS r (run_id, job_name, subject_id, scheduled_at, version, status,
        lock_owner, lock_expires_at, lease_epoch, attempts, lease_started_at,
        lease_dagster_run_id, lease_step_key)
    VALUES (%(run_id)s, %(job_name)s, %(subject_id)s, %(scheduled_at)s, %(version)s, 'running',
        %(worker_id)s, now() + make_interval(secs => %(lease_seconds)s), 1, 1, now(),
        %(dagster_run_id)s, %(step_key)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING """
    + RUN_COLUMNS
    + ", "
    + _LEASE_COMMIT
    + """
), """
    + _PREVIOUS
    + "("
    + _CLAIMABLE
    + """
        AND (r.job_name, r.subject_id, r.scheduled_at, r.version)
            = (%(job_name)s, %(subject_id)s, %(scheduled_at)s::timestamptz, %(version)s)
        ) AS claimable
    FROM {schema}.runs AS r
    WHERE r.run_id = %(run_id)s
    FOR UPDATE
), """
    + _CLAIMED
    + ", "
    + _LOST_ATTEMPT
    + """
SELECT """
    + RUN_COLUMNS
    + """, true AS claimed FROM inserted
UNION ALL SELECT """
    + RUN_COLUMNS
    + """, claimed FROM claimed"""
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
RETURNING lock_expires_at, raw_input, attempts, revision, input_fingerprint, """
    + _LEASE_COMMIT
)

# Checkpoint of the collected input and its fingerprint: the first stored value wins and is
# returned with its fingerprint (the right-hand sides see the row as it was).
SAVE_RAW_INPUT: LiteralString = (
    """
UPDATE {schema}.runs
SET raw_input = COALESCE(raw_input, %(raw_input)s::jsonb),
    input_fingerprint = CASE WHEN raw_input IS NULL THEN %(input_fingerprint)s
        ELSE input_fingerprint END,
    updated_at = now()
WHERE """
    + _FENCE
    + """
RETURNING raw_input, input_fingerprint, """
    + _LEASE_COMMIT
)

# The ended attempt's row, from the open claim's details on the run (`ended` names the CTE).
_ENDED_ATTEMPT: LiteralString = """INSERT INTO {schema}.run_attempts (run_id, lease_epoch,
        worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name,
        input_tokens, output_tokens)"""

# A candidate answer is accepted only on the revision and raw-input checkpoint it was computed
# against (a revise in between moves the revision, and a recollect the checkpoint). A basis
# without a fingerprint (computed before any checkpoint was read) binds the revision only.
_BASIS: LiteralString = """revision = %(revision)s::integer AND input_fingerprint
            IS NOT DISTINCT FROM COALESCE(%(input_fingerprint)s::text, input_fingerprint)"""

# The final commit, one statement so one transaction. An accepted candidate: output, configuration
# fingerprint, the attempt's outcome and usage, and the outbox rows (one per channel and revision,
# never twice; a revised run notifies only the channels its revision named). A stale candidate:
# nothing of it is stored or sent, the lease is given back (the run waits, pending, for an answer
# on its current basis) and the attempt ends `superseded`, saying why.
COMPLETE: LiteralString = (
    """
WITH done AS (
    UPDATE {schema}.runs
    SET status = CASE WHEN """
    + _BASIS
    + """ THEN 'completed' ELSE 'pending' END,
        output = CASE WHEN """
    + _BASIS
    + """ THEN %(output)s::jsonb ELSE output END,
        completed_at = CASE WHEN """
    + _BASIS
    + """ THEN now() ELSE completed_at END,
        config_fingerprint = CASE WHEN """
    + _BASIS
    + """ THEN %(config_fingerprint)s ELSE config_fingerprint END,
        config_parts = CASE WHEN """
    + _BASIS
    + """ THEN %(config_parts)s::jsonb ELSE config_parts END,
        last_error = CASE WHEN """
    + _BASIS
    + """ THEN NULL ELSE last_error END,
        lock_owner = NULL, lock_expires_at = NULL, updated_at = now()
    WHERE """
    + _FENCE
    + """
    RETURNING run_id, lease_epoch, output, revision, input_fingerprint, lease_started_at,
        lease_dagster_run_id, lease_step_key, status = 'completed' AS accepted
), attempt AS (
    """
    + _ENDED_ATTEMPT
    + """
    SELECT run_id, lease_epoch, %(worker_id)s, lease_dagster_run_id, lease_step_key,
        COALESCE(lease_started_at, now()), now(),
        CASE WHEN accepted THEN 'completed' ELSE 'superseded' END,
        CASE WHEN NOT accepted THEN 'stale candidate: computed on revision '
            || %(revision)s::integer || ', checkpoint '
            || COALESCE(left(%(input_fingerprint)s::text, 12), 'none')
            || '; the run is at revision ' || revision || ', checkpoint '
            || COALESCE(left(input_fingerprint, 12), 'none') END,
        %(model_name)s, %(input_tokens)s, %(output_tokens)s
    FROM done
), call AS (
    """
    + _MODEL_CALL
    + """
    SELECT run_id, lease_epoch, %(revision)s::integer, %(worker_id)s, %(call_dagster_run_id)s,
        %(call_step_key)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
        CASE WHEN accepted THEN 'accepted' ELSE 'stale' END, NULL
    FROM done
), outbox AS (
    INSERT INTO {schema}.notification_outbox (run_id, channel, payload, revision)
    SELECT done.run_id, n.key, n.value, done.revision
    FROM done, jsonb_each(%(notifications)s::jsonb) AS n
    WHERE done.accepted AND (done.revision = 0 OR n.key IN (
        SELECT unnest(r.channels) FROM {schema}.run_revisions AS r
        WHERE r.run_id = done.run_id AND r.revision = done.revision))
    ON CONFLICT (run_id, channel, revision) DO NOTHING
)
SELECT accepted, output, revision, input_fingerprint FROM done"""
)

# A failed attempt: the run becomes claimable again; the reason is kept on run and attempt, and
# on the model call's row when a model call failed or its answer was rejected.
FAIL: LiteralString = (
    """
WITH failed AS (
    UPDATE {schema}.runs
    SET status = 'failed', last_error = %(error)s, lock_owner = NULL, lock_expires_at = NULL,
        updated_at = now()
    WHERE """
    + _FENCE
    + """
    RETURNING run_id, lease_epoch, revision, lease_started_at, lease_dagster_run_id,
        lease_step_key
), call AS (
    """
    + _MODEL_CALL
    + """
    SELECT run_id, lease_epoch, revision, %(worker_id)s, %(call_dagster_run_id)s,
        %(call_step_key)s, %(call_retry)s, %(model_name)s, %(input_tokens)s, %(output_tokens)s,
        %(call_outcome)s, %(error)s
    FROM failed
    WHERE %(call_outcome)s::text IS NOT NULL
), attempt AS (
    """
    + _ENDED_ATTEMPT
    + """
    SELECT run_id, lease_epoch, %(worker_id)s, lease_dagster_run_id, lease_step_key,
        COALESCE(lease_started_at, now()), now(), 'failed', %(error)s, %(model_name)s,
        %(input_tokens)s, %(output_tokens)s
    FROM failed
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
    RETURNING run_id, lease_epoch, lease_started_at, lease_dagster_run_id, lease_step_key, """
    + _LEASE_COMMIT
    + """
), attempt AS (
    """
    + _ENDED_ATTEMPT
    + """
    SELECT run_id, lease_epoch, %(worker_id)s, lease_dagster_run_id, lease_step_key,
        COALESCE(lease_started_at, now()), now(), 'superseded', NULL, NULL, NULL, NULL
    FROM released
)
SELECT run_id FROM released"""
)

GET_RUN: LiteralString = "SELECT " + RUN_COLUMNS + " FROM {schema}.runs WHERE run_id = %(run_id)s"

LIST_ATTEMPTS: LiteralString = (
    "SELECT "
    + ATTEMPT_COLUMNS
    + " FROM {schema}.attempts WHERE run_id = %(run_id)s ORDER BY lease_epoch"
)

LIST_MODEL_CALLS: LiteralString = (
    "SELECT "
    + MODEL_CALL_COLUMNS
    + " FROM {schema}.model_calls WHERE run_id = %(run_id)s ORDER BY call_id"
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
    revision = new_revision, updated_at = now(), config_fingerprint = NULL, config_parts = NULL,
    raw_input = CASE WHEN %(recollect)s THEN NULL ELSE raw_input END,
    input_fingerprint = CASE WHEN %(recollect)s THEN NULL ELSE input_fingerprint END
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

# Completed runs of a job version whose result was computed under another configuration (runs
# completed before configurations were recorded have none and are not compared).
DRIFTED_RUNS: LiteralString = (
    "SELECT "
    + RUN_COLUMNS
    + """ FROM {schema}.runs
WHERE job_name = %(job_name)s AND version = %(version)s AND status = 'completed'
  AND config_fingerprint IS NOT NULL AND config_fingerprint <> %(config_fingerprint)s
ORDER BY scheduled_at DESC, subject_id
LIMIT %(limit)s"""
)

# Operators may name a run by a prefix of its id; two rows back mean "ambiguous".
RUN_IDS_BY_PREFIX: LiteralString = """
SELECT run_id FROM {schema}.runs WHERE run_id LIKE %(prefix)s || '%%' ORDER BY run_id LIMIT 2"""
