/* ratebucket--1.4--1.5.sql */

-- ratebucket 1.4 -> 1.5: feedback that finds a destination's limit.
--
-- The table gets the throttle episode's return level, its burst, and the
-- limit a destination published; bucket_observe gets a form with the
-- request's send time, which judges whether a 429 starts a new episode.  The
-- library reads a row that lacks the new columns as having none of them,
-- so the old functions keep working until this update runs.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.5'" to load this file. \quit

ALTER TABLE ratebucket.buckets
	ADD COLUMN target_factor float8,
	ADD COLUMN burst_factor float8,
	ADD COLUMN limit_factor float8,
	ADD COLUMN limit_burst_factor float8;

COMMENT ON COLUMN ratebucket.buckets.rate_factor IS
'Multiplier on the rate set by the last throttle episode, in force until factor_at; it then returns to target_factor and climbs above it (see bucket_status.effective_rate).';
COMMENT ON COLUMN ratebucket.buckets.factor_at IS
'When the effective rate starts its return: the end of the last throttle episode''s cooldown.';
COMMENT ON COLUMN ratebucket.buckets.target_factor IS
'Multiplier on the rate that the effective rate returns to after the last throttle episode; NULL: rate_factor.';
COMMENT ON COLUMN ratebucket.buckets.burst_factor IS
'Multiplier on the capacity set by the last throttle episode, as of factor_at; it grows back with time. NULL: 1.';
COMMENT ON COLUMN ratebucket.buckets.limit_factor IS
'The rate the destination published (RateLimit-Policy, X-RateLimit-Limit with a window), over the rate; the effective rate never exceeds it. NULL: none published.';
COMMENT ON COLUMN ratebucket.buckets.limit_burst_factor IS
'The burst the destination published, over the capacity; the capacity in force never exceeds it. NULL: none published.';

-- bucket_observe with the request's send time: a second form, with all
-- five arguments (defaults would make the calls of the four-argument form
-- ambiguous).  Like every object an update adds, granted to no one.
CREATE FUNCTION ratebucket.bucket_observe(
	endpoint text,
	status int,
	retry_after text,
	headers jsonb,
	sent_at timestamptz,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

REVOKE ALL ON FUNCTION ratebucket.bucket_observe(text, int, text, jsonb, timestamptz) FROM PUBLIC;

COMMENT ON FUNCTION ratebucket.bucket_observe(text, int, text, jsonb, timestamptz) IS
'bucket_observe with the time the request was sent (NULL: not known): a 429 to a request sent before the last throttle episode''s cooldown ended lowers the effective rate no further, however late it is recorded.';
