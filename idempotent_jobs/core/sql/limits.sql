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
-- The ledger's function `take_rate_place` (migration 0023: the rule, GCRA on the database clock,
-- each subject at most a window ahead). No row: no such limit. A request's first ask travels
-- with its admission (`admit_request`, calls.sql); this asks again.
SELECT granted, wait_seconds FROM {schema}.take_rate_place(%(run_id)s, %(provider)s, %(model)s,
  %(key_name)s, %(tokens)s::bigint, %(burst)s::float8, %(pace)s::float8)

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
