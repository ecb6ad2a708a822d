-- change: additive
-- The run ledger: one row per logical run, one per successful claim, one per (run, channel)
-- notification. `{schema}` is replaced by the quoted schema name before this file runs.

CREATE TABLE {schema}.runs (
    run_id          text PRIMARY KEY CHECK (run_id ~ '^[0-9a-f]{{64}}$'),
    job_name        text NOT NULL,
    subject_id      text NOT NULL,
    scheduled_at    timestamptz NOT NULL,
    version         text NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CONSTRAINT runs_status_check
                    CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    raw_input       jsonb,
    output          jsonb,
    lock_owner      text,
    lock_expires_at timestamptz,
    lease_epoch     bigint NOT NULL DEFAULT 0,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    CONSTRAINT runs_identity_key UNIQUE (job_name, subject_id, scheduled_at, version),
    -- A completed run always has its accepted output and holds no lease.
    CONSTRAINT runs_completed_check CHECK (
        status <> 'completed'
        OR (output IS NOT NULL AND completed_at IS NOT NULL AND lock_owner IS NULL)
    ),
    CONSTRAINT runs_lock_check CHECK ((lock_owner IS NULL) = (lock_expires_at IS NULL))
);

-- Operators list runs by job, status and window.
CREATE INDEX runs_job_status_idx ON {schema}.runs (job_name, status, scheduled_at);

CREATE TABLE {schema}.run_attempts (
    run_id         text NOT NULL REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    lease_epoch    bigint NOT NULL,
    worker_id      text NOT NULL,
    dagster_run_id text,
    step_key       text,
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz,
    outcome        text CONSTRAINT run_attempts_outcome_check
                   CHECK (outcome IN ('completed', 'failed', 'lease_lost', 'superseded')),
    error          text,
    model_name     text,
    input_tokens   integer,
    output_tokens  integer,
    PRIMARY KEY (run_id, lease_epoch)
);

CREATE TABLE {schema}.notification_outbox (
    run_id              text NOT NULL REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    channel             text NOT NULL,
    payload             jsonb NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at        timestamptz,
    delivery_attempts   integer NOT NULL DEFAULT 0,
    last_error          text,
    PRIMARY KEY (run_id, channel)
);

-- Delivery scans only what is still to send.
CREATE INDEX notification_outbox_pending_idx
    ON {schema}.notification_outbox (created_at) WHERE delivered_at IS NULL;
