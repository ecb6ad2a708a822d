-- The limits store: fleet-wide rate limits, declared by a spec or set by an operator, and a
-- request's place under them on the database clock.

-- faces: worker

-- name: declare_rate_limit
-- Record a rate limit a job's spec declares, for every worker of every deployment to keep.
-- The ledger's function `declare_spec_rate_limit` (migration 0021, run as the ledger's owner):
-- written only when it differs from the row, so workers that agree take no lock after the
-- first, and never over a limit an operator set (`idempotent-jobs limits set` stands until
-- deleted).
SELECT v FROM {schema}.declare_spec_rate_limit(%(provider)s, %(model)s, %(key_name)s,
  %(requests)s::integer, %(tokens)s::bigint, %(window_seconds)s::integer, %(declared_by)s) AS v

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

-- faces: worker admin

-- name: list_rate_limits
-- Every provider rate limit, by provider, model and key name.
SELECT * FROM {schema}.rate_limits ORDER BY provider, model, key_name

-- faces: admin

-- name: set_rate_limit
-- Set a provider rate limit as an operator (it stands over the one a job's spec declares).
INSERT INTO {schema}.rate_limits AS l (provider, model, key_name, requests_per_window,
  tokens_per_window, window_seconds, declared_by)
VALUES (%(provider)s, %(model)s, %(key_name)s, %(requests)s, %(tokens)s, %(window_seconds)s,
  'operator')
ON CONFLICT (provider, model, key_name) DO UPDATE
  SET requests_per_window = EXCLUDED.requests_per_window,
    tokens_per_window = EXCLUDED.tokens_per_window, window_seconds = EXCLUDED.window_seconds,
    declared_by = 'operator', updated_at = now()
RETURNING l.*

-- name: delete_rate_limit
-- Remove a provider rate limit (workers stop pacing that model within half a minute).
DELETE FROM {schema}.rate_limits
WHERE provider = %(provider)s AND model = %(model)s AND key_name = %(key_name)s
RETURNING provider
