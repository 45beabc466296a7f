--
-- queue_endpoint: the queue endpoint by endpoint (ratebucket_queue 1.3):
-- due_endpoints lists the endpoints with work, claim_endpoint claims one
-- endpoint's events and record_endpoint records their outcomes.  Each
-- statement of theirs touches one endpoint's rows, which is what lets a
-- distributed queue run them on the endpoint's node (doc/citus.md); here,
-- on one node, their decisions: tokens and slots spent only on the events
-- returned, the refused put off, the unclaimable set aside, the expired
-- given back, every bad argument refused with nothing changed.
-- Concurrent claims of one endpoint: test/isolation/specs/claim-endpoint.spec.
--

SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket_queue;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS qe CASCADE;
RESET client_min_messages;
CREATE SCHEMA qe;
CREATE EXTENSION ratebucket_queue SCHEMA qe CASCADE;
SET search_path = pg_catalog;

-- Rates so low that nothing refills while this test runs.
SELECT ratebucket.bucket_configure('e:a', 0.000001, 3);
SELECT ratebucket.bucket_configure('e:b', 0.000001, 10);
SELECT ratebucket.bucket_configure('e:c', 0.000001, 10);
SELECT ratebucket.bucket_configure('acct', 0.000001, 2);
SELECT ratebucket.inflight_configure('cap', 1);
INSERT INTO qe.webhook_events (endpoint, payload, next_attempt_at)
SELECT 'e:a', jsonb_build_object('n', n), now() - interval '1 minute' + n * interval '1 s'
FROM generate_series(1, 5) n;
INSERT INTO qe.webhook_events (endpoint, priority, next_attempt_at)
VALUES ('e:b', 5, now() - interval '10 s'),          -- the highest priority
       ('e:unset', 0, now() - interval '2 minutes'),  -- the longest due
       ('e:b', 0, now() + interval '1 hour');         -- not due

-- due_endpoints: the highest priority first, then the longest due.
SELECT endpoint, due, expired FROM qe.due_endpoints();
SELECT endpoint FROM qe.due_endpoints(1);

-- Bad arguments: each refused, nothing changed.
CREATE TEMP TABLE before_errors AS SELECT * FROM qe.webhook_events;
SELECT * FROM qe.claim_endpoint(NULL);
SELECT * FROM qe.claim_endpoint('e:a', 0);
SELECT * FROM qe.claim_endpoint('e:a', 3, '0 s');
SELECT * FROM qe.claim_endpoint('e:a', 3, cap_wait => -1);
SELECT * FROM qe.claim_endpoint('e:a', 3, unclaimable_wait => 'NaN');
SELECT * FROM qe.record_endpoint(NULL, '{1}', '{200}', '{NULL}');
SELECT * FROM qe.record_endpoint('e:a', '{1,NULL}', '{200,200}', '{NULL,NULL}');
SELECT * FROM qe.record_endpoint('e:a', '{1,2}', '{200}', '{NULL,NULL}');
SELECT * FROM qe.record_endpoint('e:a', '{1,1}', '{200,200}', '{NULL,NULL}');
SELECT * FROM qe.record_endpoint('e:a', '{1}', '{200}', '{NULL}', max_attempts => 0);
SELECT * FROM qe.record_endpoint('e:a', '{1,2}', '{200,200}', ARRAY[now(), NULL]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) AS changed FROM (SELECT * FROM qe.webhook_events
                                 EXCEPT SELECT * FROM before_errors) c;
SELECT tokens_granted AS granted_so_far FROM ratebucket.buckets WHERE endpoint = 'e:a';

