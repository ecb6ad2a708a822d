-- change: additive
-- The batch lane (issue 35): a provider batch (OpenAI's Batch API, Anthropic's Message
-- Batches) as a ledger object, so a batch is submitted once and each of its runs accepted once.
-- Expand only: the previous release's workers never read these tables; a run a batch holds is
-- an ordinary lease to them (owner `batch:<batch_id>`), so they step aside from it.
--
-- Lifecycle (`state`): `intent` (its runs claimed and checkpointed, their worst case held
-- under the budgets; committed before the provider is called), `submitted` (the provider's
-- batch id recorded), then `completed`, `expired`, `failed` or `cancelled` as the provider
-- says, and `collected` once every item is accepted, failed or released. `submit_started_at`
-- is set, and committed, right before the create call: an intent without it was never sent,
-- one with it and no provider id may have been, and is looked up at the provider first.
CREATE TABLE {schema}.batches (
    batch_id           text PRIMARY KEY CHECK (batch_id ~ '^[0-9a-f]+$' AND length(batch_id) = 32),
    job_name           text NOT NULL,
    provider           text NOT NULL,
    model              text NOT NULL,
    state              text NOT NULL DEFAULT 'intent' CHECK (state IN ('intent', 'submitted',
                         'completed', 'expired', 'failed', 'cancelled', 'collected')),
    provider_batch_id  text UNIQUE,
    items              integer NOT NULL DEFAULT 0 CHECK (items >= 0),
    -- The batch's own lease: the process advancing it (submit, poll, collect), fenced by its
    -- epoch; renewing it renews every lease the batch holds on its runs.
    lease_owner        text,
    lease_epoch        integer NOT NULL DEFAULT 0,
    lease_expires_at   timestamptz,
    lease_seconds      double precision NOT NULL CHECK (lease_seconds > 0),
    created_at         timestamptz NOT NULL DEFAULT now(),
    submit_started_at  timestamptz,
    submitted_at       timestamptz,
    ended_at           timestamptz,
    collected_at       timestamptz,
    checked_at         timestamptz,
    -- What the provider said last: its status and counts, as JSON.
    provider_status    jsonb,
    error              text,
    -- An operator's `batches cancel`: the lane cancels the provider batch at its next step
    -- (`cancel_sent_at`), collects what was answered and releases the rest.
    cancel_requested_at timestamptz,
    cancel_requested_by text,
    cancel_sent_at     timestamptz,
    -- The Dagster run (or other caller) that made the intent, for the UI and the operator.
    caller_run_id      text
);
CREATE INDEX batches_open ON {schema}.batches (state, created_at)
  WHERE state <> 'collected';

-- One row per run of a batch: the lease epoch the batch holds it under and the `custom_id` its
-- request carries (derived from the run id and that epoch). `state`: `pending` until its result
-- is taken: `accepted` (its answer accepted by the fenced commit), `not_accepted` (paid for, but
-- the run had moved on: revised, completed or taken meanwhile), `failed` (a per-item error or
-- an answer outside the schema: that run's failed attempt, with its cost), `released` (no
-- result: the batch expired, failed or was cancelled; the run's lease given back).
CREATE TABLE {schema}.batch_items (
    batch_id     text NOT NULL REFERENCES {schema}.batches ON DELETE CASCADE,
    run_id       text NOT NULL,
    lease_epoch  integer NOT NULL,
    custom_id    text NOT NULL UNIQUE CHECK (custom_id ~ '^[A-Za-z0-9_-]+$'
                   AND length(custom_id) <= 64),
    state        text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'accepted',
                   'not_accepted', 'failed', 'released')),
    error        text,
    ended_at     timestamptz,
    PRIMARY KEY (batch_id, run_id)
);
CREATE INDEX batch_items_run ON {schema}.batch_items (run_id);
CREATE INDEX batches_job ON {schema}.batches (job_name, created_at);

-- Every provider batch found for an intent: the one adopted, and any duplicate (a second
-- create the provider accepted for the same intent), cancelled before its results are used.
CREATE TABLE {schema}.batch_submissions (
    batch_id           text NOT NULL REFERENCES {schema}.batches ON DELETE CASCADE,
    provider_batch_id  text NOT NULL,
    role               text NOT NULL CHECK (role IN ('adopted', 'duplicate')),
    found_at           timestamptz NOT NULL DEFAULT now(),
    how                text NOT NULL,
    cancelled_at       timestamptz,
    PRIMARY KEY (batch_id, provider_batch_id)
);
