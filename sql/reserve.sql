--
-- reserve: token reserves (bucket_reserve) on a server that does not
-- preload ratebucket, as the regression server does not: giving one is
-- refused with its reason and changes nothing, taking one away (there is
-- none) works, takes are as before, and the other checks come first or
-- after as documented.  The reserves themselves need a preloaded server:
-- test/t/017_reserve.pl starts one.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

\set VERBOSITY default
SELECT ratebucket.bucket_configure('hot', 100, 200);
SELECT allowed, remaining FROM ratebucket.bucket_take('hot');
CREATE TEMP TABLE before AS SELECT * FROM ratebucket.buckets;

-- not preloaded: refused with 55000, a detail and a hint
\set VERBOSITY sqlstate
SELECT ratebucket.bucket_reserve('hot', 10);
\set VERBOSITY default
SELECT ratebucket.bucket_reserve('hot', 10);
-- the argument checks come first
SELECT ratebucket.bucket_reserve('hot', 0);
SELECT ratebucket.bucket_reserve('hot', 1000001);
SELECT ratebucket.bucket_reserve(NULL, 10);
SELECT ratebucket.bucket_reserve('', 10);
-- nothing changed
SELECT count(*) AS changed
FROM (SELECT * FROM ratebucket.buckets EXCEPT SELECT * FROM before) AS d;
SELECT reserve IS NULL AS no_reserve FROM ratebucket.buckets WHERE endpoint = 'hot';

-- taking away a reserve there is none of: NULL back; an endpoint not
-- configured is still an error
SELECT ratebucket.bucket_reserve('hot', NULL) AS had;
SELECT ratebucket.bucket_reserve('nobody', NULL) AS had;
-- no reserve is listed, takes are as before
SELECT count(*) AS reserves FROM ratebucket.bucket_reserves();
SELECT allowed FROM ratebucket.bucket_take('hot');
SELECT takes_granted, reserve FROM ratebucket.buckets WHERE endpoint = 'hot';

-- closed to PUBLIC like every administration function
SELECT has_function_privilege('public', 'ratebucket.bucket_reserve(text, int)', 'EXECUTE') AS public_reserve,
	   has_function_privilege('public', 'ratebucket.bucket_reserves()', 'EXECUTE') AS public_reserves;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP TABLE before;
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
