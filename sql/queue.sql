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
  -- not the row types of its tables and views, nor array types, which
  -- PostgreSQL 18 records as members too
  AND NOT EXISTS (SELECT FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
                  WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                    AND (c.relkind <> 'c' OR EXISTS (SELECT FROM pg_type e WHERE e.typarray = t.oid)))
ORDER BY 1;
-- Every table, view and function a user calls is described.
SELECT c.relname AS undescribed FROM pg_class c
WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'v')
  AND obj_description(c.oid, 'pg_class') IS NULL
UNION ALL
SELECT p.proname FROM pg_proc p
WHERE p.pronamespace = 'outbox'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL
  AND p.proname NOT IN ('claim_bucket_info', 'claim_cap_free', 'explain_keys', 'next_look',
                        'recheck_parked', 'repace_parked', 'retry_backoff',
                        'webhook_events_notify')
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

-- record_deliveries: a whole batch in one call, given in any order, each
-- event as record_delivery records it: delivered (2xx), pending again after
-- the cooldown (429) or a backoff (500), failed (404), not counted when it
-- never left, stale when the lease is no longer this claim's, missing when
-- deleted; its in-flight slot freed; the outcomes in the order given.
TRUNCATE outbox.webhook_events;
SELECT ratebucket.bucket_configure('r:a', 100, 10), ratebucket.bucket_configure('r:b', 100, 10),
       ratebucket.inflight_configure('r:cap', 10);
-- r:a: 2, 4, 6; r:b: 1, 3, 5, 7, each holding a slot of r:cap
INSERT INTO outbox.webhook_events (id, endpoint, inflight_key)
SELECT n, CASE WHEN n % 2 = 0 THEN 'r:a' ELSE 'r:b' END, CASE WHEN n % 2 = 1 THEN 'r:cap' END
FROM generate_series(1, 7) n;
SELECT count(*) AS claimed FROM outbox.claim_events(80, 10);
CREATE TEMP TABLE claimed AS SELECT id, lease_until FROM outbox.webhook_events;
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'r:cap';
-- 7 deleted; 6 requeued and claimed again by another worker (a new lease)
DELETE FROM outbox.webhook_events WHERE id = 7;
UPDATE outbox.webhook_events SET lease_until = lease_until + interval '1 s' WHERE id = 6;
SELECT r.event_id, r.outcome
FROM outbox.record_deliveries(
         ARRAY[5, 1, 7, 3, 2, 6, 4],
         ARRAY[500, 200, 200, 429, 404, 200, NULL],
         (SELECT array_agg(c.lease_until ORDER BY k.o)
          FROM unnest(ARRAY[5, 1, 7, 3, 2, 6, 4]::bigint[]) WITH ORDINALITY k(id, o)
          JOIN pg_temp.claimed c ON c.id = k.id),
         retry_afters => ARRAY[NULL, NULL, NULL, '30', NULL, NULL, NULL],
         sent => ARRAY[true, true, true, true, true, true, false]) r;
SELECT id, status, attempts, last_status, parked, next_attempt_at > now() AS later,
       CASE WHEN id = 3 THEN round(extract(epoch FROM next_attempt_at - now())) END AS cooldown_s
FROM outbox.webhook_events ORDER BY id;
-- the slots of 1, 3 and 5 freed; 7's is held until its lease ends
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'r:cap';
-- Bad batches change nothing.
SELECT * FROM outbox.record_deliveries(ARRAY[1, 1], ARRAY[200, 200], ARRAY[NULL, NULL]::timestamptz[]);
SELECT * FROM outbox.record_deliveries(ARRAY[1, 2], ARRAY[200], ARRAY[NULL, NULL]::timestamptz[]);
SELECT * FROM outbox.record_deliveries(ARRAY[1, NULL], ARRAY[200, 200], ARRAY[NULL, NULL]::timestamptz[]);
SELECT * FROM outbox.record_deliveries(ARRAY[6], ARRAY[200], ARRAY[NULL]::timestamptz[], max_attempts => 0);
\set VERBOSITY terse
SELECT outbox.record_delivery(6, 200, max_attempts => 0);
\set VERBOSITY default
SELECT * FROM outbox.record_deliveries('{}', '{}', '{}');
SELECT status, count(*) FROM outbox.webhook_events GROUP BY 1 ORDER BY 1;

