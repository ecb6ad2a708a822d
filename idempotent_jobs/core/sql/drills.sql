-- The drills store: failure drills an operator arms, taken by model calls.

-- faces: worker

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

-- faces: admin

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

-- name: list_drills
-- The drills still armed (calls left, not expired).
SELECT job_name, remaining, expires_at, armed_by, armed_at FROM {schema}.drills
WHERE remaining > 0 AND expires_at > now()
ORDER BY job_name
