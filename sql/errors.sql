--
-- errors: every bad input gets a clear error with a proper SQLSTATE, and no
-- row is created or changed.
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
SELECT allowed FROM ratebucket.bucket_take('e:known', 0.000001, 5, 2);
SELECT ratebucket.bucket_configure('e:conf', 0.000001, 5);

-- Run a statement; return its SQLSTATE and message, or 'ok'.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;

-- A fingerprint of every row, to prove that refused calls change nothing.
CREATE FUNCTION pg_temp.fingerprint() RETURNS text
LANGUAGE sql AS $$
	SELECT md5(coalesce(string_agg(b::text, '|' ORDER BY b.endpoint), ''))
	FROM ratebucket.buckets b
$$;
SELECT pg_temp.fingerprint() AS before \gset

WITH cases(stmt) AS (VALUES
	-- endpoint
	($$SELECT ratebucket.bucket_take(NULL, 1, 1)$$),
	($$SELECT ratebucket.bucket_take('', 1, 1)$$),
	($$SELECT ratebucket.bucket_take(repeat('x', 1025), 1, 1)$$),
	($$SELECT ratebucket.bucket_take(repeat('é', 513), 1, 1)$$),
	-- rate
	($$SELECT ratebucket.bucket_take('e:new', NULL, 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 'NaN', 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 'Infinity', 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', '-Infinity', 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 0, 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', -1, 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1e-10, 1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1e13, 1)$$),
	($$SELECT ratebucket.bucket_take('e:known', 0, 5)$$),
	-- capacity
	($$SELECT ratebucket.bucket_take('e:new', 1, NULL)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 'NaN')$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 'Infinity')$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 0)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, -5)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1e13)$$),
	-- tokens
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, NULL)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, 'NaN')$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, '-Infinity')$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, 0)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, -1)$$),
	($$SELECT ratebucket.bucket_take('e:new', 1, 1, 2)$$),
	($$SELECT ratebucket.bucket_take('e:known', 0.000001, 5, 6)$$),
	($$SELECT ratebucket.bucket_take('e:known', 0.000001, 1, 2)$$),
	-- distribute, in a database without Citus
	($$SELECT * FROM ratebucket.distribute()$$),
	($$SELECT * FROM ratebucket.distribute(0)$$),
	-- the configured form
	($$SELECT ratebucket.bucket_take(NULL::text)$$),
	($$SELECT ratebucket.bucket_take('')$$),
	($$SELECT ratebucket.bucket_take('e:conf', NULL)$$),
	($$SELECT ratebucket.bucket_take('e:conf', 'NaN')$$),
	($$SELECT ratebucket.bucket_take('e:conf', 0)$$),
	($$SELECT ratebucket.bucket_take('e:conf', 6)$$),
	($$SELECT ratebucket.bucket_take('e:new')$$),
	($$SELECT ratebucket.bucket_take('e:known')$$),
	-- bucket_take_upto
	($$SELECT ratebucket.bucket_take_upto(NULL, 1, 1, 1)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 0, 1, 1)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 1, 'NaN', 1)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 1, 0.5, 1)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 1, 1, NULL)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 1, 1, 0)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 1, 1, -5)$$),
	($$SELECT ratebucket.bucket_take_upto('e:new', 5)$$),
	($$SELECT ratebucket.bucket_take_upto('e:conf', 0)$$),
	($$SELECT ratebucket.bucket_take_upto(repeat('x', 1025), 1)$$),
	-- bucket_claimable
	($$SELECT ratebucket.bucket_claimable(NULL, 1)$$),
	($$SELECT ratebucket.bucket_claimable('', 1)$$),
	($$SELECT ratebucket.bucket_claimable('e:known', NULL)$$),
	($$SELECT ratebucket.bucket_claimable('e:known', 0)$$),
	-- bucket_wait
	($$SELECT ratebucket.bucket_wait(NULL)$$),
	($$SELECT ratebucket.bucket_wait('e:known', 'NaN')$$),
	($$SELECT ratebucket.bucket_wait('e:known', 0)$$),
	-- bucket_ready
	($$SELECT ratebucket.bucket_ready(NULL)$$),
	($$SELECT ratebucket.bucket_ready('')$$),
	($$SELECT ratebucket.bucket_ready(repeat('x', 1025))$$),
	($$SELECT ratebucket.bucket_ready('e:known', NULL)$$),
	($$SELECT ratebucket.bucket_ready('e:known', 'Infinity')$$),
	($$SELECT ratebucket.bucket_ready('e:known', -1)$$),
	-- bucket_configure
	($$SELECT ratebucket.bucket_configure(NULL, 1, 1)$$),
	($$SELECT ratebucket.bucket_configure('', 1, 1)$$),
	($$SELECT ratebucket.bucket_configure(repeat('x', 1025), 1, 1)$$),
	($$SELECT ratebucket.bucket_configure('e:conf', NULL, 1)$$),
	($$SELECT ratebucket.bucket_configure('e:conf', 'NaN', 1)$$),
	($$SELECT ratebucket.bucket_configure('e:conf', 0, 1)$$),
	($$SELECT ratebucket.bucket_configure('e:conf', 1, NULL)$$),
	($$SELECT ratebucket.bucket_configure('e:conf', 1, '-Infinity')$$),
	($$SELECT ratebucket.bucket_configure('e:conf', 1, -1)$$),
	($$SELECT ratebucket.bucket_configure('e:new', -1, 1)$$),
	-- reset, drop, expire
	($$SELECT ratebucket.bucket_reset(NULL)$$),
	($$SELECT ratebucket.bucket_reset('')$$),
	($$SELECT ratebucket.bucket_drop(NULL)$$),
	($$SELECT ratebucket.bucket_drop(repeat('x', 1025))$$),
	($$SELECT ratebucket.bucket_expire(NULL)$$),
	($$SELECT ratebucket.bucket_expire('-1 day')$$)
)
SELECT stmt, pg_temp.try(stmt) AS result FROM cases;

-- Nothing was created or changed.
SELECT pg_temp.fingerprint() = :'before' AS rows_unchanged;
SELECT endpoint FROM ratebucket.buckets ORDER BY endpoint;

-- The limits themselves are accepted.
SELECT pg_temp.try($$SELECT ratebucket.bucket_take(repeat('x', 1024), 1e-9, 1e12, 1e12)$$) AS at_limits,
	   pg_temp.try($$SELECT ratebucket.bucket_take(repeat('é', 512), 1e12, 1e-300, 1e-300)$$) AS tiny_capacity;

-- Errors in full, as a user sees them in psql.
SELECT * FROM ratebucket.bucket_take('e:known', 'NaN', 1);
SELECT * FROM ratebucket.bucket_take('e:known', 1, 0);
SELECT * FROM ratebucket.bucket_take(repeat('x', 2000), 1, 1);
SELECT * FROM ratebucket.bucket_take('e:known', 1, 5, 6);
SELECT * FROM ratebucket.bucket_take('e:never');

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
