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
