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
	conf_floor_rate	float8,
	conf_throttle_factor float8,
	conf_recovery_factor float8,
	conf_breaker_failures int,
	configured_at	timestamptz,
	created_at		timestamptz NOT NULL,
	last_granted_at	timestamptz,
	takes_granted	bigint NOT NULL DEFAULT 0,
	tokens_granted	float8 NOT NULL DEFAULT 0,
	rate_factor		float8 NOT NULL DEFAULT 1,
	factor_at		timestamptz,
	cooldown_until	timestamptz,
	at_floor_since	timestamptz,
	paused_until	timestamptz,
	failure_run		int NOT NULL DEFAULT 0,
	breaker_trips	int NOT NULL DEFAULT 0,
	breaker_open_until timestamptz,
	probe_at		timestamptz,
	successes		bigint NOT NULL DEFAULT 0,
	failures		bigint NOT NULL DEFAULT 0,
	throttles		bigint NOT NULL DEFAULT 0,
	cooldowns		bigint NOT NULL DEFAULT 0,
	breaker_opens	bigint NOT NULL DEFAULT 0,
	malformed_headers bigint NOT NULL DEFAULT 0,
	last_status		int,
	last_observed_at timestamptz,
	CONSTRAINT buckets_pkey PRIMARY KEY (endpoint)
	-- No CHECK constraints, on purpose: the executor re-reads every CHECK
	-- expression from its stored text at the start of each statement, and
	-- each take runs its UPDATE as a statement of its own.  Five of them
	-- cost a third of a take's CPU (20.7k against 31.1k takes/s, 8 clients,
	-- synchronous_commit off).  Only the functions write this table, and
	-- they validate every input; the tests check every row's invariants.
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
'Tokens held at refilled_at; the tokens now are in bucket_status (see bucket_now).';
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
COMMENT ON COLUMN ratebucket.buckets.conf_floor_rate IS
'Configured floor of the effective rate (tokens/s); NULL: ratebucket.floor_fraction of the rate.';
COMMENT ON COLUMN ratebucket.buckets.conf_throttle_factor IS
'Configured multiplier on a 429; NULL: ratebucket.throttle_factor.';
COMMENT ON COLUMN ratebucket.buckets.conf_recovery_factor IS
'Configured recovery growth per interval; NULL: ratebucket.recovery_factor.';
COMMENT ON COLUMN ratebucket.buckets.conf_breaker_failures IS
'Configured consecutive failures that open the breaker; NULL: ratebucket.breaker_failures.';
COMMENT ON COLUMN ratebucket.buckets.rate_factor IS
'Multiplier on the rate set by feedback at factor_at; it recovers with time (see bucket_status.effective_rate).';
COMMENT ON COLUMN ratebucket.buckets.factor_at IS
'When rate_factor was last lowered.';
COMMENT ON COLUMN ratebucket.buckets.cooldown_until IS
'Takes are refused until then (Retry-After, a reset, or the default cooldown).';
COMMENT ON COLUMN ratebucket.buckets.at_floor_since IS
'When the effective rate last fell to its floor.';
COMMENT ON COLUMN ratebucket.buckets.paused_until IS
'Paused by bucket_pause until then (infinity: until bucket_resume).';
COMMENT ON COLUMN ratebucket.buckets.failure_run IS
'Consecutive failures observed.';
COMMENT ON COLUMN ratebucket.buckets.breaker_trips IS
'Times the breaker opened since it was last closed; each doubles the open period.';
COMMENT ON COLUMN ratebucket.buckets.breaker_open_until IS
'The circuit breaker is open until then, half-open after, closed when NULL.';
COMMENT ON COLUMN ratebucket.buckets.probe_at IS
'When the half-open breaker let its probe through.';
COMMENT ON COLUMN ratebucket.buckets.successes IS 'Successes observed (2xx).';
COMMENT ON COLUMN ratebucket.buckets.failures IS 'Failures observed (5xx, 408, no response).';
COMMENT ON COLUMN ratebucket.buckets.throttles IS 'Throttles observed (429).';
COMMENT ON COLUMN ratebucket.buckets.cooldowns IS 'Cooldowns started by feedback.';
COMMENT ON COLUMN ratebucket.buckets.breaker_opens IS 'Times the circuit breaker opened.';
COMMENT ON COLUMN ratebucket.buckets.malformed_headers IS
'Header values from the destination that could not be parsed.';
COMMENT ON COLUMN ratebucket.buckets.last_status IS 'Status of the last observed outcome (0: no response).';
COMMENT ON COLUMN ratebucket.buckets.last_observed_at IS 'When the last outcome was observed.';

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
	capacity float8,
	floor_rate float8 DEFAULT NULL,
	throttle_factor float8 DEFAULT NULL,
	recovery_factor float8 DEFAULT NULL,
	breaker_failures int DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_configure(text, float8, float8, float8, float8, float8, int) IS
