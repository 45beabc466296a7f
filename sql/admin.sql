--
-- admin: reset, drop, expire, and the status view.
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

SELECT allowed FROM ratebucket.bucket_take('a:one', 0.000001, 4, 4);
SELECT ratebucket.bucket_configure('a:conf', 0.000001, 4);
SELECT allowed FROM ratebucket.bucket_take('a:conf', 4);

-- Reset fills the bucket and keeps its configuration and counters.
SELECT ratebucket.bucket_reset('a:one') AS reset_one, ratebucket.bucket_reset('a:conf') AS reset_conf,
	   ratebucket.bucket_reset('a:missing') AS reset_missing;
SELECT endpoint, round(tokens::numeric, 3) AS tokens, configured, takes_granted
FROM ratebucket.bucket_status ORDER BY endpoint;

-- The status view shows the tokens now, refilled to the clock, not the
-- stored value: empty the bucket, then pretend it was emptied 2 s ago at
-- 1 token/s.
SELECT allowed FROM ratebucket.bucket_take('a:refill', 1, 10, 10);
UPDATE ratebucket.buckets SET refilled_at = refilled_at - interval '2 seconds'
WHERE endpoint = 'a:refill';
SELECT s.tokens BETWEEN 2 AND 3 AS tokens_now_refilled, b.tokens AS stored_tokens
FROM ratebucket.bucket_status s JOIN ratebucket.buckets b USING (endpoint)
WHERE endpoint = 'a:refill';

-- The view's columns.
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = 'ratebucket.bucket_status'::regclass AND attnum > 0
ORDER BY attnum;

-- Expiry deletes only buckets that are full now, idle long enough, and not
-- configured: a later take recreates them full, so no decision changes.
SELECT allowed FROM ratebucket.bucket_take('a:full', 1000, 1, 1);
SELECT allowed FROM ratebucket.bucket_take('a:empty', 0.000001, 1, 1);
UPDATE ratebucket.buckets SET refilled_at = refilled_at - interval '2 hours',
	   last_granted_at = last_granted_at - interval '2 hours'
WHERE endpoint IN ('a:full', 'a:empty', 'a:conf');
SELECT ratebucket.bucket_expire() AS expired;
SELECT endpoint FROM ratebucket.bucket_status ORDER BY endpoint;
-- With a shorter idle time, every full unconfigured bucket goes.
SELECT ratebucket.bucket_expire('0 seconds') AS expired;
SELECT endpoint, configured FROM ratebucket.bucket_status ORDER BY endpoint;
\set VERBOSITY terse
SELECT ratebucket.bucket_expire(NULL);
SELECT ratebucket.bucket_expire('-1 second');
\set VERBOSITY default

-- Drop deletes the bucket and its configuration.
SELECT ratebucket.bucket_drop('a:conf') AS dropped, ratebucket.bucket_drop('a:conf') AS dropped_again;
SELECT count(*) FROM ratebucket.buckets WHERE endpoint = 'a:conf';
-- A dropped configured endpoint is no longer configured.
\set VERBOSITY terse
SELECT * FROM ratebucket.bucket_take('a:conf');
\set VERBOSITY default

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
