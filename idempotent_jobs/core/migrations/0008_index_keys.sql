-- change: additive
-- Index keys, second look (0007 is the first).
--
-- `runs list` pages by keyset: the listing order needs a tiebreaker that makes it total (two
-- versions of one job, subject and window share the rest of the key), and the index must hold
-- all of it so that a page starts at its cursor in the index instead of skipping rows.
--
-- Failed runs are found by a key that never changes (the window start) rather than updated_at:
-- an index on a column that every write sets makes every update of a run a non-HOT update (a new
-- entry in each of the table's indexes), the checkpoint included.
--
-- Pages of `runs` keep a tenth free, so that an update that changes no indexed column (the
-- checkpoint) can stay on its page as a HOT update.

DROP INDEX {schema}.runs_newest_idx;
CREATE INDEX runs_newest_idx ON {schema}.runs (scheduled_at DESC, job_name, subject_id, run_id);
DROP INDEX {schema}.runs_failed_idx;
CREATE INDEX runs_failed_idx ON {schema}.runs (scheduled_at) WHERE status = 'failed';
ALTER TABLE {schema}.runs SET (fillfactor = 90);
