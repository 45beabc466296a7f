--
-- queue: the companion extension ratebucket_queue, installed into a schema
-- chosen at CREATE EXTENSION: CASCADE brings ratebucket; every function
-- works whatever the caller's search_path; the queue's rows are the user's
-- data (pg_dump dumps them); the extension drops cleanly.  Its claim's
-- properties are proven by test/t/007_claim.pl and 012_claim_limits.pl.
--

-- Set-up: a fresh install, whatever an earlier test left behind.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket_queue;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS outbox CASCADE;
RESET client_min_messages;

-- Without ratebucket, CASCADE creates it.
CREATE SCHEMA outbox;
CREATE EXTENSION ratebucket_queue SCHEMA outbox CASCADE;
SELECT e.extname, e.extversion, n.nspname AS schema
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname LIKE 'ratebucket%' ORDER BY e.extname;
-- Its objects, all in the chosen schema.
SELECT pg_describe_object(d.classid, d.objid, 0) AS object
FROM pg_depend d
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'ratebucket_queue')
ORDER BY 1;
-- What pg_dump dumps with the extension: the queue, its id sequence, the
-- parking cursors.
SELECT c::regclass AS dumped
FROM pg_extension e, unnest(e.extconfig) AS c
WHERE e.extname = 'ratebucket_queue' ORDER BY 1;
-- The extension's schema cannot be moved (its functions name it).
ALTER EXTENSION ratebucket_queue SET SCHEMA public;

-- A whole round with the caller's search_path holding neither schema:
-- configure, enqueue, claim, deliver, record.
SET search_path = pg_catalog;
SELECT ratebucket.bucket_configure('https://a.example/hook', 5, 2);
INSERT INTO outbox.webhook_events (endpoint, payload)
SELECT 'https://a.example/hook', jsonb_build_object('n', n) FROM generate_series(1, 3) n;
SELECT outbox.events_left();
SELECT endpoint, payload FROM outbox.claim_events(10, 10) ORDER BY id;
-- two tokens, two claimed; the third waits for the next token, 0.2 s away
SELECT status, next_attempt_at > now() AS in_the_future, count(*)
FROM outbox.webhook_events GROUP BY 1, 2 ORDER BY 1, 2;
SELECT outbox.next_due() BETWEEN 0 AND 0.21 AS next_due_within_a_token;
SELECT outbox.record_delivery(id, 200, NULL, NULL, true, claimed_lease => lease_until)
FROM outbox.webhook_events WHERE status = 'sending' ORDER BY id;
SELECT status, attempts, last_status FROM outbox.webhook_events ORDER BY id;
SELECT outbox.events_left(), outbox.requeue_expired();
RESET search_path;

-- ratebucket cannot go while the queue needs it.
DROP EXTENSION ratebucket;

-- Clean-up: nothing of this test is left behind.
DROP EXTENSION ratebucket_queue;
SELECT count(*) AS left_in_outbox FROM pg_class WHERE relnamespace = 'outbox'::regnamespace;
DROP SCHEMA outbox;
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
