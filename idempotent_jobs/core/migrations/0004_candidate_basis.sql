-- change: additive
-- Revisions and candidates. A candidate answer is accepted only on the revision and raw-input
-- checkpoint it was computed against: the checkpoint's fingerprint (sha256 of its canonical JSON)
-- is kept beside it. Each accepted result records the configuration it was computed under
-- (a fingerprint and its parts: prompt, model, validator), so drift is visible.
-- Checkpoints stored before this migration have no fingerprint; candidates on them are bound by
-- revision alone.

ALTER TABLE {schema}.runs
    ADD COLUMN input_fingerprint  text,
    ADD COLUMN config_fingerprint text,
    ADD COLUMN config_parts       jsonb;

-- `<run_id>:<channel>[:r<revision>]` is the idempotency key: a `:` in a channel name could
-- produce another channel's key. New rows only (NOT VALID); the ledger refuses such names first.
ALTER TABLE {schema}.notification_outbox
    ADD CONSTRAINT notification_outbox_channel_check CHECK (position(':' in channel) = 0) NOT VALID;
