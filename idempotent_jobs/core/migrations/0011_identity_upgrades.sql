-- change: additive
-- Identities an earlier release stored in another Unicode form than NFC. Release 0.1 hashed and
-- stored identity text as given, so a subject typed in NFD ("café" with a combining accent) got
-- a run id that today's NFC recipe does not compute. `migrate` (core/upgrade.py) puts such a
-- run's identity fields in NFC and keeps its run id, so the NFC form finds it by its identity
-- (registration falls back from the run id to the identity key) and its notifications keep
-- their idempotency keys. A run whose NFC form is another stored run is kept as stored. Each
-- run examined gets one row here: what it was stored as, and what was done.

CREATE TABLE {schema}.identity_upgrades (
    run_id      text PRIMARY KEY REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    job_name    text NOT NULL,
    subject_id  text NOT NULL,
    version     text NOT NULL,
    outcome     text NOT NULL CONSTRAINT identity_upgrades_outcome_check
                CHECK (outcome IN ('normalised', 'kept')),
    kept_for    text,
    upgraded_at timestamptz NOT NULL DEFAULT now()
);

-- The data steps `migrate` has finished on this ledger (core/upgrade.py), so that each scans the
-- tables once, at the upgrade, not at every later `migrate`.
CREATE TABLE {schema}.upgrade_steps (
    step    text PRIMARY KEY,
    done_at timestamptz NOT NULL DEFAULT now()
);
