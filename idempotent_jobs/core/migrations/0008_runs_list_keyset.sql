-- `runs list` pages by keyset: the listing order needs a tiebreaker that makes it total (two
-- versions of one job, subject and window share the rest of the key), and the index must hold
-- all of it so that a page starts at its cursor in the index instead of skipping rows.

DROP INDEX {schema}.runs_newest_idx;
CREATE INDEX runs_newest_idx ON {schema}.runs (scheduled_at DESC, job_name, subject_id, run_id);
