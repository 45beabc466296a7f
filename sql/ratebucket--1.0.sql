/* ratebucket--1.0.sql: transactional token buckets */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION ratebucket" to load this file. \quit

--
-- The bucket table: one row per endpoint.
--
-- A take changes only tokens, refilled_at, last_granted_at and the counters,
-- none of which is indexed, so every take is a HOT update; the fillfactor
-- leaves room on each page for the new row versions, and autovacuum is told
-- to visit this small, hot table often.  Nothing here is read through the
-- caller's search_path: the C code names ratebucket.buckets explicitly.
--
CREATE TABLE ratebucket.buckets (
	endpoint		text NOT NULL,
	rate			float8 NOT NULL,
	capacity		float8 NOT NULL,
	tokens			float8 NOT NULL,
	refilled_at		timestamptz NOT NULL,
	conf_rate		float8,
	conf_capacity	float8,
	configured_at	timestamptz,
	created_at		timestamptz NOT NULL,
	last_granted_at	timestamptz,
	takes_granted	bigint NOT NULL DEFAULT 0,
	tokens_granted	float8 NOT NULL DEFAULT 0,
	CONSTRAINT buckets_pkey PRIMARY KEY (endpoint),
	CONSTRAINT buckets_endpoint_check
		CHECK (octet_length(endpoint) BETWEEN 1 AND 1024),
	CONSTRAINT buckets_limits_check
		CHECK (rate > 0 AND capacity > 0
			   AND rate <= 1e12 AND capacity <= 1e12),
	CONSTRAINT buckets_tokens_check
		CHECK (tokens >= 0 AND tokens <= capacity),
	CONSTRAINT buckets_conf_check
		CHECK ((conf_rate IS NULL) = (conf_capacity IS NULL)
			   AND (conf_rate IS NULL) = (configured_at IS NULL))
) WITH (
	fillfactor = 50,
	autovacuum_vacuum_scale_factor = 0.0,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_cost_delay = 0,
	autovacuum_analyze_scale_factor = 0.05
);

COMMENT ON TABLE ratebucket.buckets IS
'One token bucket per endpoint. Change it only through the ratebucket functions.';
COMMENT ON COLUMN ratebucket.buckets.endpoint IS
'The key the bucket limits: a destination URL, host, or any name (1 to 1024 bytes).';
COMMENT ON COLUMN ratebucket.buckets.rate IS
'Tokens per second in force: the rate of the last take, or the configured rate.';
COMMENT ON COLUMN ratebucket.buckets.capacity IS
'Largest number of tokens the bucket holds (the burst), as of the last take or configuration.';
COMMENT ON COLUMN ratebucket.buckets.tokens IS
'Tokens held at refilled_at; the tokens now are refill_tokens(tokens, rate, capacity, refilled_at, clock_timestamp()).';
COMMENT ON COLUMN ratebucket.buckets.refilled_at IS
'Clock of the last refill; it never moves backwards.';
COMMENT ON COLUMN ratebucket.buckets.conf_rate IS
'Rate stored by bucket_configure, used by bucket_take(endpoint, tokens); NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.conf_capacity IS
'Capacity stored by bucket_configure; NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.configured_at IS
'When bucket_configure last changed this endpoint; NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.created_at IS
'When the row was created (first take or configuration).';
COMMENT ON COLUMN ratebucket.buckets.last_granted_at IS
'Clock of the last granted take; NULL if none yet.';
COMMENT ON COLUMN ratebucket.buckets.takes_granted IS
'Number of granted takes since the row was created.';
COMMENT ON COLUMN ratebucket.buckets.tokens_granted IS
'Sum of the tokens granted since the row was created.';

-- Configured endpoints are user data: pg_dump keeps them (runtime state included).
SELECT pg_catalog.pg_extension_config_dump('ratebucket.buckets',
										   'WHERE conf_rate IS NOT NULL');

--
-- Taking tokens.  Each call runs SQL of its own: the COST tells the planner
-- to evaluate a query's cheaper conditions (status = 'pending', say) first.
--
CREATE FUNCTION ratebucket.bucket_take(
	endpoint text,
	rate float8,
	capacity float8,
	tokens float8 DEFAULT 1,
	OUT allowed boolean,
	OUT remaining float8,
	OUT wait_seconds float8)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take(text, float8, float8, float8) IS
'Refill the endpoint''s bucket at rate tokens/s up to capacity, then take tokens if it holds them, under the row lock; a new endpoint starts full. Returns allowed, the tokens remaining, and the seconds to wait before tokens would be available (0 when allowed).';

