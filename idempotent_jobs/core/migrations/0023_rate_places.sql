-- change: additive
-- One admission per request (issue 45): a request's place under a provider's rate limit is a
-- function, so the statement that admits a request (the lease still held, its budget hold, its
-- place) takes it in the same round trip, and the statement that only asks for a place again
-- calls the same function: the rule is written once. Expand only: a previous release's
-- `acquire_rate` statement keeps working beside it (the same tables, the same rule).
--
-- Each measure (requests, tokens) is a token bucket kept as its theoretical arrival time
-- (GCRA): the bucket holds `p_burst` of a window's worth and refills at `p_pace` of the limit's
-- rate (both a little under the provider's, so arrival jitter never meets its own bucket
-- empty). A request may start once every bucket has room for it; reserving moves each time on
-- by what it takes. The limit row is locked for the decision, so reservations are serialised
-- per limit. Fairness: a subject whose last reservation has not started yet may reserve at
-- most half a window ahead, any other a whole window; past that nothing is reserved and the
-- worker asks again after `wait_seconds`. No row: no such limit. Database clock throughout.
-- Runs as its caller (a worker may write the limit's arrival times and its subjects' places).
CREATE FUNCTION {schema}.take_rate_place(p_run_id text, p_provider text, p_model text,
    p_key_name text, p_tokens bigint, p_burst float8, p_pace float8)
RETURNS TABLE (granted boolean, wait_seconds float8)
LANGUAGE sql AS $body$
  WITH run AS (
    SELECT job_name, subject_id FROM {schema}.runs WHERE run_id = p_run_id
  ), lim AS (
    SELECT l.provider, l.model, l.key_name, l.requests_tat, l.tokens_tat, now() AS now,
      make_interval(secs => l.window_seconds) AS win,
      make_interval(secs => l.window_seconds * p_burst) AS room,
      make_interval(secs => l.window_seconds / (l.requests_per_window * p_pace)) AS req_step,
      make_interval(secs => l.window_seconds * p_tokens / (l.tokens_per_window * p_pace))
        AS tok_step
    FROM {schema}.rate_limits AS l
    WHERE l.provider = p_provider AND l.model = p_model AND l.key_name = p_key_name
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
  SELECT d.start - d.now <= d.horizon,
    GREATEST(0, extract(epoch FROM d.start - d.now)
      - CASE WHEN d.start - d.now <= d.horizon THEN 0 ELSE extract(epoch FROM d.horizon) END)
      ::float8
  FROM decided AS d
$body$;
