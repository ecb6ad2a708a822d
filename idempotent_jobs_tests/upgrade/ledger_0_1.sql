--
-- PostgreSQL database dump
--



-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: idempotent_jobs; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA idempotent_jobs;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: run_attempts; Type: TABLE; Schema: idempotent_jobs; Owner: -
--

CREATE TABLE idempotent_jobs.run_attempts (
    run_id text NOT NULL,
    lease_epoch bigint NOT NULL,
    worker_id text NOT NULL,
    dagster_run_id text,
    step_key text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    ended_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    error text,
    model_name text,
    input_tokens integer,
    output_tokens integer,
    CONSTRAINT run_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['completed'::text, 'failed'::text, 'lease_lost'::text, 'superseded'::text])))
);


--
-- Name: runs; Type: TABLE; Schema: idempotent_jobs; Owner: -
--

CREATE TABLE idempotent_jobs.runs (
    run_id text NOT NULL,
    job_name text NOT NULL,
    subject_id text NOT NULL,
    scheduled_at timestamp with time zone NOT NULL,
    version text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    raw_input jsonb,
    output jsonb,
    lock_owner text,
    lock_expires_at timestamp with time zone,
    lease_epoch bigint DEFAULT 0 NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    completed_at timestamp with time zone,
    revision integer DEFAULT 0 NOT NULL,
    lease_started_at timestamp with time zone,
    lease_dagster_run_id text,
    lease_step_key text,
    CONSTRAINT runs_completed_check CHECK (((status <> 'completed'::text) OR ((output IS NOT NULL) AND (completed_at IS NOT NULL) AND (lock_owner IS NULL)))),
    CONSTRAINT runs_lock_check CHECK (((lock_owner IS NULL) = (lock_expires_at IS NULL))),
    CONSTRAINT runs_run_id_check CHECK ((run_id ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'completed'::text, 'failed'::text])))
)
WITH (fillfactor='80');


--
-- Name: attempts; Type: VIEW; Schema: idempotent_jobs; Owner: -
--

CREATE VIEW idempotent_jobs.attempts AS
 SELECT run_attempts.run_id,
    run_attempts.lease_epoch,
    run_attempts.worker_id,
    run_attempts.dagster_run_id,
    run_attempts.step_key,
    run_attempts.started_at,
    run_attempts.ended_at,
    run_attempts.outcome,
    run_attempts.error,
    run_attempts.model_name,
    run_attempts.input_tokens,
    run_attempts.output_tokens
   FROM idempotent_jobs.run_attempts
UNION ALL
 SELECT runs.run_id,
    runs.lease_epoch,
    runs.lock_owner AS worker_id,
    runs.lease_dagster_run_id AS dagster_run_id,
    runs.lease_step_key AS step_key,
    COALESCE(runs.lease_started_at, runs.updated_at) AS started_at,
    NULL::timestamp with time zone AS ended_at,
    NULL::text AS outcome,
    NULL::text AS error,
    NULL::text AS model_name,
    NULL::integer AS input_tokens,
    NULL::integer AS output_tokens
   FROM idempotent_jobs.runs
  WHERE (runs.status = 'running'::text);


--
-- Name: notification_outbox; Type: TABLE; Schema: idempotent_jobs; Owner: -
--

CREATE TABLE idempotent_jobs.notification_outbox (
    run_id text NOT NULL,
    channel text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    delivered_at timestamp with time zone,
    delivery_attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    revision integer DEFAULT 0 NOT NULL
);


--
-- Name: run_revisions; Type: TABLE; Schema: idempotent_jobs; Owner: -
--

CREATE TABLE idempotent_jobs.run_revisions (
    run_id text NOT NULL,
    revision integer NOT NULL,
    reason text NOT NULL,
    channels text[] DEFAULT '{}'::text[] NOT NULL,
    previous_output jsonb NOT NULL,
    previous_completed_at timestamp with time zone NOT NULL,
    previous_epoch bigint NOT NULL,
    recollect boolean DEFAULT false NOT NULL,
    requested_by text,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT run_revisions_reason_check CHECK ((length(btrim(reason)) > 0)),
    CONSTRAINT run_revisions_revision_check CHECK ((revision > 0))
);


