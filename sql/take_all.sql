--
-- take_all: several buckets at once, all or nothing.
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

-- An endpoint's rate and its account's rate shared by all its endpoints.
-- Rates so low that nothing refills while this test runs.
SELECT ratebucket.bucket_configure('acct:7', 0.000001, 3);
SELECT ratebucket.bucket_configure('ep:a', 0.000001, 2);
SELECT ratebucket.bucket_configure('ep:b', 0.000001, 5);

-- Both grant: both are taken.  remaining is in the order named.
SELECT allowed, wait_seconds, remaining
FROM ratebucket.bucket_take_all(ARRAY['ep:a', 'acct:7']);
SELECT allowed, (SELECT array_agg(round(r::numeric, 3)) FROM unnest(remaining) r) AS remaining
FROM ratebucket.bucket_take_all(ARRAY['acct:7', 'ep:b'], ARRAY[1, 2]);
SELECT endpoint, takes_granted, tokens_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status ORDER BY endpoint;

-- The account has 1 token left: a take of 2 from it and ep:b is refused,
-- and neither changes (ep:b alone would have granted).
SELECT allowed, wait_seconds > 900000 AS waits_for_the_account,
       (SELECT array_agg(round(r::numeric, 3)) FROM unnest(remaining) r) AS remaining
FROM ratebucket.bucket_take_all(ARRAY['ep:b', 'acct:7'], ARRAY[1, 2]);
SELECT endpoint, takes_granted, tokens_granted, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status ORDER BY endpoint;

-- wait_seconds is until all of them could grant: the longest wait.
SELECT ratebucket.bucket_configure('slow', 1, 1);
SELECT ratebucket.bucket_configure('fast', 10, 1);
SELECT allowed FROM ratebucket.bucket_take_all(ARRAY['slow', 'fast']);
SELECT allowed, wait_seconds BETWEEN 0.9 AND 1.0 AS waits_for_the_slower
FROM ratebucket.bucket_take_all(ARRAY['fast', 'slow']);

-- A rollback gives every bucket its tokens back.
BEGIN;
SELECT allowed FROM ratebucket.bucket_take_all(ARRAY['ep:b', 'acct:7']);
ROLLBACK;
SELECT endpoint, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint IN ('ep:b', 'acct:7') ORDER BY endpoint;

-- A cooldown on one of them refuses the whole take.
SELECT outcome FROM ratebucket.bucket_observe('ep:b', 429, '600');
SELECT allowed, wait_seconds > 500 AS waits_out_the_cooldown
FROM ratebucket.bucket_take_all(ARRAY['ep:b', 'acct:7']);

-- Bad input: a clear error, and no row changed.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
SELECT md5(string_agg(b::text, '|' ORDER BY b.endpoint)) AS before FROM ratebucket.buckets b \gset
SELECT stmt, pg_temp.try(stmt) FROM (VALUES
	($$SELECT ratebucket.bucket_take_all(NULL)$$),
	($$SELECT ratebucket.bucket_take_all('{}')$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a', NULL])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a', ''])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a', 'ep:a'])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a', 'nowhere'])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a'], ARRAY[1, 2])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a'], ARRAY[NULL::float8])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a'], ARRAY['NaN'::float8])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a'], ARRAY[0])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['ep:a'], ARRAY[3])$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY[['ep:a'], ['ep:b']])$$),
	($$SELECT ratebucket.bucket_take_all(array_fill('x'::text, ARRAY[65]))$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY[repeat('x', 1025)])$$)
) AS c(stmt);
SELECT md5(string_agg(b::text, '|' ORDER BY b.endpoint)) = :'before' AS unchanged
FROM ratebucket.buckets b;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