'Store the endpoint''s rate (tokens/s) and capacity, used by bucket_take(endpoint, tokens), and optionally its feedback policy: the floor of its effective rate (tokens/s), the multiplier on a 429, the recovery growth per ratebucket.recovery_interval, the failures that open its breaker (NULL: the ratebucket.* setting). Tokens already earned are kept (cut to the new capacity); a new endpoint starts full.';

--
-- Feedback from destinations.
--
CREATE FUNCTION ratebucket.bucket_observe(
	endpoint text,
	status int,
	retry_after text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_observe(text, int, text, jsonb) IS
'Report what the destination answered: its HTTP status (0 or NULL: no response), its Retry-After, and its response headers as a jsonb object (rate-limit fields are read from it). Returns the outcome (success, throttled, unavailable, failure, neutral), the cooldown it started, the effective rate now and the breaker state. An endpoint without a bucket changes nothing (outcome is still reported).';

--
-- The header parsers bucket_observe uses, for users and tests to call.
--
CREATE FUNCTION ratebucket.parse_retry_after(
	value text,
	at timestamptz DEFAULT clock_timestamp())
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_parse_retry_after'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.parse_retry_after(text, timestamptz) IS
'Seconds from at until the retry time a Retry-After value names (RFC 9110): the delay-seconds (saturated at 1e9), or the HTTP-date minus at, negative for a date in the past. NULL when the value is NULL, blank or malformed.';

CREATE FUNCTION ratebucket.parse_rate_limit(
	headers jsonb,
	at timestamptz DEFAULT clock_timestamp(),
	OUT "limit" float8,
	OUT window_seconds float8,
	OUT remaining float8,
	OUT reset_seconds float8,
	OUT retry_after_seconds float8,
	OUT malformed int)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_parse_rate_limit'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.parse_rate_limit(jsonb, timestamptz) IS
'What a response''s headers (a jsonb object of name -> value, names in any case) say about the destination''s rate limit, as received at at: RateLimit and RateLimit-Policy (IETF drafts, both syntaxes), X-RateLimit-Limit/-Remaining/-Reset (or RateLimit-Limit/-Remaining/-Reset), Retry-After. Returns the limit per window, the window, the requests remaining, the seconds until the reset and until the Retry-After time (NULL when not given), and how many fields were given but malformed.';

CREATE FUNCTION ratebucket.bucket_pause(
	endpoint text,
	duration interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_pause'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_pause(text, interval) IS
'Refuse every take of the endpoint for duration, or until bucket_resume when NULL. Returns false if there is no such bucket.';

CREATE FUNCTION ratebucket.bucket_resume(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_resume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_resume(text) IS
'End a pause. Cooldowns and an open breaker are not affected (bucket_reset clears them). Returns false if there is no such bucket.';

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

CREATE FUNCTION ratebucket.bucket_now(
	b ratebucket.buckets,
	at timestamptz DEFAULT clock_timestamp(),
	OUT tokens float8,
	OUT effective_rate float8,
	OUT cooldown_seconds float8,
	OUT paused boolean,
	OUT breaker text,
	OUT breaker_seconds float8,
	OUT at_floor_since timestamptz,
	OUT expirable boolean)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_bucket_now'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.bucket_now(ratebucket.buckets, timestamptz) IS
'A bucket row as it stands at time at, with the settings in force: tokens, the effective rate (lowered by feedback, recovering), seconds of cooldown left, paused, the breaker state and seconds until it changes, since when the rate sits at its floor, and whether expiry may delete it.';

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
	-- Lock the candidates in endpoint order, skipping rows another
	-- transaction holds (a bucket being taken from is not idle): two
	-- expiries, or an expiry and a claim taking several buckets in
	-- endpoint order, never wait for each other in a cycle.  The locking
	-- re-checks the conditions against the newest version of each row.
	DELETE FROM ratebucket.buckets AS b
	USING (SELECT c.ctid AS tid
		   FROM ratebucket.buckets AS c
		   WHERE c.conf_rate IS NULL
			 AND c.refilled_at OPERATOR(pg_catalog.<=)
				 (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) idle)
			 AND (ratebucket.bucket_now(c, pg_catalog.clock_timestamp())).expirable
		   ORDER BY c.endpoint
		   FOR UPDATE SKIP LOCKED) AS v
	WHERE b.ctid OPERATOR(pg_catalog.=) v.tid;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END;
$$;

COMMENT ON FUNCTION ratebucket.bucket_expire(interval) IS
'Delete buckets that were not configured, have not been refilled for idle, are full now, and hold nothing learned from feedback (a lowered rate, a cooldown, a pause, an open breaker, a run of failures): a later take recreates them full, so expiry changes no decision. Returns the number deleted.';

--
-- Monitoring.
--
CREATE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   n.tokens,
	   n.effective_rate,
	   n.cooldown_seconds,
	   n.paused,
	   n.breaker,
	   n.breaker_seconds,
	   n.at_floor_since,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.conf_floor_rate,
	   b.last_granted_at AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(b.last_granted_at, b.created_at) AS idle,
	   b.takes_granted,
	   b.tokens_granted,
	   b.successes,
	   b.failures,
	   b.throttles,
	   b.cooldowns,
	   b.breaker_opens,
	   b.malformed_headers,
	   b.failure_run,
	   b.last_status,
	   b.last_observed_at,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at
FROM ratebucket.buckets AS b,
	 LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n;

COMMENT ON VIEW ratebucket.bucket_status IS
'One row per bucket: its limits, the tokens it holds now, its effective rate, cooldown, pause and breaker, its configuration, when it was last used, and its counters.';
COMMENT ON COLUMN ratebucket.bucket_status.tokens IS
'Tokens the bucket holds now (refilled to the current clock), not the stored value.';
COMMENT ON COLUMN ratebucket.bucket_status.effective_rate IS
'Tokens per second now: the rate, lowered by feedback and recovering toward it.';
COMMENT ON COLUMN ratebucket.bucket_status.cooldown_seconds IS
'Seconds of cooldown left (0: none).';
COMMENT ON COLUMN ratebucket.bucket_status.breaker IS
'closed, open or half-open.';
COMMENT ON COLUMN ratebucket.bucket_status.breaker_seconds IS
'Seconds until an open breaker turns half-open (0 otherwise).';
COMMENT ON COLUMN ratebucket.bucket_status.at_floor_since IS
'Since when the effective rate sits at its floor; NULL when above it. Alert on it.';
COMMENT ON COLUMN ratebucket.bucket_status.last_used IS
'Clock of the last granted take; NULL if none yet.';
COMMENT ON COLUMN ratebucket.bucket_status.idle IS
'Time since the last granted take (or since creation, if none).';

--
-- Privileges.  Nothing is open to PUBLIC but the pure functions: the
-- arithmetic, the header parsers, and bucket_now (which only computes from
-- a row its caller already has).  An
-- administrator grants roles what they need (see README, "Privileges"):
-- workers EXECUTE on bucket_take, bucket_ready and bucket_observe; operators
-- also bucket_configure, bucket_pause, bucket_resume, bucket_reset,
-- bucket_drop, bucket_expire; both SELECT on bucket_status.  The C functions reach the table as its owner, so no role
-- needs (or should get) privileges on ratebucket.buckets itself.
--
REVOKE ALL ON ALL TABLES IN SCHEMA ratebucket FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
	ratebucket.refill_tokens(float8, float8, float8, timestamptz, timestamptz),
	ratebucket.bucket_now(ratebucket.buckets, timestamptz),
	ratebucket.parse_retry_after(text, timestamptz),
	ratebucket.parse_rate_limit(jsonb, timestamptz)
	TO PUBLIC;
