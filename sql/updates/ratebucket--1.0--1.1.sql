/* ratebucket--1.0--1.1.sql: the claim helpers. */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.1'" to load this file. \quit

--
-- Takes of a batch: as many whole tokens as the bucket holds, up to a
-- maximum, in one row update.
--
CREATE FUNCTION ratebucket.bucket_take_upto(
	endpoint text,
	rate float8,
	capacity float8,
	max_tokens int,
	OUT granted int,
	OUT remaining float8,
	OUT wait_seconds float8)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take_upto'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take_upto(text, float8, float8, int) IS
'Like bucket_take, but takes as many whole tokens as the bucket holds, from 1 up to max_tokens (one while a half-open breaker waits for its probe), in one row update. Returns granted (0 when refused), the tokens remaining, and the seconds until the next token could be granted (0 when all max_tokens were).';

CREATE FUNCTION ratebucket.bucket_take_upto(
	endpoint text,
	max_tokens int,
	OUT granted int,
	OUT remaining float8,
	OUT wait_seconds float8)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take_upto_configured'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take_upto(text, int) IS
'bucket_take_upto with the rate and capacity stored by bucket_configure; an endpoint that was never configured is an error.';

--
-- The lock-free filter of a claim.  VOLATILE: it remembers, for one
-- execution of the statement, which endpoints it has answered for.  A high
-- cost, so that the planner evaluates every cheaper condition first.
--
CREATE FUNCTION ratebucket.bucket_claimable(
	endpoint text,
	per_endpoint int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_claimable'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 50;

COMMENT ON FUNCTION ratebucket.bucket_claimable(text, int) IS
'For a claim query: how many events of this endpoint it may lock. The first call for an endpoint in one execution of a statement answers the whole tokens its bucket holds now, at most per_endpoint (from the last committed state, without locking; 0 in a cooldown, a pause or an open breaker, 1 while half-open); later calls for it in the same execution answer NULL.';

REVOKE ALL ON FUNCTION
	ratebucket.bucket_take_upto(text, float8, float8, int),
	ratebucket.bucket_take_upto(text, int),
	ratebucket.bucket_claimable(text, int)
	FROM PUBLIC;

--
-- How long until a take would be granted: the peek behind a worker's sleep.
--
CREATE FUNCTION ratebucket.bucket_wait(
	endpoint text,
	tokens float8 DEFAULT 1)
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_wait'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_wait(text, float8) IS
'Seconds until a take of tokens would be granted (0: now), judged like bucket_ready from the last committed state: never consumes, never writes, never waits for a lock; an unknown endpoint is ready.';

REVOKE ALL ON FUNCTION ratebucket.bucket_wait(text, float8) FROM PUBLIC;

--
-- Several limits at once: all or nothing.
--
CREATE FUNCTION ratebucket.bucket_take_all(
	endpoints text[],
	tokens float8[] DEFAULT NULL,
	OUT allowed boolean,
	OUT wait_seconds float8,
	OUT remaining float8[])
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take_all'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 200;

COMMENT ON FUNCTION ratebucket.bucket_take_all(text[], float8[]) IS
'Take tokens (default 1 each) from several configured buckets at once, all or nothing: every row is locked first, in byte order of the endpoints whatever order they are named in (so two such takes cannot deadlock), then each decides as bucket_take would; either all grant and all are written, or none is. Returns allowed, wait_seconds (until all of them could grant; 0 when allowed) and each bucket''s remaining tokens, in the order given.';

REVOKE ALL ON FUNCTION ratebucket.bucket_take_all(text[], float8[]) FROM PUBLIC;

--
-- In-flight caps: at most cap deliveries in flight per key (an account, say).
-- A slot is acquired when a delivery is claimed and released when its
-- outcome is recorded; a slot whose lease ran out (its worker died) is
-- reclaimed by the next acquire, so none leaks.  The functions run as the
-- extension's owner (SECURITY DEFINER, a fixed search_path, every operator
-- schema-qualified), so no role needs privileges on the tables.
--
CREATE TABLE ratebucket.inflight_caps (
	key text PRIMARY KEY,
	cap int NOT NULL,
	lease interval NOT NULL,
	configured_at timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.inflight_caps IS
'One row per key with an in-flight cap: at most cap slots held at once, each for at most lease unless renewed. Written only by inflight_configure and inflight_drop.';

CREATE TABLE ratebucket.inflight_slots (
	key text NOT NULL,
	slot bigint GENERATED ALWAYS AS IDENTITY,
	acquired_at timestamptz NOT NULL,
	lease_until timestamptz NOT NULL,
	PRIMARY KEY (key, slot)
);

COMMENT ON TABLE ratebucket.inflight_slots IS
'The slots held now: one row per delivery in flight, until inflight_release, or until lease_until when the next inflight_acquire of its key reclaims it.';

-- Caps are configuration (dumped); slots are runtime state (not dumped).
SELECT pg_catalog.pg_extension_config_dump('ratebucket.inflight_caps', '');

CREATE FUNCTION ratebucket.inflight_configure(
	key text,
	cap int,
	lease interval DEFAULT '5 minutes')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF key IS NULL OR cap IS NULL OR lease IS NULL THEN
		RAISE EXCEPTION 'key, cap and lease must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF pg_catalog.length(key) OPERATOR(pg_catalog.=) 0
	   OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 1024 THEN
		RAISE EXCEPTION 'key must be 1 to 1024 bytes'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF cap OPERATOR(pg_catalog.<) 0 THEN
		RAISE EXCEPTION 'cap must not be negative'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value given was %s.', cap);
	END IF;
	IF lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'lease must be a positive interval'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO ratebucket.inflight_caps AS c (key, cap, lease, configured_at)
	VALUES (key, cap, lease, pg_catalog.clock_timestamp())
	ON CONFLICT ON CONSTRAINT inflight_caps_pkey DO UPDATE
	SET cap = excluded.cap, lease = excluded.lease, configured_at = excluded.configured_at;
END;
$$;

COMMENT ON FUNCTION ratebucket.inflight_configure(text, int, interval) IS
'Allow at most cap slots of key in flight at once, each held for at most lease unless renewed (cap 0 holds everything back). Slots already held are kept; a lower cap only stops new ones.';

CREATE FUNCTION ratebucket.inflight_acquire(key text, n int DEFAULT 1)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c ratebucket.inflight_caps;
	now timestamptz;
	held int;
	k int;
	slots bigint[];
BEGIN
	IF key IS NULL OR n IS NULL THEN
		RAISE EXCEPTION 'key and n must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF n OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'n must be at least 1'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = pg_catalog.format('The value given was %s.', n);
	END IF;
	-- The cap's row serialises the acquires of one key until commit.  An
	-- update rather than a lock: under REPEATABLE READ a concurrent acquire
	-- then fails with a serialization error instead of counting the slots
	-- from its older snapshot.
	UPDATE ratebucket.inflight_caps AS ic SET cap = ic.cap
	WHERE ic.key OPERATOR(pg_catalog.=) inflight_acquire.key
	RETURNING ic.* INTO c;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'key "%" has no in-flight cap', key
			USING ERRCODE = 'undefined_object',
				  HINT = 'Call ratebucket.inflight_configure(key, cap) first.';
	END IF;
	now := pg_catalog.clock_timestamp();
	-- A slot whose lease ran out belongs to a worker that died or hung.
	DELETE FROM ratebucket.inflight_slots AS s
	WHERE s.key OPERATOR(pg_catalog.=) inflight_acquire.key
	  AND s.lease_until OPERATOR(pg_catalog.<=) now;
	SELECT pg_catalog.count(*)::int INTO held
	FROM ratebucket.inflight_slots AS s
	WHERE s.key OPERATOR(pg_catalog.=) inflight_acquire.key;
	k := LEAST(n, c.cap OPERATOR(pg_catalog.-) held);
	IF k OPERATOR(pg_catalog.<=) 0 THEN
		RETURN '{}'::bigint[];
	END IF;
	WITH ins AS (
		INSERT INTO ratebucket.inflight_slots (key, acquired_at, lease_until)
		SELECT inflight_acquire.key, now, now OPERATOR(pg_catalog.+) c.lease
		FROM pg_catalog.generate_series(1, k)
		RETURNING slot)
	SELECT pg_catalog.array_agg(ins.slot ORDER BY ins.slot) INTO slots FROM ins;
	RETURN slots;
END;
$$;

COMMENT ON FUNCTION ratebucket.inflight_acquire(text, int) IS
'Acquire up to n slots of key, as many as its cap leaves free (after reclaiming slots whose lease ran out). Returns their ids, an empty array if none is free. The acquires of one key wait for each other until commit; a rollback gives the slots back.';

CREATE FUNCTION ratebucket.inflight_release(key text, slots bigint[])
RETURNS int
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n int;
BEGIN
	IF key IS NULL OR slots IS NULL THEN
		RAISE EXCEPTION 'key and slots must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	DELETE FROM ratebucket.inflight_slots AS s
	WHERE s.key OPERATOR(pg_catalog.=) inflight_release.key
	  AND s.slot OPERATOR(pg_catalog.=) ANY (slots);
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END;
$$;

COMMENT ON FUNCTION ratebucket.inflight_release(text, bigint[]) IS
'Release slots of key (when their deliveries'' outcomes are recorded). Returns how many were still held: a slot whose lease ran out may already have been reclaimed.';

CREATE FUNCTION ratebucket.inflight_renew(key text, slots bigint[], lease interval DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n int;
BEGIN
	IF key IS NULL OR slots IS NULL THEN
		RAISE EXCEPTION 'key and slots must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'lease must be a positive interval'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	UPDATE ratebucket.inflight_slots AS s
	SET lease_until = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
		COALESCE(inflight_renew.lease, c.lease)
	FROM ratebucket.inflight_caps AS c
	WHERE c.key OPERATOR(pg_catalog.=) s.key
	  AND s.key OPERATOR(pg_catalog.=) inflight_renew.key
	  AND s.slot OPERATOR(pg_catalog.=) ANY (slots)
	  AND s.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END;
$$;

COMMENT ON FUNCTION ratebucket.inflight_renew(text, bigint[], interval) IS
'Extend the lease of slots of key still held, by lease from now (NULL: the cap''s lease), for a delivery that takes longer than its lease. Returns how many were renewed; an expired slot is not.';

CREATE FUNCTION ratebucket.inflight_drop(key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	found_cap boolean;
BEGIN
	-- The cap's row first: an acquire in progress holds it, so its slots
	-- are committed (or gone) before the slots are deleted.
	DELETE FROM ratebucket.inflight_caps AS c
	WHERE c.key OPERATOR(pg_catalog.=) inflight_drop.key;
	found_cap := FOUND;
	DELETE FROM ratebucket.inflight_slots AS s
	WHERE s.key OPERATOR(pg_catalog.=) inflight_drop.key;
	RETURN found_cap;
END;
$$;

COMMENT ON FUNCTION ratebucket.inflight_drop(text) IS
'Forget the in-flight cap of key and every slot it holds. False if there was none.';

CREATE VIEW ratebucket.inflight_status AS
SELECT c.key,
	   c.cap,
	   c.lease,
	   pg_catalog.count(s.slot) FILTER (
		   WHERE s.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS in_flight,
	   pg_catalog.count(s.slot) FILTER (
		   WHERE s.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS expired,
	   pg_catalog.min(s.acquired_at) AS oldest,
	   c.configured_at
FROM ratebucket.inflight_caps AS c
LEFT JOIN ratebucket.inflight_slots AS s ON s.key OPERATOR(pg_catalog.=) c.key
GROUP BY c.key, c.cap, c.lease, c.configured_at;

COMMENT ON VIEW ratebucket.inflight_status IS
'One row per in-flight cap: the cap, the lease, the slots held (in_flight), those whose lease ran out and that the next acquire will reclaim (expired), and when the oldest slot was acquired.';

REVOKE ALL ON ratebucket.inflight_caps, ratebucket.inflight_slots, ratebucket.inflight_status FROM PUBLIC;
REVOKE ALL ON FUNCTION
	ratebucket.inflight_configure(text, int, interval),
	ratebucket.inflight_acquire(text, int),
	ratebucket.inflight_release(text, bigint[]),
	ratebucket.inflight_renew(text, bigint[], interval),
	ratebucket.inflight_drop(text)
	FROM PUBLIC;
