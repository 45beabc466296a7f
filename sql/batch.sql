--
-- batch: bucket_take_batch grants a claimed batch whose requests answer to
-- several limits each (an endpoint, an account shared between endpoints, a
-- quota, an in-flight cap) in one call, writing each bucket once;
-- bucket_grantable peeks a bucket's whole tokens, answering every time.
--
-- Rates so low (0.000001/s) that nothing refills while this test runs:
-- every figure below is exact.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets
	  WHERE octet_length(endpoint) <= 1024) AS d;
SELECT count(*) AS caps FROM ratebucket.inflight_caps;

-- One request of a batch.
CREATE FUNCTION pg_temp.req(buckets text[], tokens int, inflight_key text DEFAULT NULL)
RETURNS ratebucket.batch_request
LANGUAGE sql IMMUTABLE AS $$
	SELECT ROW(buckets, tokens, inflight_key)::ratebucket.batch_request
$$;

-- The buckets as the status view shows them.
CREATE FUNCTION pg_temp.status(VARIADIC endpoints text[])
RETURNS TABLE (endpoint text, tokens numeric, takes_granted bigint, tokens_granted numeric)
LANGUAGE sql AS $$
	SELECT s.endpoint, round(s.tokens::numeric, 3), s.takes_granted,
		   round(s.tokens_granted::numeric, 3)
	FROM ratebucket.bucket_status s
	WHERE s.endpoint = ANY (endpoints)
	ORDER BY s.endpoint
$$;

-- Rows of ratebucket.buckets updated so far by this transaction.
CREATE FUNCTION pg_temp.updates() RETURNS bigint
LANGUAGE sql AS $$
	SELECT pg_stat_get_xact_tuples_updated('ratebucket.buckets'::regclass)
$$;

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

-- Every row of the buckets, the stripes, the caps and the slots: to prove
-- that refused calls change nothing.
CREATE FUNCTION pg_temp.fingerprint() RETURNS text
LANGUAGE sql AS $$
	SELECT md5(coalesce((SELECT string_agg(b::text, '|' ORDER BY b.endpoint)
						 FROM ratebucket.buckets b), '') || '#' ||
			   coalesce((SELECT string_agg(r::text, '|' ORDER BY r.endpoint)
						 FROM ratebucket.bucket_stripes r), '') || '#' ||
			   coalesce((SELECT string_agg(c::text, '|' ORDER BY c.key)
						 FROM ratebucket.inflight_caps c), '') || '#' ||
			   coalesce((SELECT string_agg(s.key || s.slot || s.lease_until, '|' ORDER BY s.key, s.slot)
						 FROM ratebucket.inflight_slots s), ''))
$$;

--
-- 1. Two requests sharing their account's bucket.  The account holds 3,
-- ep:a 2, ep:b 5.  The first request asks 5 of ep:a and the account and
-- gets 2 (all ep:a holds); the second asks 4 of the account and ep:b and
-- gets the 1 the account has left; the third asks 2 of ep:b alone and gets
-- them.  The first two wait for a token (a million seconds at 0.000001/s);
-- the third, granted all it asked, does not.
--
SELECT ratebucket.bucket_configure('acct:1', 0.000001, 3);
SELECT ratebucket.bucket_configure('ep:a', 0.000001, 2);
SELECT ratebucket.bucket_configure('ep:b', 0.000001, 5);
BEGIN;
SELECT pg_temp.updates() AS updates_before \gset
SELECT request, granted, wait_seconds > 0 AS waits,
	   round(wait_seconds::numeric, -3) AS wait_rounded, slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['ep:a', 'acct:1'], 5),
	pg_temp.req(ARRAY['acct:1', 'ep:b'], 4),
	pg_temp.req(ARRAY['ep:b'], 2)]);
-- One row update per bucket for the whole batch: 3, not 5 (the account
-- and ep:b are each taken from by two requests).
SELECT pg_temp.updates() - :updates_before AS rows_updated;
COMMIT;
-- One take per request per bucket: the account two (2 + 1 tokens), ep:a
-- one (2), ep:b two (1 + 2).
SELECT * FROM pg_temp.status('acct:1', 'ep:a', 'ep:b');

--
-- 2. A request whose buckets include an empty one gets nothing, whatever
-- order the buckets are named in, and nothing is written to the others.
-- Asking 0 tokens is granted 0, waits for nothing and writes nothing.
--
BEGIN;
SELECT pg_temp.updates() AS updates_before \gset
SELECT request, granted, wait_seconds > 0 AS waits, slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['ep:b', 'acct:1'], 1),
	pg_temp.req(ARRAY['acct:1', 'ep:b'], 1),
	pg_temp.req(ARRAY['ep:b'], 0)]);
