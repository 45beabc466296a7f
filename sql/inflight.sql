--
-- inflight: at most cap deliveries in flight per key; slots acquired at
-- claim, released at the outcome, reclaimed when their lease runs out.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT ratebucket.inflight_configure('acct:1', 3, '1 hour');

-- Up to the cap, then nothing: an empty array, not an error.
SELECT ratebucket.inflight_acquire('acct:1', 2) AS first,
	   ratebucket.inflight_acquire('acct:1', 2) AS second,
	   ratebucket.inflight_acquire('acct:1') AS third;
SELECT key, cap, in_flight, expired FROM ratebucket.inflight_status;

-- Releasing frees its slots; releasing them again frees nothing.
SELECT ratebucket.inflight_release('acct:1', '{1, 2}') AS released,
	   ratebucket.inflight_release('acct:1', '{1, 2}') AS again;
SELECT ratebucket.inflight_acquire('acct:1', 5) AS acquired;

-- A rollback gives the slots back.
SELECT ratebucket.inflight_release('acct:1', ARRAY(SELECT slot FROM ratebucket.inflight_slots)) AS released;
BEGIN;
SELECT cardinality(ratebucket.inflight_acquire('acct:1', 3)) AS acquired;
ROLLBACK;
SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'acct:1';

-- A slot whose lease ran out (its worker died) is reclaimed by the next
-- acquire; renewing extends a lease still held, not an expired one.
SELECT ratebucket.inflight_configure('acct:2', 2, '1 second');
SELECT cardinality(ratebucket.inflight_acquire('acct:2', 2)) AS held;
SELECT cardinality(ratebucket.inflight_acquire('acct:2', 2)) AS while_held;
SELECT ratebucket.inflight_renew('acct:2', ARRAY(SELECT slot FROM ratebucket.inflight_slots
												WHERE key = 'acct:2' ORDER BY slot LIMIT 1),
								 '1 hour') AS renewed;
SELECT pg_sleep(1.2);
SELECT in_flight, expired FROM ratebucket.inflight_status WHERE key = 'acct:2';
SELECT cardinality(ratebucket.inflight_acquire('acct:2', 2)) AS after_expiry;
SELECT in_flight, expired FROM ratebucket.inflight_status WHERE key = 'acct:2';

-- A lower cap stops new slots and keeps those held; 0 holds everything back.
SELECT ratebucket.inflight_configure('acct:2', 0);
SELECT cardinality(ratebucket.inflight_acquire('acct:2')) AS at_cap_zero;
SELECT cap, in_flight FROM ratebucket.inflight_status WHERE key = 'acct:2';

-- Caps are configuration, carried by pg_dump; slots are not.
SELECT extconfig::regclass[] AS config_tables
FROM pg_extension WHERE extname = 'ratebucket';

-- Bad input: a clear error, and nothing changed.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
SELECT md5(coalesce(string_agg(c::text, '|' ORDER BY c.key), '') ||
		   coalesce((SELECT string_agg(s.key || s.slot || s.lease_until, '|' ORDER BY s.key, s.slot)
					 FROM ratebucket.inflight_slots s), '')) AS before
FROM ratebucket.inflight_caps c \gset
SELECT stmt, pg_temp.try(stmt) FROM (VALUES
	($$SELECT ratebucket.inflight_configure(NULL, 1)$$),
	($$SELECT ratebucket.inflight_configure('', 1)$$),
	($$SELECT ratebucket.inflight_configure(repeat('x', 1025), 1)$$),
	($$SELECT ratebucket.inflight_configure('acct:1', -1)$$),
	($$SELECT ratebucket.inflight_configure('acct:1', NULL)$$),
	($$SELECT ratebucket.inflight_configure('acct:1', 1, '0 s')$$),
	($$SELECT ratebucket.inflight_configure('acct:1', 1, '-1 s')$$),
	($$SELECT ratebucket.inflight_acquire('nowhere')$$),
	($$SELECT ratebucket.inflight_acquire(NULL)$$),
	($$SELECT ratebucket.inflight_acquire('acct:1', 0)$$),
	($$SELECT ratebucket.inflight_acquire('acct:1', NULL)$$),
	($$SELECT ratebucket.inflight_release('acct:1', NULL)$$),
	($$SELECT ratebucket.inflight_renew('acct:1', '{1}', '0 s')$$)
) AS c(stmt);
SELECT md5(coalesce(string_agg(c::text, '|' ORDER BY c.key), '') ||
		   coalesce((SELECT string_agg(s.key || s.slot || s.lease_until, '|' ORDER BY s.key, s.slot)
					 FROM ratebucket.inflight_slots s), '')) = :'before' AS unchanged
FROM ratebucket.inflight_caps c;

SELECT ratebucket.inflight_drop('acct:1'), ratebucket.inflight_drop('acct:2'),
	   ratebucket.inflight_drop('acct:2');
SELECT count(*) AS slots_left FROM ratebucket.inflight_slots;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
