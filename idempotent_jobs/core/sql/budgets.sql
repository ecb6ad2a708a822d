-- The budgets store: budgets declared by a spec or set by an operator, and a request's hold
-- (the ledger's functions admit and release it).

-- faces: worker

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

-- faces: admin

-- name: budget_standings
-- Every budget in the ledger, with where its current period stands.
-- Those covering one job, when `job_name` is given; the current period's counter (for a subject
-- budget, that of `subject_id` when given, else the subject that spent most), and whether it has
-- no room left: what every worker enforces.
SELECT b.*, {schema}.period_start(b.period, now())::timestamp AT TIME ZONE 'UTC'
    AS period_start,
  COALESCE(k.spent, 0) AS spent, COALESCE(k.reserved, 0) AS reserved,
  COALESCE(k.in_doubt, 0) AS in_doubt, COALESCE(k.calls, 0) AS calls, COALESCE(k.unknown_calls, 0) AS unknown_calls,
  COALESCE(k.subject_id, '') AS subject_id,
  COALESCE(k.spent + k.reserved + k.in_doubt >= b.amount, false) AS refusing,
  (SELECT currency FROM {schema}.ledger_currency) AS currency
FROM {schema}.spend_budgets AS b
LEFT JOIN LATERAL (SELECT * FROM {schema}.budget_counters AS k
  WHERE k.budget_id = b.budget_id AND k.period_start = {schema}.period_start(b.period, now())
    AND (%(subject_id)s::text IS NULL OR b.scope <> 'subject' OR k.subject_id = %(subject_id)s)
  ORDER BY k.spent + k.reserved + k.in_doubt DESC LIMIT 1) AS k ON true
WHERE %(job_name)s::text IS NULL OR %(job_name)s::text = ANY(b.jobs)
ORDER BY b.budget_id

-- name: set_budget
-- An operator sets a budget; it stands over a spec's declaration.
-- A new one starts with its period's spend so far; a changed amount keeps the counters.
WITH added AS (
  INSERT INTO {schema}.spend_budgets AS b (budget_id, scope, scope_name, unit, period, amount,
    jobs, declared_by, set_by)
  VALUES (%(budget_id)s, %(scope)s, %(scope_name)s, %(unit)s, %(period)s, %(amount)s,
    %(jobs)s::text[], 'operator', COALESCE(%(set_by)s, session_user))
  ON CONFLICT (budget_id) DO UPDATE SET amount = EXCLUDED.amount, jobs = EXCLUDED.jobs,
    declared_by = 'operator', set_at = now(), set_by = EXCLUDED.set_by
  RETURNING b.budget_id, xmax = 0 AS inserted, CASE WHEN xmax = 0
    THEN {schema}.count_period(b.budget_id, b.scope, b.unit, b.period, b.jobs) END
)
SELECT budget_id, inserted FROM added

-- name: clear_budget
-- Remove a budget (its counters and holds go with it): no call is capped by it any more.
DELETE FROM {schema}.spend_budgets WHERE budget_id = %(budget_id)s RETURNING budget_id