SELECT pg_temp.updates() - :updates_before AS rows_updated;
COMMIT;
SELECT * FROM pg_temp.status('acct:1', 'ep:a', 'ep:b');

-- A bucket in a cooldown grants nothing either, and the request waits out
-- the cooldown (ep:c refills fast, 1000/s: its wait is the cooldown's).
SELECT ratebucket.bucket_configure('ep:c', 1000, 10);
SELECT outcome FROM ratebucket.bucket_observe('ep:c', 429, '600');
SELECT request, granted, wait_seconds BETWEEN 590 AND 601 AS waits_out_the_cooldown
FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['ep:b', 'ep:c'], 1)]);
SELECT * FROM pg_temp.status('ep:b');
SELECT takes_granted FROM ratebucket.bucket_status WHERE endpoint = 'ep:c';

--
-- 3. An in-flight cap.  'acct' allows 3 in flight.  Two requests holding
-- slots of it ask 2 each, with tokens to spare: the first gets 2 slots,
-- the second the 1 left, and each takes from its buckets exactly the
-- tokens it holds slots for (lane:y loses 1, not 2; acct:2, shared, 3).
--
SELECT ratebucket.inflight_configure('acct', 3, '1 hour');
SELECT ratebucket.bucket_configure('acct:2', 0.000001, 10);
SELECT ratebucket.bucket_configure('lane:x', 0.000001, 10);
SELECT ratebucket.bucket_configure('lane:y', 0.000001, 10);
CREATE TEMP TABLE capped AS
SELECT * FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['lane:x', 'acct:2'], 2, 'acct'),
	pg_temp.req(ARRAY['acct:2', 'lane:y'], 2, 'acct')]);
SELECT request, granted, wait_seconds, cardinality(slots) AS slots
FROM capped ORDER BY request;
-- The slots handed out are the slots held, each once.
SELECT (SELECT array_agg(s ORDER BY s) FROM capped, unnest(capped.slots) AS s) =
	   (SELECT array_agg(slot ORDER BY slot) FROM ratebucket.inflight_slots
		WHERE key = 'acct') AS slots_are_those_held;
SELECT key, cap, in_flight FROM ratebucket.inflight_status WHERE key = 'acct';
SELECT * FROM pg_temp.status('acct:2', 'lane:x', 'lane:y');

-- With the cap full, the requests get nothing (no slot, no token) and
-- wait for no bucket: only the cap stopped them.
SELECT request, granted, wait_seconds, slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['lane:x'], 1, 'acct'),
	pg_temp.req(ARRAY['lane:y', 'acct:2'], 1, 'acct')]);
SELECT * FROM pg_temp.status('acct:2', 'lane:x', 'lane:y');

-- A request without a cap in the same batch is not held back by it.
SELECT request, granted, wait_seconds, slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['lane:x'], 1, 'acct'),
	pg_temp.req(ARRAY['lane:x'], 1)]);
SELECT * FROM pg_temp.status('lane:x');

-- A rollback gives back every token and every slot.
SELECT ratebucket.inflight_release('acct', ARRAY(SELECT slot FROM ratebucket.inflight_slots
												  WHERE key = 'acct')) AS released;
SELECT pg_temp.fingerprint() AS before \gset
BEGIN;
SELECT request, granted, cardinality(slots) AS slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['lane:x', 'acct:2'], 2, 'acct'),
	pg_temp.req(ARRAY['acct:2', 'lane:y'], 2, 'acct')]);
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'acct';
SELECT * FROM pg_temp.status('acct:2', 'lane:x', 'lane:y');
ROLLBACK;
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'acct';
SELECT * FROM pg_temp.status('acct:2', 'lane:x', 'lane:y');
SELECT pg_temp.fingerprint() = :'before' AS unchanged;

-- Tokens a cap gives back go to the requests after it.  'one' allows 1 in
-- flight; acct:3 holds 3.  The first request asks 2 with the cap and keeps
-- the 1 it has a slot for; the second, without a cap, asks 2 and gets
-- both: the token the first gave back included.  acct:3 ends empty.
SELECT ratebucket.inflight_configure('one', 1, '1 hour');
SELECT ratebucket.bucket_configure('acct:3', 0.000001, 3);
SELECT request, granted, wait_seconds > 0 AS waits, cardinality(slots) AS slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['acct:3'], 2, 'one'),
	pg_temp.req(ARRAY['acct:3'], 2)]);
SELECT * FROM pg_temp.status('acct:3');
SELECT ratebucket.inflight_drop('one');