-- A claim of e:a: 3 tokens, 3 of its 5 due events, in queue order; exactly
-- 3 tokens spent.  The other 2 were not locked, and stay due.
SELECT id, endpoint, attempts, payload, lease_until > now() AS leased
FROM qe.claim_endpoint('e:a', 10) ORDER BY id;
SELECT tokens_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.buckets WHERE endpoint = 'e:a';
SELECT id, status, next_attempt_at <= now() AS due FROM qe.webhook_events
WHERE endpoint = 'e:a' ORDER BY id;
-- No token left: nothing claimed, nothing spent, and the first max_events
-- due events are put off until the next token (a million seconds away),
-- parked.
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:a', 1);
SELECT id, status, parked, next_attempt_at > now() + interval '10 days' AS put_off
FROM qe.webhook_events WHERE endpoint = 'e:a' AND status = 'pending' ORDER BY id;
SELECT tokens_granted FROM ratebucket.buckets WHERE endpoint = 'e:a';

-- A rollback gives the tokens back, and the events.
BEGIN;
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:b', 10);
SELECT count(*) AS claimed_again FROM qe.claim_endpoint('e:b', 10);
ROLLBACK;
SELECT tokens_granted FROM ratebucket.buckets WHERE endpoint = 'e:b';
SELECT count(*) FILTER (WHERE status = 'sending') AS sending FROM qe.webhook_events
WHERE endpoint = 'e:b';

-- An endpoint without a configuration (nor a template): nothing claimed,
-- its due events set aside for unclaimable_wait, so that due_endpoints
-- lists what can go.
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:unset', 10, unclaimable_wait => 60);
SELECT status, parked, next_attempt_at BETWEEN now() + interval '59 s' AND now() + interval '61 s'
       AS set_aside
FROM qe.webhook_events WHERE endpoint = 'e:unset';
SELECT endpoint FROM qe.due_endpoints();
-- The same when only the endpoint lacks one and its events' limit has one:
-- nothing taken from the limit, no error.
INSERT INTO qe.webhook_events (endpoint, limits) VALUES ('x:unset', ARRAY['acct']);
SELECT count(*) AS claimed FROM qe.claim_endpoint('x:unset', 10, unclaimable_wait => 600);
SELECT next_attempt_at > now() + interval '599 s' AS set_aside FROM qe.webhook_events
WHERE endpoint = 'x:unset';
SELECT tokens_granted FROM ratebucket.buckets WHERE endpoint = 'acct';
-- A template that matches it configures it at its next claim.
SELECT ratebucket.bucket_template('e:*', 0.000001, 4);
UPDATE qe.webhook_events SET next_attempt_at = now() - interval '1 s' WHERE endpoint = 'e:unset';
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:unset', 10);
SELECT template, tokens_granted FROM ratebucket.buckets WHERE endpoint = 'e:unset';

-- Limits and a cap: the head's events (those with its limits and cap) are
-- claimed, as many as the endpoint, every limit and the cap allow (the cap:
-- 1), each holding a slot; every bucket taken from once per event.
INSERT INTO qe.webhook_events (endpoint, limits, inflight_key, next_attempt_at)
SELECT 'e:c', ARRAY['acct'], 'cap', now() - interval '1 hour' FROM generate_series(1, 3);
INSERT INTO qe.webhook_events (endpoint, next_attempt_at)   -- behind the head, without them
VALUES ('e:c', now() - interval '1 minute');
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:c', 10);
SELECT count(*) AS sending, count(slot) AS with_slot, min(inflight_key) AS cap
FROM qe.webhook_events WHERE endpoint = 'e:c' AND status = 'sending';
SELECT endpoint, tokens_granted FROM ratebucket.buckets
WHERE endpoint IN ('e:c', 'acct') ORDER BY 1;
SELECT key, in_flight FROM ratebucket.inflight_status;
-- The cap is full: the head's events are put off by cap_wait.
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:c', 10, cap_wait => 30);
SELECT count(*) AS put_off_by_cap_wait FROM qe.webhook_events
WHERE endpoint = 'e:c' AND inflight_key = 'cap' AND status = 'pending'
  AND next_attempt_at BETWEEN now() + interval '29 s' AND now() + interval '31 s';