--
-- Name: schema_migrations; Type: TABLE; Schema: idempotent_jobs; Owner: -
--

CREATE TABLE idempotent_jobs.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Data for Name: notification_outbox; Type: TABLE DATA; Schema: idempotent_jobs; Owner: -
--

INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at, delivered_at, delivery_attempts, last_error, revision) VALUES ('1dfa687580c70c51c954732ed7ad6edd5b875e190633da85cf9bbbd412e19ef4', 'audit', '{"seen": true}', '2026-12-04 00:34:26.871253+00', '2026-12-04 00:34:26.907289+00', 1, NULL, 0);
INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at, delivered_at, delivery_attempts, last_error, revision) VALUES ('1dfa687580c70c51c954732ed7ad6edd5b875e190633da85cf9bbbd412e19ef4', 'webhook', '{"summary": "nfd summary"}', '2026-12-04 00:34:26.871253+00', NULL, 1, 'ConnectionError: receiver down', 0);
INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at, delivered_at, delivery_attempts, last_error, revision) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 'webhook', '{"summary": "first answer"}', '2026-12-04 00:34:26.896574+00', '2026-12-04 00:34:26.911104+00', 1, NULL, 0);
INSERT INTO idempotent_jobs.notification_outbox (run_id, channel, payload, created_at, delivered_at, delivery_attempts, last_error, revision) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 'webhook', '{"summary": "second answer"}', '2026-12-04 00:34:26.901532+00', NULL, 1, 'ConnectionError: receiver down', 1);


--
-- Data for Name: run_attempts; Type: TABLE DATA; Schema: idempotent_jobs; Owner: -
--

INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('1dfa687580c70c51c954732ed7ad6edd5b875e190633da85cf9bbbd412e19ef4', 1, 'release-0.1-worker:nfd', NULL, NULL, '2026-12-04 00:34:26.865951+00', '2026-12-04 00:34:26.871253+00', 'completed', NULL, 'gpt-0.1', 120, 30);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('9f7f0707a4e7cb833e6b0f637debf6e0ab8adf24f627af0b17aec960f61dc3d4', 1, 'release-0.1-worker:twin_nfc', NULL, NULL, '2026-12-04 00:34:26.873839+00', '2026-12-04 00:34:26.876816+00', 'completed', NULL, 'gpt-0.1', 120, 30);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('019a31393ef8a1e16a4c63d7552c95274764d115513d734d4c0c7ef26429f302', 1, 'release-0.1-worker:twin_nfd', NULL, NULL, '2026-12-04 00:34:26.878566+00', '2026-12-04 00:34:26.882308+00', 'completed', NULL, 'gpt-0.1', 120, 30);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('2e2e22b522bf9580ebb4fefc3da75688b5196903a2cda5b8875ca5cc273a7ec3', 1, 'release-0.1-worker:deep', NULL, NULL, '2026-12-04 00:34:26.883897+00', '2026-12-04 00:34:26.888875+00', 'completed', NULL, NULL, NULL, NULL);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 1, 'release-0.1-worker:revised', NULL, NULL, '2026-12-04 00:34:26.89424+00', '2026-12-04 00:34:26.896574+00', 'completed', NULL, 'gpt-0.1', 120, 30);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 2, 'release-0.1-worker:revised', NULL, NULL, '2026-12-04 00:34:26.900122+00', '2026-12-04 00:34:26.901532+00', 'completed', NULL, 'gpt-0.1', 120, 30);
INSERT INTO idempotent_jobs.run_attempts (run_id, lease_epoch, worker_id, dagster_run_id, step_key, started_at, ended_at, outcome, error, model_name, input_tokens, output_tokens) VALUES ('108dfd375e99fa8a3f47f10acfa9da02a98c3242f4744a80e9c63b60a0f6f24f', 1, 'release-0.1-worker:failed', NULL, NULL, '2026-12-04 00:34:26.902848+00', '2026-12-04 00:34:26.904991+00', 'failed', 'RuntimeError: model timed out', NULL, NULL, NULL);