-- A NULL lease is refused (22004), nothing changed: it would match the
-- lease of whichever claim holds the event now.  Event 8, holding a slot of
-- r:cap: claimed, its lease run out, given back and claimed again by another
-- worker.  The first worker's late outcome, recorded without a lease, would
-- be taken for the second worker's: its event delivered, its slot freed.
SELECT ratebucket.bucket_configure('r:c', 100, 10);
INSERT INTO outbox.webhook_events (id, endpoint, inflight_key) VALUES (8, 'r:c', 'r:cap');
SELECT count(*) AS claimed FROM outbox.claim_endpoint('r:c', 1, lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed_again FROM outbox.claim_endpoint('r:c', 1);
CREATE TEMP TABLE events_before AS SELECT * FROM outbox.webhook_events;
CREATE TEMP TABLE parking_before AS SELECT * FROM outbox.webhook_parking;
CREATE TEMP TABLE bucket_before AS SELECT * FROM ratebucket.buckets WHERE endpoint = 'r:c';
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'r:cap';
SELECT * FROM outbox.record_deliveries(ARRAY[8], ARRAY[200], ARRAY[NULL]::timestamptz[]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM outbox.record_deliveries(ARRAY[8, 6], ARRAY[200, 200],
                                       ARRAY[(SELECT lease_until FROM outbox.webhook_events
                                              WHERE id = 8), NULL]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM outbox.record_endpoint('r:c', ARRAY[8], ARRAY[200], ARRAY[NULL]::timestamptz[]);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT (SELECT count(*) FROM (SELECT * FROM outbox.webhook_events
                              EXCEPT SELECT * FROM pg_temp.events_before) c) AS events_changed,
       (SELECT count(*) FROM (SELECT * FROM outbox.webhook_parking
                              EXCEPT SELECT * FROM pg_temp.parking_before) c) AS parking_changed,
       (SELECT count(*) FROM (SELECT * FROM ratebucket.buckets WHERE endpoint = 'r:c'
                              EXCEPT SELECT * FROM pg_temp.bucket_before) c) AS bucket_changed;
SELECT status, in_flight FROM outbox.webhook_events, ratebucket.inflight_status
WHERE id = 8 AND key = 'r:cap';
-- The second worker's outcome, with its lease: recorded, its slot freed.
SELECT r.outcome FROM outbox.webhook_events e,
     outbox.record_deliveries(ARRAY[e.id], ARRAY[200], ARRAY[e.lease_until]) r
WHERE e.id = 8;
SELECT status, in_flight FROM outbox.webhook_events, ratebucket.inflight_status
WHERE id = 8 AND key = 'r:cap';

-- Why is this event waiting?  One event held by each thing that can hold
-- one, and what explain_event says of it.
SELECT ratebucket.bucket_configure(k, 100, 10)
FROM unnest(ARRAY['x:due', 'x:cool', 'x:paused']) k;
SELECT ratebucket.bucket_configure('x:empty', 0.0001, 1);
SELECT ratebucket.bucket_configure('x:broken', 100, 10, breaker_failures => 1);
SELECT ratebucket.bucket_configure_quota('x:quota', 1, 'day');
SELECT ratebucket.inflight_configure('cap:one', 1);
SELECT (ratebucket.bucket_take('x:empty')).allowed, (ratebucket.bucket_take('x:quota')).allowed;
SELECT (ratebucket.bucket_observe('x:cool', 429, '60')).outcome,
       (ratebucket.bucket_observe('x:broken', 500)).breaker,
       ratebucket.bucket_pause('x:paused', '1 hour'),
       cardinality(ratebucket.inflight_acquire('cap:one'));
TRUNCATE outbox.webhook_events;
INSERT INTO outbox.webhook_events (id, endpoint, limits, inflight_key, next_attempt_at, status, lease_until) VALUES
  (1, 'x:due', '{}', NULL, now(), 'pending', NULL),
  (2, 'x:none', '{}', NULL, now(), 'pending', NULL),
  (3, 'x:empty', '{}', NULL, now(), 'pending', NULL),
  (4, 'x:cool', '{}', NULL, now(), 'pending', NULL),
  (5, 'x:broken', '{}', NULL, now(), 'pending', NULL),
  (6, 'x:paused', '{}', NULL, now(), 'pending', NULL),
  (7, 'x:due', '{x:quota}', NULL, now(), 'pending', NULL),
  (8, 'x:due', '{}', 'cap:one', now(), 'pending', NULL),
  (9, 'x:due', '{}', NULL, now() + interval '1 hour', 'pending', NULL),
  (10, 'x:due', '{}', NULL, now(), 'sending', now() + interval '30 s'),
  (11, 'x:due', '{x:none,x:empty}', 'cap:none', now() + interval '1 hour', 'pending', NULL);
INSERT INTO outbox.webhook_events (id, endpoint, status, attempts, last_status)
VALUES (12, 'x:due', 'delivered', 1, 200);
SELECT e.id, x.reason, x.key,
       round(extract(epoch FROM x.until - clock_timestamp()) / 10) * 10 AS lets_go_in_s,   -- (to 10 s)
       x.until > clock_timestamp() AS later, x.detail
FROM outbox.webhook_events e, outbox.explain_event(e.id) x
WHERE e.id <> 7
ORDER BY e.id, x.reason, x.key;
-- the quota's reset is at midnight UTC: a time the output cannot show
SELECT x.reason, x.key, x.until = (SELECT quota_resets_at FROM ratebucket.bucket_status
                                   WHERE endpoint = 'x:quota') AS at_its_reset
FROM outbox.explain_event(7) x;
-- the view, for one endpoint: its events pending or in flight, and why
SELECT event_id, reason, key FROM outbox.event_waits WHERE endpoint = 'x:due' ORDER BY 1, 2, 3;
SELECT * FROM outbox.explain_event(99);
SELECT * FROM outbox.explain_event(NULL);

-- explain_endpoint: what holds an endpoint's best pending event, then its
-- events: in flight, none due yet, due, or none at all.
TRUNCATE outbox.webhook_events;
INSERT INTO outbox.webhook_events (endpoint, next_attempt_at, status, lease_until) VALUES
  ('x:paused', now(), 'pending', NULL),
  ('x:due', now(), 'sending', now() + interval '30 s'),
  ('x:due', now() + interval '1 hour', 'pending', NULL),
  ('x:cool', now() - interval '1 s', 'pending', NULL),
  ('x:none', now(), 'pending', NULL),
  ('x:empty', now() - interval '1 s', 'pending', NULL),
  ('x:empty', now(), 'pending', NULL);
INSERT INTO outbox.webhook_events (endpoint, limits) VALUES ('x:limited', '{x:quota}');
SELECT ratebucket.bucket_configure('x:limited', 100, 10);
-- (a quota lets go at midnight UTC: shown as that)
SELECT u.ep, x.reason, x.key,
       CASE WHEN x.reason = 'quota spent'
            THEN (x.until = (SELECT quota_resets_at FROM ratebucket.bucket_status
                             WHERE endpoint = x.key))::text
            ELSE (round(extract(epoch FROM x.until - clock_timestamp()) / 10) * 10)::text
       END AS lets_go_in_s,
       x.detail
FROM unnest(ARRAY['x:paused', 'x:due', 'x:cool', 'x:none', 'x:empty', 'x:limited', 'x:nothing'])
     WITH ORDINALITY AS u(ep, o)
CROSS JOIN LATERAL outbox.explain_endpoint(u.ep) x
ORDER BY u.o, x.reason;
SELECT ratebucket.bucket_resume('x:paused');
SELECT x.reason, x.detail FROM outbox.explain_endpoint('x:paused') x;
SELECT * FROM outbox.explain_endpoint(NULL);

-- Un-parking.  Events parked for a pause, a long cooldown or a slow rate
-- come back at the pace their endpoint has now once it is resumed, reset
-- or its rate raised, and those parked while a half-open breaker's probe
-- is out once the probe's success closes it: the claims look again at
-- cursors parked more than 2 s ahead about every second.  A retry's
-- backoff is the event's own, and stays.
TRUNCATE outbox.webhook_events;
TRUNCATE outbox.webhook_parking;
SELECT ratebucket.bucket_configure('u:paused', 10, 5), ratebucket.bucket_pause('u:paused');
SELECT ratebucket.bucket_configure('u:cool', 10, 5);
SELECT ratebucket.bucket_configure('u:slow', 0.01, 1);      -- a token each 100 s
SELECT ratebucket.bucket_configure('u:backoff', 10, 5);
-- u:cool: 5 events claimed; one answered 429 with an hour's Retry-After
-- (it waits for its bucket: parked), the others delivered
INSERT INTO outbox.webhook_events (endpoint) SELECT 'u:cool' FROM generate_series(1, 5);
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT r.outcome, count(*)
FROM (SELECT outbox.record_delivery(e.id, CASE WHEN e.id = f.id THEN 429 ELSE 200 END,
                                    CASE WHEN e.id = f.id THEN '3600' END,
                                    claimed_lease => e.lease_until) AS outcome
      FROM outbox.webhook_events e,
           (SELECT min(id) AS id FROM outbox.webhook_events) f
      WHERE e.status = 'sending' ORDER BY e.id) r
GROUP BY 1 ORDER BY 1;
SELECT parked, round(extract(epoch FROM next_attempt_at - now()) / 60) AS due_in_min
FROM outbox.webhook_events WHERE status = 'pending';
INSERT INTO outbox.webhook_events (endpoint)
SELECT ep FROM unnest(ARRAY['u:paused', 'u:cool', 'u:slow']) ep, generate_series(1, 8);
-- and a retry 30 s ahead after a failure: not parked
INSERT INTO outbox.webhook_events (endpoint, attempts, last_status, next_attempt_at)
VALUES ('u:backoff', 3, 500, now() + interval '30 s');
-- the first claim sends u:slow's token and parks the rest of the others,
-- the second parks u:slow's
SELECT endpoint, count(*) AS claimed FROM outbox.claim_events() GROUP BY 1 ORDER BY 1;
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT endpoint, parked, count(*) AS events,
       round(extract(epoch FROM min(next_attempt_at) - now())) AS first_in_s,
       round(extract(epoch FROM max(next_attempt_at) - now())) AS last_in_s
FROM outbox.webhook_events WHERE status = 'pending' GROUP BY 1, 2 ORDER BY 1, 2;
SELECT endpoint, recheck_at IS NOT NULL AS rechecked FROM outbox.webhook_parking ORDER BY 1;
-- Each one freed in its own way, u:slow now at 100/s.
SELECT ratebucket.bucket_resume('u:paused'), ratebucket.bucket_reset('u:cool'),
       ratebucket.bucket_configure('u:slow', 100, 10);
-- A second later a claim brings them back and sends what has tokens now;
-- the rest follow one token apart (10/s), none more than a second ahead.
SELECT pg_sleep(1.1);
SELECT endpoint, count(*) AS claimed FROM outbox.claim_events() GROUP BY 1 ORDER BY 1;
SELECT endpoint, parked, count(*) AS events,
       max(next_attempt_at) < now() + interval '1 s' AS within_a_second
FROM outbox.webhook_events WHERE status = 'pending' GROUP BY 1, 2 ORDER BY 1, 2;
-- Their cursors end where the events now do: no recheck needed.
SELECT endpoint, recheck_at IS NOT NULL AS rechecked, parked_until < now() + interval '1 s' AS near
FROM outbox.webhook_parking ORDER BY 1;

-- A breaker: open for 4 s, then half-open; a claim sends the probe, the
-- next parks the others until its outcome may come (4 s); the probe
-- succeeds, the breaker closes, and a second later they come back.
TRUNCATE outbox.webhook_events;
TRUNCATE outbox.webhook_parking;
SET ratebucket.breaker_open = '4s';
SELECT ratebucket.bucket_configure('u:broken', 10, 5, breaker_failures => 1);
SELECT (ratebucket.bucket_observe('u:broken', 500)).breaker;
SELECT pg_sleep(4.1);
INSERT INTO outbox.webhook_events (endpoint) SELECT 'u:broken' FROM generate_series(1, 6);
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT parked, count(*) AS events,
       min(next_attempt_at) > now() + interval '2 s' AS parked_2_s_ahead
FROM outbox.webhook_events WHERE endpoint = 'u:broken' AND status = 'pending' GROUP BY 1;
SELECT outbox.record_delivery(id, 200, claimed_lease => lease_until) AS probe
FROM outbox.webhook_events WHERE endpoint = 'u:broken' AND status = 'sending';
SELECT breaker FROM ratebucket.bucket_status WHERE endpoint = 'u:broken';
SELECT pg_sleep(1.1);
SELECT count(*) AS claimed FROM outbox.claim_events();
RESET ratebucket.breaker_open;

-- A parked event that came due less than a token before its token (the
-- takes before it were late) is left due for the claim that comes with its
-- token; one that came due longer ago than a token's time is parked again.
-- m:pace: 2/s in bursts of 1, its token just taken (the next in 0.5 s).
TRUNCATE outbox.webhook_events;
TRUNCATE outbox.webhook_parking;
SELECT ratebucket.bucket_configure('m:pace', 2, 1);
SELECT (ratebucket.bucket_take('m:pace')).allowed;
INSERT INTO outbox.webhook_events (id, endpoint, parked, next_attempt_at)
VALUES (1, 'm:pace', true, now() - interval '0.1 s');
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT id, parked, next_attempt_at < now() AS left_due FROM outbox.webhook_events;
UPDATE outbox.webhook_events SET next_attempt_at = now() - interval '1 s';
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT id, parked, next_attempt_at > now() AS parked_ahead FROM outbox.webhook_events;

-- unpark, by hand: at once, without waiting for a claim's recheck.
SELECT ratebucket.bucket_configure('u:manual', 10, 3), ratebucket.bucket_pause('u:manual');
INSERT INTO outbox.webhook_events (endpoint) SELECT 'u:manual' FROM generate_series(1, 4);
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT ratebucket.bucket_resume('u:manual');
SELECT outbox.unpark('u:manual') AS moved, outbox.unpark('u:backoff') AS moved_backoff,
       outbox.unpark('u:nothing') AS moved_nothing;
-- the bucket's 3 tokens: three due now, the fourth a token later
SELECT round(extract(epoch FROM next_attempt_at - now()) * 10) / 10 AS due_in_s, count(*)
FROM outbox.webhook_events WHERE endpoint = 'u:manual' GROUP BY 1 ORDER BY 1;
SELECT outbox.unpark(NULL);
RESET search_path;

-- Endpoints nobody configured.  With no template, their events wait, and
-- endpoint_status and the explanations say so; a template (here for the
-- endpoints, and one for the accounts their events name in limits) lets
-- the claim send them at once, configuring each at its first claim, and
-- spending exactly what it claims.
TRUNCATE outbox.webhook_events;
TRUNCATE outbox.webhook_parking;
INSERT INTO outbox.webhook_events (endpoint, limits)
SELECT 'https://t' || i % 2 || '.example/hook', ARRAY['acct:t' || i % 2]
FROM generate_series(1, 10) AS i;
SELECT endpoint, pending, due, in_flight, configuration, template
FROM outbox.endpoint_status ORDER BY endpoint;
SELECT count(*) AS claimed FROM outbox.claim_events();
SELECT reason, key FROM outbox.explain_endpoint('https://t1.example/hook') ORDER BY 1, 2;
SELECT ratebucket.bucket_template('https://*', 0.001, 3) AS configured_now,
       ratebucket.bucket_template('acct:*', 0.001, 4) AS configured_now;
SELECT endpoint, pending, due, configuration, template
FROM outbox.endpoint_status ORDER BY endpoint;
-- (the claim that found nothing set them aside, unclaimable_wait ahead:
-- due again now)
UPDATE outbox.webhook_events SET next_attempt_at = now();
SELECT reason, key FROM outbox.explain_endpoint('https://t1.example/hook') ORDER BY 1, 2;
SELECT endpoint, count(*) AS claimed
FROM outbox.claim_events(batch => 10, per_endpoint => 10) GROUP BY 1 ORDER BY 1;
SELECT endpoint, conf_rate, conf_capacity, round(tokens::numeric, 3) AS tokens,
       takes_granted, tokens_granted, template
FROM ratebucket.bucket_status
WHERE endpoint LIKE 'https://t%' OR endpoint LIKE 'acct:t%' ORDER BY endpoint;
SELECT endpoint, pending, in_flight, configuration, template
FROM outbox.endpoint_status ORDER BY endpoint;
-- an endpoint configured by hand says own, one nothing matches none
INSERT INTO outbox.webhook_events (endpoint) VALUES ('x:own'), ('x:none');
SELECT ratebucket.bucket_configure('x:own', 1, 1);
SELECT endpoint, configuration, template FROM outbox.endpoint_status
WHERE endpoint LIKE 'x:%' ORDER BY endpoint;
SELECT ratebucket.bucket_template_drop('https://*'), ratebucket.bucket_template_drop('acct:*');

-- Functions planted where a call could resolve to them are never called:
-- the queue's functions run with search_path = pg_catalog, pg_temp and name
-- its own objects by their schema.  Each of these matches a call better
-- than the function meant (a NULL taken for text; text[] and bigint[]
-- exactly, where the built-in takes any array): in the extension's schema,
-- and in a schema the caller puts first.  A whole round runs without them.
CREATE SCHEMA planted;
CREATE FUNCTION outbox.repace_parked(ep text, max_events text, only_if_sooner boolean)
RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'captured: repace_parked'; END $$;
CREATE FUNCTION outbox.cardinality(a text[])
RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'captured: cardinality(text[])'; END $$;
CREATE FUNCTION outbox.cardinality(a bigint[])
RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'captured: cardinality(bigint[])'; END $$;
CREATE FUNCTION planted.claim_cap_free(cap_key text)
RETURNS int LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'captured: claim_cap_free'; END $$;
CREATE FUNCTION planted.retry_backoff(attempts int)
RETURNS float8 LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'captured: retry_backoff'; END $$;
TRUNCATE outbox.webhook_events;
TRUNCATE outbox.webhook_parking;
-- (rates so low that nothing refills while the test runs)
SELECT ratebucket.bucket_configure('p:a', 0.000001, 2),
       ratebucket.bucket_configure('p:b', 0.000001, 2),
       ratebucket.bucket_configure('p:acct', 0.000001, 10), ratebucket.inflight_configure('p:cap', 10);
INSERT INTO outbox.webhook_events (endpoint, limits, inflight_key)
SELECT e, ARRAY['p:acct'], 'p:cap' FROM unnest(ARRAY['p:a', 'p:b']) e, generate_series(1, 3);
SET search_path = planted, outbox, pg_catalog;
CREATE TEMP TABLE planted_claim AS SELECT * FROM outbox.claim_events(10, 10);
SELECT endpoint, count(*) AS claimed FROM pg_temp.planted_claim GROUP BY 1 ORDER BY 1;
SELECT count(*) AS parked FROM outbox.webhook_events WHERE parked;
SELECT r.outcome, count(*)
FROM outbox.record_deliveries((SELECT array_agg(id ORDER BY id) FROM pg_temp.planted_claim
                               WHERE endpoint = 'p:a'),
                              ARRAY[200, 500],
                              (SELECT array_agg(lease_until ORDER BY id) FROM pg_temp.planted_claim
                               WHERE endpoint = 'p:a')) r
GROUP BY 1 ORDER BY 1;
SELECT r.outcome, count(*)
FROM outbox.record_endpoint('p:b', (SELECT array_agg(id ORDER BY id) FROM pg_temp.planted_claim
                                    WHERE endpoint = 'p:b'),
                            ARRAY[200, 500],
                            (SELECT array_agg(lease_until ORDER BY id) FROM pg_temp.planted_claim
                             WHERE endpoint = 'p:b')) r
GROUP BY 1 ORDER BY 1;
SELECT outbox.unpark('p:a') >= 0 AS unparked, outbox.unpark('p:b') >= 0 AS unparked;
-- p:a refilled, its pending events (the third, and the one retried) due
SELECT ratebucket.bucket_reset('p:a');
UPDATE outbox.webhook_events SET next_attempt_at = now() WHERE endpoint = 'p:a' AND status = 'pending';
SELECT count(*) AS claimed FROM outbox.claim_endpoint('p:a', 10);
SELECT outbox.record_delivery(id, 500, claimed_lease => lease_until) AS outcome
FROM outbox.webhook_events WHERE status = 'sending' ORDER BY id;
SELECT count(*) > 0 AS explained FROM outbox.explain_endpoint('p:a');
SELECT count(*) > 0 AS explained FROM outbox.event_waits;
SELECT outbox.next_due() >= 0 AS next_due, outbox.requeue_expired() AS requeued,
       outbox.events_left() AS left_;
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'p:cap';
RESET search_path;
DROP SCHEMA planted CASCADE;
DROP FUNCTION outbox.repace_parked(text, text, boolean), outbox.cardinality(text[]),
              outbox.cardinality(bigint[]);

-- ratebucket cannot go while the queue needs it.
DROP EXTENSION ratebucket;

-- Clean-up: nothing of this test is left behind.
DROP EXTENSION ratebucket_queue;
SELECT count(*) AS left_in_outbox FROM pg_class WHERE relnamespace = 'outbox'::regnamespace;
DROP SCHEMA outbox;
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
