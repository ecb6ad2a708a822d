-- change: contracting
-- Explicit revisions: a completed run is recomputed only through `idempotent-jobs revise`. The
-- accepted result it replaces is kept here with the reason; the new result's notifications go
-- only to the channels the operator named, as outbox rows of their own (keyed by revision).

ALTER TABLE {schema}.runs ADD COLUMN revision integer NOT NULL DEFAULT 0;

CREATE TABLE {schema}.run_revisions (
    run_id                text NOT NULL REFERENCES {schema}.runs (run_id) ON DELETE CASCADE,
    revision              integer NOT NULL CHECK (revision > 0),
    reason                text NOT NULL CHECK (length(btrim(reason)) > 0),
    channels              text[] NOT NULL DEFAULT '{{}}',
    previous_output       jsonb NOT NULL,
    previous_completed_at timestamptz NOT NULL,
    previous_epoch        bigint NOT NULL,
    recollect             boolean NOT NULL DEFAULT false,
    requested_by          text,
    requested_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, revision)
);

ALTER TABLE {schema}.notification_outbox ADD COLUMN revision integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.notification_outbox DROP CONSTRAINT notification_outbox_pkey;
ALTER TABLE {schema}.notification_outbox ADD PRIMARY KEY (run_id, channel, revision);