--
-- 4. A calendar quota as one of a request's buckets: 3 a day.  The request
-- gets the 3, and waits until the quota resets (within a day); the next
-- gets nothing.
--
SELECT ratebucket.bucket_configure_quota('q:day', 3, 'day', 'UTC');
SELECT request, granted, wait_seconds > 0 AND wait_seconds <= 86400 AS waits_for_the_reset
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['q:day', 'acct:2'], 5),
	pg_temp.req(ARRAY['acct:2', 'q:day'], 1)]);
SELECT endpoint, quota, quota_used, quota_remaining, takes_granted
FROM ratebucket.bucket_status WHERE endpoint = 'q:day';
SELECT * FROM pg_temp.status('acct:2');

--
-- 5. A striped endpoint (8 tokens over 4 stripes of 2) is taken alone in
-- its request, as bucket_take_upto takes it; other requests of the batch
-- are granted as usual.
--
SELECT ratebucket.bucket_configure('s:hot', 0.000001, 8);
SELECT ratebucket.bucket_stripe('s:hot', 4) AS stripes_before;
SELECT request, granted, wait_seconds, slots
FROM ratebucket.bucket_take_batch(ARRAY[
	pg_temp.req(ARRAY['s:hot'], 1),
	pg_temp.req(ARRAY['lane:x'], 1)]);
SELECT * FROM pg_temp.status('s:hot', 'lane:x');

-- With other buckets, or with a cap, it is refused (0A000) and nothing
-- changes, in the other requests either.
SELECT pg_temp.fingerprint() AS before \gset
SELECT stmt, pg_temp.try(stmt) FROM (VALUES
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[
		pg_temp.req(ARRAY['lane:x'], 1), pg_temp.req(ARRAY['s:hot', 'lane:y'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[
		pg_temp.req(ARRAY['lane:y', 's:hot'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[
		pg_temp.req(ARRAY['s:hot'], 1, 'acct')])$$)
) AS c(stmt);
SELECT pg_temp.fingerprint() = :'before' AS unchanged;

-- Through SPI (ratebucket.direct_access = off), in a batch with many slots
-- and many striped requests after them: the slot ids returned are the
-- slots held, each once (they once came back from freed memory).
SELECT ratebucket.inflight_configure('many', 1000, '1 hour');
SELECT ratebucket.bucket_configure('c:many', 0.000001, 1000);
SELECT ratebucket.bucket_configure('s:warm', 0.000001, 40);
SELECT ratebucket.bucket_stripe('s:warm', 4);
SET ratebucket.direct_access = off;
CREATE TEMP TABLE many AS
SELECT * FROM ratebucket.bucket_take_batch(
	ARRAY[pg_temp.req(ARRAY['c:many'], 600, 'many')] ||
	(SELECT array_agg(pg_temp.req(ARRAY['s:warm'], 1)) FROM generate_series(1, 20)));
RESET ratebucket.direct_access;
SELECT granted, cardinality(slots) AS slots,
	   (SELECT array_agg(s ORDER BY s) FROM unnest(slots) AS s) =
	   (SELECT array_agg(slot ORDER BY slot) FROM ratebucket.inflight_slots
		WHERE key = 'many') AS slots_are_those_held
FROM many WHERE request = 1;
SELECT sum(granted) AS striped_granted FROM many WHERE request > 1;
SELECT ratebucket.inflight_drop('many');

--
-- 6. Bad input: a clear error with its SQLSTATE, and nothing changed.
--
SELECT allowed FROM ratebucket.bucket_take('adhoc', 0.000001, 5);   -- a row, not configured
SELECT ratebucket.bucket_configure('tiny', 0.000001, 0.5);          -- less than a whole token
SELECT pg_temp.fingerprint() AS before \gset
SELECT stmt, pg_temp.try(stmt) FROM (VALUES
	-- buckets that cannot be taken from
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x', 'nowhere'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 1),
														 pg_temp.req(ARRAY['nowhere'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['adhoc'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['tiny'], 1)])$$),
	-- the bucket list
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x', 'lane:y', 'lane:x'], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req('{}', 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(NULL, 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x', NULL], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x', ''], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY[repeat('x', 1025)], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY[['lane:x'], ['lane:y']], 1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(array_fill('x'::text, ARRAY[65]), 1)])$$),
	-- tokens
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], -1)])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], NULL)])$$),
	-- the cap
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 1, 'nocap')])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 0, 'nocap')])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 1, '')])$$),
	-- the array
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 1), NULL])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[[pg_temp.req(ARRAY['lane:x'], 1)],
														  [pg_temp.req(ARRAY['lane:y'], 1)]])$$),
	($$SELECT * FROM ratebucket.bucket_take_batch(
		(SELECT array_agg(pg_temp.req(ARRAY['lane:x'], 0)) FROM generate_series(1, 10001)))$$)
) AS c(stmt);
SELECT pg_temp.fingerprint() = :'before' AS unchanged;

