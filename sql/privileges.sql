--
-- privileges: what a role with no grant, a worker and an operator may do,
-- and proof that nothing is resolved through the caller's search_path.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP ROLE IF EXISTS regress_rb_nobody, regress_rb_worker, regress_rb_admin, regress_rb_batcher;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;
SELECT ratebucket.bucket_configure('p:conf', 0.000001, 9);
SELECT ratebucket.inflight_configure('p:cap', 10);

CREATE ROLE regress_rb_nobody;
CREATE ROLE regress_rb_worker;
CREATE ROLE regress_rb_admin;

-- The grants the README documents.
GRANT USAGE ON SCHEMA ratebucket TO regress_rb_worker, regress_rb_admin;
GRANT EXECUTE ON FUNCTION
	ratebucket.bucket_take(text, float8, float8, float8),
	ratebucket.bucket_take(text, float8),
	ratebucket.bucket_take_upto(text, float8, float8, int),
	ratebucket.bucket_take_upto(text, int),
	ratebucket.bucket_take_all(text[], float8[]),
	ratebucket.bucket_ready(text, float8),
	ratebucket.bucket_wait(text, float8),
	ratebucket.bucket_claimable(text, int),
	ratebucket.bucket_observe(text, int, text, jsonb),
	ratebucket.bucket_observe(text, int, text, jsonb, timestamptz),
	ratebucket.inflight_acquire(text, int),
	ratebucket.inflight_release(text, bigint[]),
	ratebucket.inflight_renew(text, bigint[], interval)
	TO regress_rb_worker;
GRANT SELECT ON ratebucket.bucket_status, ratebucket.inflight_status TO regress_rb_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ratebucket TO regress_rb_admin;
GRANT SELECT ON ratebucket.bucket_status, ratebucket.inflight_status TO regress_rb_admin;

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
GRANT EXECUTE ON FUNCTION pg_temp.try(text) TO PUBLIC;

CREATE TEMP TABLE calls(n serial, stmt text);
GRANT SELECT ON calls TO PUBLIC;
INSERT INTO calls(stmt) VALUES
	($$SELECT ratebucket.bucket_take('p:x', 10, 10)$$),
	($$SELECT ratebucket.bucket_take('p:conf')$$),
	($$SELECT ratebucket.bucket_ready('p:x')$$),
	($$SELECT ratebucket.bucket_take_upto('p:x', 10, 10, 3)$$),
	($$SELECT ratebucket.bucket_take_upto('p:conf', 1)$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['p:conf'])$$),
	($$SELECT ratebucket.bucket_wait('p:x')$$),
	($$SELECT ratebucket.bucket_claimable('p:x', 5)$$),
	($$SELECT ratebucket.bucket_observe('p:x', 200)$$),
	($$SELECT ratebucket.bucket_configure('p:x', 1, 1)$$),
	($$SELECT ratebucket.bucket_pause('p:x', '1 minute')$$),
	($$SELECT ratebucket.bucket_resume('p:x')$$),
	($$SELECT ratebucket.bucket_reset('p:x')$$),
	($$SELECT ratebucket.bucket_expire('1 day')$$),
	($$SELECT ratebucket.refill_tokens(0, 1, 1, now(), now())$$),
	($$SELECT ratebucket.parse_retry_after('120')$$),
	($$SET ratebucket.max_cooldown = '1s'$$),
	($$SELECT count(*) FROM ratebucket.bucket_status$$),
	($$SELECT count(*) FROM ratebucket.buckets$$),
	($$UPDATE ratebucket.buckets SET tokens = capacity$$),
	($$INSERT INTO ratebucket.buckets (endpoint, rate, capacity, tokens, refilled_at, created_at) VALUES ('p:forged', 1, 1e9, 1e9, now(), now())$$),
	($$SELECT ratebucket.inflight_acquire('p:cap')$$),
	($$SELECT ratebucket.inflight_release('p:cap', '{}')$$),
	($$SELECT ratebucket.inflight_renew('p:cap', '{}')$$),
	($$SELECT count(*) FROM ratebucket.inflight_status$$),
	($$SELECT count(*) FROM ratebucket.inflight_slots$$),
	($$DELETE FROM ratebucket.inflight_slots$$),
	($$SELECT ratebucket.inflight_configure('p:cap', 5)$$),
	($$SELECT ratebucket.inflight_drop('p:nocap')$$),
	($$SELECT ratebucket.bucket_drop('p:x')$$);

-- A role with no grant: every call is an error, not access.
SET ROLE regress_rb_nobody;
SELECT n, stmt, pg_temp.try(stmt) FROM calls ORDER BY n;
RESET ROLE;

-- A worker may take, peek, report outcomes and read the status view, and
-- nothing else; it never touches the table.
SET ROLE regress_rb_worker;
SELECT n, stmt, pg_temp.try(stmt) FROM calls ORDER BY n;
RESET ROLE;

-- An operator may also configure, pause, resume, reset, expire, drop and
-- watch, but still not write the table behind the functions' backs, nor
-- change the settings.
SET ROLE regress_rb_admin;
SELECT n, stmt, pg_temp.try(stmt) FROM calls ORDER BY n;
RESET ROLE;

