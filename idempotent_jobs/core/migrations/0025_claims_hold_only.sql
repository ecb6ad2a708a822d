-- change: additive
-- Give back what `begin` held for runs it did not claim. Before this release a worker's `begin`
-- under a budget, with a declared worst case, reserved it for a run it only reused (completed)
-- or found busy (another worker's lease): holds that no call would ever settle, each keeping
-- its budget's room until the period ended. Such a hold names a worker that neither holds that
-- lease epoch of the run nor ended an attempt at it. A hold of a call still in flight always
-- names its epoch's worker (an attempt superseded meanwhile is recorded with its worker), and
-- the batch lane's and shadows' holds name their own workers: all are kept.
SELECT {schema}.release_holds(h.run_id, h.lease_epoch, h.worker_id)
FROM (SELECT DISTINCT run_id, lease_epoch, worker_id FROM {schema}.budget_holds) AS h
WHERE h.worker_id NOT LIKE 'batch:%' AND h.worker_id NOT LIKE 'shadow:%'
  AND NOT EXISTS (SELECT FROM {schema}.runs AS r WHERE r.run_id = h.run_id
    AND r.lease_epoch = h.lease_epoch AND r.lease_owner = h.worker_id)
  AND NOT EXISTS (SELECT FROM {schema}.run_attempts AS a WHERE a.run_id = h.run_id
    AND a.lease_epoch = h.lease_epoch AND a.worker_id = h.worker_id);