--
-- Data for Name: run_revisions; Type: TABLE DATA; Schema: idempotent_jobs; Owner: -
--

INSERT INTO idempotent_jobs.run_revisions (run_id, revision, reason, channels, previous_output, previous_completed_at, previous_epoch, recollect, requested_by, requested_at) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 1, 'prompt fixed', '{webhook}', '{"summary": "first answer"}', '2026-12-04 00:34:26.896574+00', 1, false, 'operator', '2026-12-04 00:34:26.898518+00');


--
-- Data for Name: runs; Type: TABLE DATA; Schema: idempotent_jobs; Owner: -
--

INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('1dfa687580c70c51c954732ed7ad6edd5b875e190633da85cf9bbbd412e19ef4', 'weekly-digest', 'Société Générale', '2026-11-02 00:00:00+00', 'v1', 'completed', '{"items": [1, 2, 3], "subject": "Société Générale"}', '{"summary": "nfd summary"}', NULL, NULL, 1, 1, NULL, '2026-12-04 00:34:26.865951+00', '2026-12-04 00:34:26.871253+00', '2026-12-04 00:34:26.871253+00', 0, '2026-12-04 00:34:26.865951+00', NULL, NULL);
INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('9f7f0707a4e7cb833e6b0f637debf6e0ab8adf24f627af0b17aec960f61dc3d4', 'weekly-digest', 'Zoë', '2026-11-02 00:00:00+00', 'v1', 'completed', '{"items": [1, 2, 3], "subject": "Zoë"}', '{"summary": "nfc twin"}', NULL, NULL, 1, 1, NULL, '2026-12-04 00:34:26.873839+00', '2026-12-04 00:34:26.876816+00', '2026-12-04 00:34:26.876816+00', 0, '2026-12-04 00:34:26.873839+00', NULL, NULL);
INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('019a31393ef8a1e16a4c63d7552c95274764d115513d734d4c0c7ef26429f302', 'weekly-digest', 'Zoë', '2026-11-02 00:00:00+00', 'v1', 'completed', '{"items": [1, 2, 3], "subject": "Zoë"}', '{"summary": "nfd twin"}', NULL, NULL, 1, 1, NULL, '2026-12-04 00:34:26.878566+00', '2026-12-04 00:34:26.882308+00', '2026-12-04 00:34:26.882308+00', 0, '2026-12-04 00:34:26.878566+00', NULL, NULL);
INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('2e2e22b522bf9580ebb4fefc3da75688b5196903a2cda5b8875ca5cc273a7ec3', 'weekly-digest', 'deep-output', '2026-11-02 00:00:00+00', 'v1', 'completed', '{"items": [1, 2, 3], "subject": "deep-output"}', '{"tree": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["bottom"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}', NULL, NULL, 1, 1, NULL, '2026-12-04 00:34:26.883897+00', '2026-12-04 00:34:26.888875+00', '2026-12-04 00:34:26.888875+00', 0, '2026-12-04 00:34:26.883897+00', NULL, NULL);
INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('8740e326aa7df67896529f8483d8201e644a1eafc4a242bf8c17b7d732ce8d0c', 'weekly-digest', 'Globex', '2026-11-02 00:00:00+00', 'v1', 'completed', '{"items": [1, 2, 3], "subject": "Globex"}', '{"summary": "second answer"}', NULL, NULL, 2, 2, NULL, '2026-12-04 00:34:26.89424+00', '2026-12-04 00:34:26.901532+00', '2026-12-04 00:34:26.901532+00', 1, '2026-12-04 00:34:26.900122+00', NULL, NULL);
INSERT INTO idempotent_jobs.runs (run_id, job_name, subject_id, scheduled_at, version, status, raw_input, output, lock_owner, lock_expires_at, lease_epoch, attempts, last_error, created_at, updated_at, completed_at, revision, lease_started_at, lease_dagster_run_id, lease_step_key) VALUES ('108dfd375e99fa8a3f47f10acfa9da02a98c3242f4744a80e9c63b60a0f6f24f', 'weekly-digest', 'Initech', '2026-11-02 00:00:00+00', 'v1', 'failed', '{"items": [1, 2, 3], "subject": "Initech"}', NULL, NULL, NULL, 1, 1, 'RuntimeError: model timed out', '2026-12-04 00:34:26.902848+00', '2026-12-04 00:34:26.904991+00', NULL, 0, '2026-12-04 00:34:26.902848+00', NULL, NULL);


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: idempotent_jobs; Owner: -
--

INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum, applied_at) VALUES (1, 'initial', '68a397cfad7a07265148a474b4d268863c5f07c98cd0d1f62327826c25860e8a', '2026-12-04 00:34:26.81708+00');
INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum, applied_at) VALUES (2, 'revisions', 'ce4216e25f7b1372db95f15a89b939600274f614d729361cbbc3663bff3c1819', '2026-12-04 00:34:26.8328+00');
INSERT INTO idempotent_jobs.schema_migrations (version, name, checksum, applied_at) VALUES (3, 'lean_claims', '567b6ec46e9f10e573ffb3ef48d0e875ddac4035f6d5fe3ba645f83c4f731b8f', '2026-12-04 00:34:26.843451+00');


--
-- Name: notification_outbox notification_outbox_pkey; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.notification_outbox
    ADD CONSTRAINT notification_outbox_pkey PRIMARY KEY (run_id, channel, revision);


--
-- Name: run_attempts run_attempts_pkey; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.run_attempts
    ADD CONSTRAINT run_attempts_pkey PRIMARY KEY (run_id, lease_epoch);


--
-- Name: run_revisions run_revisions_pkey; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.run_revisions
    ADD CONSTRAINT run_revisions_pkey PRIMARY KEY (run_id, revision);


--
-- Name: runs runs_identity_key; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.runs
    ADD CONSTRAINT runs_identity_key UNIQUE (job_name, subject_id, scheduled_at, version);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: notification_outbox_pending_idx; Type: INDEX; Schema: idempotent_jobs; Owner: -
--

CREATE INDEX notification_outbox_pending_idx ON idempotent_jobs.notification_outbox USING btree (created_at) WHERE (delivered_at IS NULL);


--
-- Name: runs_job_window_idx; Type: INDEX; Schema: idempotent_jobs; Owner: -
--

CREATE INDEX runs_job_window_idx ON idempotent_jobs.runs USING btree (job_name, scheduled_at);


--
-- Name: notification_outbox notification_outbox_run_id_fkey; Type: FK CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.notification_outbox
    ADD CONSTRAINT notification_outbox_run_id_fkey FOREIGN KEY (run_id) REFERENCES idempotent_jobs.runs(run_id) ON DELETE CASCADE;


--
-- Name: run_attempts run_attempts_run_id_fkey; Type: FK CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.run_attempts
    ADD CONSTRAINT run_attempts_run_id_fkey FOREIGN KEY (run_id) REFERENCES idempotent_jobs.runs(run_id) ON DELETE CASCADE;


--
-- Name: run_revisions run_revisions_run_id_fkey; Type: FK CONSTRAINT; Schema: idempotent_jobs; Owner: -
--

ALTER TABLE ONLY idempotent_jobs.run_revisions
    ADD CONSTRAINT run_revisions_run_id_fkey FOREIGN KEY (run_id) REFERENCES idempotent_jobs.runs(run_id) ON DELETE CASCADE;


--
-- Name: SCHEMA idempotent_jobs; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA idempotent_jobs TO ij_release_0_1_worker;


--
-- Name: TABLE run_attempts; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.run_attempts TO ij_release_0_1_worker;


--
-- Name: TABLE runs; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.runs TO ij_release_0_1_worker;


--
-- Name: TABLE attempts; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.attempts TO ij_release_0_1_worker;


--
-- Name: TABLE notification_outbox; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.notification_outbox TO ij_release_0_1_worker;


--
-- Name: TABLE run_revisions; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.run_revisions TO ij_release_0_1_worker;


--
-- Name: TABLE schema_migrations; Type: ACL; Schema: idempotent_jobs; Owner: -
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE idempotent_jobs.schema_migrations TO ij_release_0_1_worker;


--
-- PostgreSQL database dump complete
--