SELECT endpoint, configured FROM ratebucket.bucket_status ORDER BY endpoint;

--
-- A schema ahead of ratebucket on the search_path plants look-alikes: an
-- "=" operator for text, functions and a table with ratebucket's names.
-- None of them may ever be called or touched.
--
CREATE SCHEMA regress_evil;
CREATE FUNCTION regress_evil.evil_eq(text, text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'planted = called'; RETURN true; END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text,
								PROCEDURE = regress_evil.evil_eq);
CREATE FUNCTION regress_evil.evil_lt(timestamptz, timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'planted < called'; RETURN true; END $$;
CREATE OPERATOR regress_evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz,
								 PROCEDURE = regress_evil.evil_lt);
CREATE FUNCTION regress_evil.refill_tokens(float8, float8, float8, timestamptz, timestamptz)
RETURNS float8 LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'planted refill_tokens called'; RETURN 1e9; END $$;
CREATE FUNCTION regress_evil.clock_timestamp() RETURNS timestamptz
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'planted clock_timestamp called'; RETURN 'infinity'; END $$;
CREATE TABLE regress_evil.buckets (LIKE ratebucket.buckets);
GRANT USAGE ON SCHEMA regress_evil TO PUBLIC;
GRANT ALL ON ALL TABLES IN SCHEMA regress_evil TO PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA regress_evil TO PUBLIC;

SET search_path = regress_evil, pg_catalog, public;
SET ROLE regress_rb_admin;
SELECT allowed FROM ratebucket.bucket_take('p:evil', 0.000001, 3);
SELECT allowed FROM ratebucket.bucket_take('p:conf');
SELECT ratebucket.bucket_ready('p:evil');
SELECT ratebucket.bucket_configure('p:evil', 0.000001, 4);
SELECT ratebucket.bucket_reset('p:evil');
SELECT outcome FROM ratebucket.bucket_observe('p:evil', 429, '1', '{"X-RateLimit-Remaining": "5"}');
SELECT ratebucket.bucket_pause('p:evil', '1 minute'), ratebucket.bucket_resume('p:evil');
SELECT ratebucket.bucket_expire('0 seconds');
SELECT endpoint, round(tokens::numeric, 3) AS tokens FROM ratebucket.bucket_status ORDER BY endpoint;
SELECT ratebucket.bucket_drop('p:evil');
RESET ROLE;
RESET search_path;
SELECT count(*) AS planted_table_rows FROM regress_evil.buckets;

DROP SCHEMA regress_evil CASCADE;

--
-- bucket_take_batch acquires in-flight slots on its caller's behalf: only
-- for a caller that may call inflight_acquire itself.  A role granted the
-- batch alone gets a batch without a cap, and an error for one with a cap,
-- which then spends no token and holds no slot; granted inflight_acquire,
-- it gets both.
--
CREATE ROLE regress_rb_batcher;
GRANT USAGE ON SCHEMA ratebucket TO regress_rb_batcher;
GRANT EXECUTE ON FUNCTION ratebucket.bucket_take_batch(ratebucket.batch_request[])
	TO regress_rb_batcher;
SELECT ratebucket.bucket_configure('p:batch', 0.000001, 5);
SELECT in_flight AS slots_before FROM ratebucket.inflight_status WHERE key = 'p:cap' \gset
SET ROLE regress_rb_batcher;
SELECT request, granted, slots
FROM ratebucket.bucket_take_batch(ARRAY[ROW(ARRAY['p:batch'], 2, NULL)::ratebucket.batch_request]);
SELECT pg_temp.try($$SELECT * FROM ratebucket.bucket_take_batch(
	ARRAY[ROW(ARRAY['p:batch'], 2, 'p:cap')::ratebucket.batch_request])$$);
RESET ROLE;
SELECT takes_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 'p:batch';
SELECT in_flight = :slots_before AS no_slot_held
FROM ratebucket.inflight_status WHERE key = 'p:cap';
GRANT EXECUTE ON FUNCTION ratebucket.inflight_acquire(text, int) TO regress_rb_batcher;
SET ROLE regress_rb_batcher;
SELECT request, granted, cardinality(slots) AS slots
FROM ratebucket.bucket_take_batch(ARRAY[ROW(ARRAY['p:batch'], 2, 'p:cap')::ratebucket.batch_request]);
RESET ROLE;
SELECT takes_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 'p:batch';
SELECT in_flight - :slots_before AS slots_held
FROM ratebucket.inflight_status WHERE key = 'p:cap';
REVOKE ALL ON SCHEMA ratebucket FROM regress_rb_batcher;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM regress_rb_batcher;
DROP ROLE regress_rb_batcher;

REVOKE ALL ON SCHEMA ratebucket FROM regress_rb_worker, regress_rb_admin;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM regress_rb_worker, regress_rb_admin;
REVOKE ALL ON ratebucket.bucket_status, ratebucket.inflight_status FROM regress_rb_worker, regress_rb_admin;
DROP ROLE regress_rb_nobody, regress_rb_worker, regress_rb_admin;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
