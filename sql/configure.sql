--
-- configure: stored limits and bucket_take(endpoint, tokens).
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

-- A configured endpoint starts full and takes with its stored limits.
SELECT ratebucket.bucket_configure('c:a', 0.000001, 5);
SELECT endpoint, rate, capacity, round(tokens::numeric, 3) AS tokens, configured,
	   conf_rate, conf_capacity, configured_at IS NOT NULL AS has_configured_at,
	   last_used, takes_granted
FROM ratebucket.bucket_status WHERE endpoint = 'c:a';
SELECT allowed, round(remaining::numeric, 3) AS remaining FROM ratebucket.bucket_take('c:a');
SELECT allowed, round(remaining::numeric, 3) AS remaining FROM ratebucket.bucket_take('c:a', 3);
SELECT allowed, round(remaining::numeric, 3) AS remaining,
	   wait_seconds BETWEEN 1.99e6 AND 2.0e6 AS wait_about_2e6s
FROM ratebucket.bucket_take('c:a', 3);

-- Reconfiguring keeps the tokens earned so far, cut to the new capacity.
SELECT ratebucket.bucket_configure('c:a', 0.000001, 0.5);
SELECT rate, capacity, round(tokens::numeric, 3) AS tokens, conf_rate, conf_capacity
FROM ratebucket.bucket_status WHERE endpoint = 'c:a';
SELECT ratebucket.bucket_configure('c:a', 0.000001, 50);
SELECT rate, capacity, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 'c:a';

-- A configured take larger than the configured capacity is an error.
\set VERBOSITY terse
SELECT * FROM ratebucket.bucket_take('c:a', 51);
-- Taking with stored limits from an endpoint never configured is an error,
-- whether or not it has a bucket; neither creates a row.
SELECT * FROM ratebucket.bucket_take('c:never');
SELECT allowed FROM ratebucket.bucket_take('c:explicit', 1, 1);
SELECT * FROM ratebucket.bucket_take('c:explicit');
\set VERBOSITY default
SELECT endpoint, configured FROM ratebucket.bucket_status ORDER BY endpoint;

-- Explicit limits on a configured endpoint apply to that call only; the
-- configuration stays.
SELECT allowed FROM ratebucket.bucket_take('c:a', 0.000001, 1, 0.25);
SELECT rate, capacity, round(tokens::numeric, 3) AS tokens, conf_rate, conf_capacity
FROM ratebucket.bucket_status WHERE endpoint = 'c:a';
SELECT allowed, round(remaining::numeric, 3) AS remaining FROM ratebucket.bucket_take('c:a');

-- On a configured endpoint, explicit limits can only tighten the configured
-- ones: a role allowed to take cannot loosen an operator's limit.
SELECT ratebucket.bucket_configure('c:tight', 0.000001, 1);
\set VERBOSITY terse
SELECT * FROM ratebucket.bucket_take('c:tight', 1e12, 1e12, 1e6);
\set VERBOSITY default
SELECT allowed FROM ratebucket.bucket_take('c:tight', 1e12, 1e12, 1);
SELECT allowed, wait_seconds > 1e5 AS slow_refill FROM ratebucket.bucket_take('c:tight', 1e12, 1e12, 1);
SELECT rate, capacity FROM ratebucket.bucket_status WHERE endpoint = 'c:tight';

-- Configuring an endpoint that has a bucket from explicit takes keeps its tokens.
SELECT ratebucket.bucket_configure('c:explicit', 2, 3);
SELECT rate, capacity, tokens < 1 AS kept_nearly_empty, configured
FROM ratebucket.bucket_status WHERE endpoint = 'c:explicit';

-- A configuration that rolls back leaves nothing behind.
BEGIN;
SELECT ratebucket.bucket_configure('c:a', 99, 99);
SELECT ratebucket.bucket_configure('c:rolledback', 99, 99);
ROLLBACK;
SELECT endpoint, conf_rate, conf_capacity FROM ratebucket.bucket_status ORDER BY endpoint;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
