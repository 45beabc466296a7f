--
-- take: bucket_take with explicit limits, bucket_ready, and the arithmetic.
--
-- Outputs must not depend on how fast the test runs: where time passes
-- between two calls, results are checked against bounds, not printed raw.
-- A rate of 1e-6 tokens/s refills nothing measurable during a test.
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

-- A bucket seen for the first time starts full.
SELECT * FROM ratebucket.bucket_take('t:new', 0.000001, 5);
SELECT endpoint, rate, capacity, round(tokens::numeric, 3) AS tokens,
	   takes_granted, tokens_granted, last_used IS NOT NULL AS used
FROM ratebucket.bucket_status WHERE endpoint = 't:new';

-- Take until empty, then be denied with the exact wait: 1e-6 tokens/s and a
-- shortfall of ~1 token is ~1e6 seconds.
SELECT allowed, round(remaining::numeric, 3) AS remaining, wait_seconds = 0 AS no_wait
FROM ratebucket.bucket_take('t:new', 0.000001, 5, 3);
SELECT allowed, round(remaining::numeric, 3) AS remaining,
	   wait_seconds BETWEEN 0.99e6 AND 1.0e6 AS wait_about_1e6s
FROM ratebucket.bucket_take('t:new', 0.000001, 5, 2);
-- A take that fits is still granted; a denial wrote nothing.
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:new', 0.000001, 5, 1);
SELECT takes_granted, tokens_granted FROM ratebucket.bucket_status WHERE endpoint = 't:new';

-- wait_seconds is the exact time until the tokens are there: at 10 tokens/s
-- an empty bucket needs 0.1 s for one token.  Sleeping that long is enough.
SELECT allowed FROM ratebucket.bucket_take('t:fast', 10, 2, 2);
SELECT allowed AS fast_allowed, wait_seconds AS fast_wait,
	   wait_seconds > 0 AND wait_seconds <= 0.1 AS fast_wait_ok
FROM ratebucket.bucket_take('t:fast', 10, 2, 1) \gset
\echo allowed: :fast_allowed, 0 < wait_seconds <= 0.1: :fast_wait_ok
SELECT pg_sleep(:fast_wait);
SELECT allowed FROM ratebucket.bucket_take('t:fast', 10, 2, 1);

-- Fractional tokens are fine.
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:frac', 0.000001, 1, 0.25);

-- Limits come from the arguments on every call: a lower capacity cuts the
-- tokens held, a higher one lets the bucket fill further over time.
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:live', 0.000001, 10, 1);
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:live', 0.000001, 4, 1);
SELECT rate, capacity FROM ratebucket.buckets WHERE endpoint = 't:live';

-- A new rate applies from the call on, not backwards: the time since the
-- last grant refills at that grant's rate (1/s here: 0.2 token in 0.2 s,
-- not 200 at 1000/s).
SELECT allowed FROM ratebucket.bucket_take('t:rate', 1, 100, 100);
SELECT pg_sleep(0.2);
SELECT allowed, remaining < 1 AS little_refilled, wait_seconds < 0.001 AS fast_from_now
FROM ratebucket.bucket_take('t:rate', 1000, 100, 1);

-- bucket_ready peeks: an unknown endpoint is ready, it never consumes.
SELECT ratebucket.bucket_ready('t:unknown') AS unknown_ready;
SELECT count(*) AS rows_for_unknown FROM ratebucket.buckets WHERE endpoint = 't:unknown';
SELECT ratebucket.bucket_ready('t:live', 3) AS ready_3,
	   ratebucket.bucket_ready('t:live', 3.5) AS ready_3_5,
	   ratebucket.bucket_ready('t:live') AS ready_1;
SELECT round(tokens::numeric, 3) AS tokens_after_peeks
FROM ratebucket.bucket_status WHERE endpoint = 't:live';

-- A take that rolls back gives its tokens back.
BEGIN;
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:live', 0.000001, 4, 3);
ROLLBACK;
SELECT round(tokens::numeric, 3) AS tokens_after_rollback, takes_granted
FROM ratebucket.bucket_status WHERE endpoint = 't:live';

