/* ratebucket--1.2--1.3.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.3'" to load this file. \quit

-- A claim that honours every limit of its events
--
-- An event may answer to more than its endpoint: its account's rate, a lane,
-- a daily quota, an in-flight cap.  A claim filters, before locking, on a
-- peek of each of those buckets (bucket_grantable: unlike bucket_claimable
-- it answers every time, since endpoints share their account), and grants
-- its whole batch in one bucket_take_batch: every bucket of the batch
-- locked once in byte order, every request granted as many tokens as all of
-- its buckets hold, and slots of its cap, in the same transaction.
--
CREATE FUNCTION ratebucket.bucket_grantable(
	endpoint text,
	max_tokens int DEFAULT 1)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_grantable'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_grantable(text, int) IS
'How many whole tokens, up to max_tokens, a take of this configured bucket would be granted now, judged from the last committed state without locking or writing (0 in a cooldown, a pause or an open breaker); NULL if the endpoint is not configured. For a claim''s filter on the buckets its events share (an account, a quota).';

-- The claim's filter, telling in the same peek an endpoint without a
-- configuration (NULL, like one already seen) from one without tokens (0).
CREATE FUNCTION ratebucket.bucket_claimable(
	endpoint text,
	per_endpoint int,
	configured_only boolean)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_claimable'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 50;

COMMENT ON FUNCTION ratebucket.bucket_claimable(text, int, boolean) IS
'bucket_claimable(endpoint, per_endpoint), where with configured_only an endpoint that has no configuration (no row, or a row only explicit takes made) answers NULL, as an endpoint already seen does, instead of per_endpoint: a claim passes over its events without counting it.';

CREATE TYPE ratebucket.batch_request AS (
	buckets text[],
	tokens int,
	inflight_key text
);

COMMENT ON TYPE ratebucket.batch_request IS
'One request of a bucket_take_batch: up to tokens tokens from every one of buckets (configured, not striped), and with inflight_key (optional) as many slots of that in-flight cap.';

CREATE FUNCTION ratebucket.bucket_take_batch(
	requests ratebucket.batch_request[])
RETURNS TABLE (
	request int,
	granted int,
	wait_seconds float8,
	slots bigint[])
AS 'MODULE_PATHNAME', 'ratebucket_take_batch'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE COST 500 ROWS 10;

COMMENT ON FUNCTION ratebucket.bucket_take_batch(ratebucket.batch_request[]) IS
'Grant a batch of requests at once, as a claim does for its events: every bucket named is locked first, once, in byte order of its key (as bucket_take_all locks, so they cannot deadlock); then, with one clock, each request in the order given is granted as many whole tokens as every one of its buckets still holds, up to its tokens, and takes them from each; a request with an in-flight cap keeps only as many as inflight_acquire gives it slots. One row per request: its position, granted, wait_seconds (until all its buckets could grant one more; 0 if they can now) and the slots it holds. One row update per bucket; a rollback gives back every token and slot.';

-- inflight_acquire no longer waits for a late release of an expired slot
-- (see the comment in its body); otherwise unchanged.
CREATE OR REPLACE FUNCTION ratebucket.inflight_acquire(key text, n int DEFAULT 1)
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
	-- One that another transaction is deleting (a late release) is left
	-- to it and counted as held: waiting for that transaction, while a
	-- claim holds bucket rows its release may want next, could deadlock.
	DELETE FROM ratebucket.inflight_slots AS s
	WHERE s.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
		SELECT x.ctid FROM ratebucket.inflight_slots AS x
		WHERE x.key OPERATOR(pg_catalog.=) inflight_acquire.key
		  AND x.lease_until OPERATOR(pg_catalog.<=) now
		FOR UPDATE SKIP LOCKED));
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
'Acquire up to n slots of key, as many as its cap leaves free (after reclaiming slots whose lease ran out; one that another transaction is releasing is not waited for and counts as held). Returns their ids, an empty array if none is free. The acquires of one key wait for each other until commit; a rollback gives the slots back.';

REVOKE ALL ON FUNCTION
	ratebucket.bucket_claimable(text, int, boolean),
	ratebucket.bucket_grantable(text, int),
	ratebucket.bucket_take_batch(ratebucket.batch_request[])
	FROM PUBLIC;
