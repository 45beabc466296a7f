--
-- claim: the helpers of a worker's claim query.  bucket_take_upto takes a
-- batch's tokens in one row update; bucket_claimable is the lock-free filter
-- that answers, once per endpoint and per execution, how many events to
-- lock; bucket_wait says how long until a take would be granted.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;

-- A rate so low that nothing refills while this test runs.
SELECT ratebucket.bucket_configure('c:a', 0.000001, 5);

-- As many whole tokens as the bucket holds, up to the maximum, in one take.
SELECT granted, remaining, wait_seconds > 0 AS must_wait
FROM ratebucket.bucket_take_upto('c:a', 3);
SELECT granted, round(remaining::numeric, 3) AS remaining, wait_seconds > 0 AS must_wait
FROM ratebucket.bucket_take_upto('c:a', 3);
-- Empty: refused, with the wait for the next token, and nothing written.
SELECT granted, wait_seconds > 900000 AS waits_for_the_next_token
FROM ratebucket.bucket_take_upto('c:a', 3);
SELECT takes_granted, tokens_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 'c:a';

-- The wait after a partial grant is the time to the next token: half a
-- token short at 0.5/s is 1 s away.
SELECT granted, remaining, wait_seconds
FROM ratebucket.bucket_take_upto('c:half', 0.5, 2.5, 10);
SELECT granted, wait_seconds > 0 AND wait_seconds <= 1.0 AS next_token_within_a_second
FROM ratebucket.bucket_take_upto('c:half', 0.5, 2.5, 1);

-- Fractions are never granted: 2.5 tokens grant 2.
SELECT granted, remaining FROM ratebucket.bucket_take_upto('c:frac', 0.000001, 2.5, 10);

-- The explicit form cannot loosen a configured endpoint (capacity 5).
SELECT ratebucket.bucket_configure('c:b', 0.000001, 5);
SELECT granted FROM ratebucket.bucket_take_upto('c:b', 100, 100, 50);

-- A cooldown refuses everything; bucket_wait and bucket_ready agree.
SELECT ratebucket.bucket_configure('c:cool', 10, 10);
SELECT outcome FROM ratebucket.bucket_observe('c:cool', 429, '120');
SELECT granted, wait_seconds > 100 AS waits_out_the_cooldown
FROM ratebucket.bucket_take_upto('c:cool', 5);
SELECT ratebucket.bucket_ready('c:cool'),
       ratebucket.bucket_wait('c:cool') > 100 AS wait_covers_cooldown;

-- A half-open breaker lets one probe through, not a batch.
SELECT ratebucket.bucket_configure('c:probe', 10, 10, breaker_failures => 1);
SET ratebucket.breaker_open = '1s';
SELECT outcome, breaker FROM ratebucket.bucket_observe('c:probe', 500);
SELECT pg_sleep(1.1);
SELECT breaker FROM ratebucket.bucket_status WHERE endpoint = 'c:probe';
SELECT ratebucket.bucket_claimable('c:probe', 5) AS claimable_while_half_open;
SELECT granted, wait_seconds > 0 AS others_wait_for_the_probe
FROM ratebucket.bucket_take_upto('c:probe', 5);
SELECT granted FROM ratebucket.bucket_take_upto('c:probe', 5);
RESET ratebucket.breaker_open;

-- bucket_wait: 0 when a take would be granted now, and for an unknown
-- endpoint (its bucket would start full); otherwise the refusal's wait.
SELECT ratebucket.bucket_wait('c:frac') > 400000 AS half_a_token_short,
       ratebucket.bucket_wait('c:unknown') AS wait_unknown,
       ratebucket.bucket_wait('c:frac', 1) = 0 AS ready_for_one,
       ratebucket.bucket_wait('c:a') > 900000 AS empty_waits;

-- bucket_claimable answers once per endpoint in one execution: the whole
-- tokens the bucket holds, at most per_endpoint (0 if none); later calls
-- answer NULL.
SELECT ratebucket.bucket_configure('c:five', 0.000001, 5);
SELECT e, ratebucket.bucket_claimable(e, 3) AS n
FROM (VALUES (1, 'c:five'), (2, 'c:five'), (3, 'c:a'), (4, 'c:frac'),
             (5, 'c:unknown'), (6, 'c:frac')) AS v(i, e)
ORDER BY i;
-- With configured_only, an endpoint without a configuration answers NULL
-- too, at its first event as at the others (c:unknown has no row; c:adhoc
-- a row that only explicit takes made), where the plain form answers
-- per_endpoint for them; configured endpoints answer as before.
SELECT allowed FROM ratebucket.bucket_take('c:adhoc', 0.000001, 5);
SELECT e, ratebucket.bucket_claimable(e, 3) AS plain,
       ratebucket.bucket_claimable(e, 3, configured_only => true) AS configured_only
FROM (VALUES (1, 'c:unknown'), (2, 'c:adhoc'), (3, 'c:five'), (4, 'c:a'),
             (5, 'c:adhoc'), (6, 'c:five')) AS v(i, e)
ORDER BY i;
SELECT ratebucket.bucket_claimable('c:five', 3, NULL);
-- It only peeks: nothing was taken or written.
SELECT endpoint, takes_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint IN ('c:five', 'c:frac') ORDER BY 1;
-- Each execution of a prepared statement starts afresh.
PREPARE claimable(text) AS SELECT ratebucket.bucket_claimable($1, 4);
EXECUTE claimable('c:five');
EXECUTE claimable('c:five');
DEALLOCATE claimable;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