-- record_endpoint: each outcome as record_deliveries decides it; the slot
-- freed; a lease that is not the claim's is stale; an id of another
-- endpoint, or none, is missing.
CREATE TEMP TABLE claimed_a AS
SELECT id, lease_until FROM qe.webhook_events WHERE endpoint = 'e:a' AND status = 'sending';
SELECT r.event_id, r.outcome
FROM qe.record_endpoint('e:a',
         (SELECT array_agg(id ORDER BY id) FROM claimed_a) || ARRAY[999999::bigint],
         ARRAY[200, 429, 404, 200],
         (SELECT array_agg(lease_until ORDER BY id) FROM claimed_a) || ARRAY[now()],
         retry_afters => ARRAY[NULL, '120', NULL, NULL]) AS r;
SELECT e.status, e.attempts, e.last_status, e.parked,
       e.next_attempt_at > now() + interval '100 s' AS after_the_cooldown
FROM qe.webhook_events e JOIN claimed_a USING (id) ORDER BY e.id;
SELECT throttles, successes FROM ratebucket.buckets WHERE endpoint = 'e:a';
-- e:c's capped event: stale with another lease (nothing changes, the answer
-- is still observed), then recorded with its own, its slot freed.
SELECT r.outcome FROM qe.webhook_events e,
     qe.record_endpoint('e:c', ARRAY[e.id], ARRAY[200], ARRAY[e.lease_until - interval '1 s']) r
WHERE e.endpoint = 'e:c' AND e.status = 'sending';
SELECT count(*) AS still_sending FROM qe.webhook_events WHERE endpoint = 'e:c' AND status = 'sending';
SELECT r.outcome FROM qe.webhook_events e,
     qe.record_endpoint('e:c', ARRAY[e.id], ARRAY[200], ARRAY[e.lease_until]) r
WHERE e.endpoint = 'e:c' AND e.status = 'sending';
SELECT key, in_flight FROM ratebucket.inflight_status;
SELECT successes FROM ratebucket.buckets WHERE endpoint = 'e:c';
-- An event of e:c recorded as one of e:a's: missing, nothing recorded.
SELECT r.outcome FROM qe.webhook_events e,
     qe.record_endpoint('e:a', ARRAY[e.id], ARRAY[200], ARRAY[now()]) r
WHERE e.endpoint = 'e:c' AND e.status = 'pending' AND e.inflight_key IS NULL;

-- A lease that ran out: the next claim of its endpoint gives the event
-- back (its slot freed, the attempt not counted) and may claim it again.
SELECT ratebucket.bucket_reset('e:b');
SELECT count(*) AS claimed FROM qe.claim_endpoint('e:b', 1, lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT endpoint, expired FROM qe.due_endpoints() WHERE expired > 0;
SELECT id = (SELECT id FROM qe.webhook_events WHERE endpoint = 'e:b' AND status = 'sending')
       AS the_same_event, attempts
FROM qe.claim_endpoint('e:b', 1);
SELECT count(*) FILTER (WHERE status = 'sending') AS sending FROM qe.webhook_events
WHERE endpoint = 'e:b';

-- A striped endpoint comes without limits: with them, its events are left
-- alone (as claim_events leaves them).
SELECT ratebucket.bucket_configure('e:hot', 0.000001, 8);
SELECT ratebucket.bucket_stripe('e:hot', 2);
INSERT INTO qe.webhook_events (endpoint, limits, next_attempt_at)
VALUES ('e:hot', ARRAY['acct'], now() - interval '2 s'), ('e:hot', '{}', now() - interval '1 s');
SELECT count(*) AS claimed_with_limits FROM qe.claim_endpoint('e:hot', 10);
UPDATE qe.webhook_events SET next_attempt_at = now() - interval '1 s'
WHERE endpoint = 'e:hot' AND limits = '{}';
UPDATE qe.webhook_events SET next_attempt_at = now() + interval '1 hour'
WHERE endpoint = 'e:hot' AND limits <> '{}';
SELECT count(*) AS claimed_alone FROM qe.claim_endpoint('e:hot', 10);

-- distribute_queue needs Citus.
SELECT * FROM qe.distribute_queue();

RESET search_path;
SET client_min_messages = warning;
DROP EXTENSION ratebucket_queue;
DROP EXTENSION ratebucket CASCADE;
DROP SCHEMA qe CASCADE;
RESET client_min_messages;