CREATE FUNCTION ratebucket.bucket_take(
	endpoint text,
	tokens float8 DEFAULT 1,
	OUT allowed boolean,
	OUT remaining float8,
	OUT wait_seconds float8)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take_configured'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take(text, float8) IS
'bucket_take with the rate and capacity stored by bucket_configure; an endpoint that was never configured is an error.';

CREATE FUNCTION ratebucket.bucket_ready(
	endpoint text,
	tokens float8 DEFAULT 1)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_ready'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_ready(text, float8) IS
'True if a take of tokens would be granted now, judged from the last committed state. Never consumes, never writes, never waits for a lock; an unknown endpoint is ready.';

--
-- Administration.
--
CREATE FUNCTION ratebucket.bucket_configure(
	endpoint text,
	rate float8,
	capacity float8)
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_configure(text, float8, float8) IS
'Store the endpoint''s rate (tokens/s) and capacity, used by bucket_take(endpoint, tokens). Tokens already earned are kept (cut to the new capacity); a new endpoint starts full.';

CREATE FUNCTION ratebucket.bucket_reset(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_reset(text) IS
'Fill the endpoint''s bucket to capacity, keeping its configuration. Returns false if there is no such bucket.';

CREATE FUNCTION ratebucket.bucket_drop(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_drop(text) IS
'Delete the endpoint''s bucket and its configuration. Returns false if there was none.';

--
-- Pure arithmetic, the same the takes use: exposed for the status view and
-- for checking the arithmetic at an explicit time.
--
CREATE FUNCTION ratebucket.refill_tokens(
	tokens float8,
	rate float8,
	capacity float8,
	refilled_at timestamptz,
	at timestamptz)
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_refill_tokens'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.refill_tokens(float8, float8, float8, timestamptz, timestamptz) IS
'Tokens a bucket holding tokens at refilled_at holds at time at: min(capacity, tokens + rate * seconds elapsed); a time before refilled_at refills nothing.';

CREATE FUNCTION ratebucket.bucket_expire(idle interval DEFAULT '1 hour')
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint;
BEGIN
	IF idle IS NULL OR idle OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'idle must be a non-negative interval'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- A concurrent take holds the row lock; DELETE waits for it and then
	-- re-checks these conditions against the row it left behind.
	DELETE FROM ratebucket.buckets AS b
	WHERE b.conf_rate IS NULL
	  AND b.refilled_at OPERATOR(pg_catalog.<=)
		  (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) idle)
	  AND ratebucket.refill_tokens(b.tokens, b.rate, b.capacity,
								   b.refilled_at, pg_catalog.clock_timestamp())
		  OPERATOR(pg_catalog.>=) b.capacity;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END;
$$;

COMMENT ON FUNCTION ratebucket.bucket_expire(interval) IS
'Delete buckets that were not configured, have not been refilled for idle, and are full now: a later take recreates them full, so expiry changes no decision. Returns the number deleted.';

--
-- Monitoring.
--
CREATE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   ratebucket.refill_tokens(b.tokens, b.rate, b.capacity, b.refilled_at,
								pg_catalog.clock_timestamp()) AS tokens,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.last_granted_at AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(b.last_granted_at, b.created_at) AS idle,
	   b.takes_granted,
	   b.tokens_granted,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at
FROM ratebucket.buckets AS b;

COMMENT ON VIEW ratebucket.bucket_status IS
'One row per bucket: its limits, the tokens it holds now, its configuration, when it was last used, and its counters.';
COMMENT ON COLUMN ratebucket.bucket_status.tokens IS
'Tokens the bucket holds now (refilled to the current clock), not the stored value.';
COMMENT ON COLUMN ratebucket.bucket_status.last_used IS
'Clock of the last granted take; NULL if none yet.';
COMMENT ON COLUMN ratebucket.bucket_status.idle IS
'Time since the last granted take (or since creation, if none).';

--
-- Privileges.  Nothing is open to PUBLIC but the pure arithmetic.  An
-- administrator grants roles what they need (see README, "Privileges"):
-- workers EXECUTE on bucket_take and bucket_ready; operators also
-- bucket_configure, bucket_reset, bucket_drop, bucket_expire and SELECT on
-- bucket_status.  The C functions reach the table as its owner, so no role
-- needs (or should get) privileges on ratebucket.buckets itself.
--
REVOKE ALL ON ALL TABLES IN SCHEMA ratebucket FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
	ratebucket.refill_tokens(float8, float8, float8, timestamptz, timestamptz)
	TO PUBLIC;
