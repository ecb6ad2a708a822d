-- change: additive
-- Provider rate limits shared by every worker of every deployment on the ledger (issue 33):
-- requests and tokens per window (a minute, unless said) per provider, model and API key name,
-- decided on the database clock. Expand only: the previous release's workers never read them.
--
-- Each measure is a token bucket kept as a theoretical arrival time (GCRA), a little shallower
-- and slower than the provider's own (core/rate_limits.py says by how much). A worker reserves its request's place (`acquire_rate`) and waits until then instead of
-- meeting a 429. Fair between subjects: one whose earlier reservation is still pending may
-- reserve at most half a window ahead, and polls past that; one with none, a whole window.
-- So a backfill of one subject never pushes another subject's request more than one window out.
CREATE TABLE {schema}.rate_limits (
    provider            text NOT NULL,
    model               text NOT NULL,
    key_name            text NOT NULL DEFAULT '',
    requests_per_window integer CHECK (requests_per_window > 0),
    tokens_per_window   bigint CHECK (tokens_per_window > 0),
    window_seconds      integer NOT NULL DEFAULT 60
                        CHECK (window_seconds BETWEEN 1 AND 86400),
    requests_tat        timestamptz,
    tokens_tat          timestamptz,
    declared_by         text NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model, key_name),
    CONSTRAINT rate_limits_some_limit
      CHECK (requests_per_window IS NOT NULL OR tokens_per_window IS NOT NULL)
);

CREATE TABLE {schema}.rate_subjects (
    provider       text NOT NULL,
    model          text NOT NULL,
    key_name       text NOT NULL,
    job_name       text NOT NULL,
    subject_id     text NOT NULL,
    reserved_until timestamptz NOT NULL,
    PRIMARY KEY (provider, model, key_name, job_name, subject_id),
    FOREIGN KEY (provider, model, key_name)
      REFERENCES {schema}.rate_limits (provider, model, key_name) ON DELETE CASCADE
);