-- The function is STRICT: NULL requests are no rows; so is an empty array.
SELECT count(*) AS null_rows FROM ratebucket.bucket_take_batch(NULL);
SELECT count(*) AS empty_rows FROM ratebucket.bucket_take_batch('{}');

-- In a read-only transaction it is refused before reading anything.
BEGIN TRANSACTION READ ONLY;
SELECT pg_temp.try($$SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], 1)])$$) AS read_only;
COMMIT;
SELECT pg_temp.fingerprint() = :'before' AS unchanged;

--
-- 7. bucket_grantable: the whole tokens a take would be granted now, up to
-- max_tokens (default 1), without locking or writing anything.
--
SELECT ratebucket.bucket_configure('g:a', 0.000001, 5);
SELECT ratebucket.bucket_configure('g:b', 0.000001, 5);
SELECT ratebucket.bucket_configure('g:c', 0.000001, 5);
SELECT ratebucket.bucket_grantable('g:a') AS default_one,
	   ratebucket.bucket_grantable('g:a', 3) AS up_to_3,
	   ratebucket.bucket_grantable('g:a', 10) AS all_5;
SELECT allowed FROM ratebucket.bucket_take('g:a', 2);
SELECT ratebucket.bucket_grantable('g:a', 10) AS the_3_left,
	   ratebucket.bucket_grantable('acct:1', 10) AS empty,
	   ratebucket.bucket_grantable('q:day', 10) AS quota_used_up;
-- A striped endpoint: what its best stripe grants (s:hot's hold 2, 2, 2, 1).
SELECT ratebucket.bucket_grantable('s:hot', 8) AS best_stripe;

-- 0 in a cooldown and while paused; back after bucket_resume.
SELECT outcome FROM ratebucket.bucket_observe('g:b', 429, '60');
SELECT ratebucket.bucket_pause('g:c') AS paused;
SELECT ratebucket.bucket_grantable('g:b', 5) AS in_cooldown,
	   ratebucket.bucket_grantable('g:c', 5) AS paused;
SELECT ratebucket.bucket_resume('g:c') AS resumed;
SELECT ratebucket.bucket_grantable('g:c', 5) AS resumed;

-- NULL for a bucket that cannot be taken from by name: none, or a row
-- without a configuration.
SELECT ratebucket.bucket_grantable('nowhere', 5) IS NULL AS unknown_is_null,
	   ratebucket.bucket_grantable('adhoc', 5) IS NULL AS unconfigured_is_null;

-- It answers every time in one statement (bucket_claimable answers once
-- per endpoint and NULL after), and writes nothing.
SELECT pg_temp.fingerprint() AS before \gset
SELECT n, e AS endpoint, ratebucket.bucket_grantable(e, 4) AS grantable,
	   ratebucket.bucket_claimable(e, 4) AS claimable
FROM (VALUES (1, 'g:a'), (2, 'g:a'), (3, 'g:c'), (4, 'g:a'), (5, 'g:c')) AS v(n, e)
ORDER BY n;
SELECT pg_temp.fingerprint() = :'before' AS unchanged;

-- Bad input.
SELECT stmt, pg_temp.try(stmt) FROM (VALUES
	($$SELECT ratebucket.bucket_grantable('g:a', 0)$$),
	($$SELECT ratebucket.bucket_grantable('g:a', -1)$$),
	($$SELECT ratebucket.bucket_grantable('g:a', NULL)$$),
	($$SELECT ratebucket.bucket_grantable(NULL, 1)$$),
	($$SELECT ratebucket.bucket_grantable('', 1)$$),
	($$SELECT ratebucket.bucket_grantable(repeat('x', 1025), 1)$$)
) AS c(stmt);

-- Errors in full, as a user sees them in psql.
SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x', 'nowhere'], 1)]);
SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['s:hot', 'lane:x'], 1)]);
SELECT * FROM ratebucket.bucket_take_batch(ARRAY[pg_temp.req(ARRAY['lane:x'], -2)]);

-- Dropping by name leaves no cap, slot, bucket or striping behind (a
-- striped endpoint's drop takes its stripes, whose keys are too long to
-- name).
SELECT ratebucket.inflight_drop('acct');
SELECT count(*) AS slots_left FROM ratebucket.inflight_slots;
SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets
	  WHERE octet_length(endpoint) <= 1024) AS d;
SELECT count(*) AS rows_left FROM ratebucket.buckets;
SELECT count(*) AS striped_left FROM ratebucket.bucket_stripes;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were; pg_temp.req returns a type of the
-- extension).
DROP FUNCTION pg_temp.req(text[], int, text);
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