-- So does a first take that created the bucket.
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('t:rolledback', 1, 1);
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM ratebucket.buckets WHERE endpoint = 't:rolledback';

-- The arithmetic at explicit times: refill_tokens(tokens, rate, capacity,
-- refilled_at, at) = min(capacity, tokens + rate * elapsed).
SELECT ratebucket.refill_tokens(0, 10, 100, '2026-01-01 00:00:00+00', '2026-01-01 00:00:01.5+00') AS after_1_5s,
	   ratebucket.refill_tokens(0, 10, 100, '2026-01-01 00:00:00+00', '2026-01-01 00:01:00+00') AS capped,
	   ratebucket.refill_tokens(5, 10, 100, '2026-01-01 00:00:00+00', '2025-12-31 23:00:00+00') AS clock_back,
	   ratebucket.refill_tokens(50, 10, 20, '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00') AS over_capacity,
	   ratebucket.refill_tokens(0, 1e12, 1e12, '-infinity', 'infinity') AS extreme;

-- A clock that reads earlier than the stored refill time refills nothing and
-- never moves the stored time backwards.  Simulate the step by moving the
-- stored time an hour ahead of the clock.
SELECT allowed FROM ratebucket.bucket_take('t:clock', 1000, 10, 10);
UPDATE ratebucket.buckets SET refilled_at = clock_timestamp() + interval '1 hour'
WHERE endpoint = 't:clock'
RETURNING round(tokens::numeric, 3) AS tokens;
SELECT refilled_at AS future FROM ratebucket.buckets WHERE endpoint = 't:clock' \gset
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:clock', 1000, 10, 1);
SELECT refilled_at = :'future' AS refill_time_kept, round(tokens::numeric, 3) AS tokens
FROM ratebucket.buckets WHERE endpoint = 't:clock';
-- Once the clock passes the stored time, refill resumes from it.
UPDATE ratebucket.buckets SET refilled_at = clock_timestamp() - interval '1 second'
WHERE endpoint = 't:clock';
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('t:clock', 1000, 10, 1);

-- Every take is a HOT update (counted within this transaction).
BEGIN;
SELECT count(*) FILTER (WHERE (ratebucket.bucket_take('t:hot', 1000, 1000)).allowed) AS granted
FROM generate_series(1, 10);
-- (PostgreSQL 15+ may also count earlier transactions' not yet flushed stats)
SELECT pg_stat_get_xact_tuples_updated('ratebucket.buckets'::regclass) >= 9 AS updated,
	   pg_stat_get_xact_tuples_hot_updated('ratebucket.buckets'::regclass) =
	   pg_stat_get_xact_tuples_updated('ratebucket.buckets'::regclass) AS all_hot;
COMMIT;

-- Endpoints are compared byte for byte.
SELECT allowed FROM ratebucket.bucket_take('T:NEW', 0.000001, 5, 5);
SELECT allowed FROM ratebucket.bucket_take('t:new ', 0.000001, 5, 5);
SELECT allowed FROM ratebucket.bucket_take(repeat('x', 1024), 1, 1);
SELECT count(*) AS buckets FROM ratebucket.buckets;

-- A take returns the extension's row type, take_result.  Altered, the type
-- no longer has the columns the take fills: the take refuses (42804)
-- rather than build a row of another shape, also in a session that has
-- already built one; altered back (the rollback), it takes again.
SELECT allowed FROM ratebucket.bucket_take('t:type', 1, 5);
SELECT granted FROM ratebucket.bucket_take_upto('t:type', 1, 5, 1);
BEGIN;
ALTER TYPE ratebucket.take_result ADD ATTRIBUTE extra int;
SELECT allowed FROM ratebucket.bucket_take('t:type', 1, 5);
ROLLBACK;
BEGIN;
ALTER TYPE ratebucket.take_upto_result ALTER ATTRIBUTE remaining TYPE text;
SELECT granted FROM ratebucket.bucket_take_upto('t:type', 1, 5, 2);
ROLLBACK;
SELECT allowed FROM ratebucket.bucket_take('t:type', 1, 5);
SELECT granted FROM ratebucket.bucket_take_upto('t:type', 1, 5, 2);

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
