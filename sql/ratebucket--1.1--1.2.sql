/* ratebucket--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.2'" to load this file. \quit

-- Calendar quotas
--
-- A quota is a bucket whose tokens do not refill at a rate: the quota is
-- given back in full at each boundary of its period (hour, day, week,
-- month) in a named time zone.  It is a row of ratebucket.buckets, with
-- conf_rate 0 and conf_capacity the quota, so every take, peek and claim
-- helper works on it, bucket_take_all included.  The C library reads these
-- columns when they exist and does without them before this update.
--
ALTER TABLE ratebucket.buckets
	ADD COLUMN quota_period text,
	ADD COLUMN quota_time_zone text;

COMMENT ON COLUMN ratebucket.buckets.quota_period IS
'For a calendar quota (bucket_configure_quota): hour, day, week or month; NULL for a rate bucket.';
COMMENT ON COLUMN ratebucket.buckets.quota_time_zone IS
'For a calendar quota: the time zone whose calendar its windows follow; NULL for a rate bucket.';

CREATE FUNCTION ratebucket.bucket_configure_quota(
	endpoint text,
	quota float8,
	period text,
	time_zone text DEFAULT 'UTC')
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_configure_quota'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_configure_quota(text, float8, text, text) IS
'Make the endpoint''s bucket a calendar quota: quota tokens per hour, day, week (from Monday) or month of time_zone (a zone of the time zone database; windows follow its wall clock, so a day can last 23 or 25 hours), all given back at each boundary. Taken with bucket_take(endpoint, tokens), bucket_take_upto(endpoint, max_tokens) and bucket_take_all; a refusal waits until the window resets. What was used in the current window is kept; bucket_configure makes it a rate bucket again.';

CREATE FUNCTION ratebucket.quota_window(
	period text,
	time_zone text,
	at timestamptz DEFAULT clock_timestamp(),
	OUT window_start timestamptz,
	OUT resets_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_quota_window'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.quota_window(text, text, timestamptz) IS
'The window of a quota''s period (hour, day, week, month) in time_zone that contains at: when it started and when the quota resets. The arithmetic the takes use, for checking it at an explicit time.';

CREATE FUNCTION ratebucket.quota_now(
	b ratebucket.buckets,
	at timestamptz DEFAULT clock_timestamp(),
	OUT used float8,
	OUT remaining float8,
	OUT window_start timestamptz,
	OUT resets_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_quota_now'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.quota_now(ratebucket.buckets, timestamptz) IS
'A quota bucket''s window at time at: the tokens used and remaining in it, when it started and when it resets. All NULL for a rate bucket.';

-- The status view gains the quota columns, at the end.
CREATE OR REPLACE VIEW ratebucket.bucket_status AS
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
	   b.configured_at,
	   b.quota_period,
	   b.quota_time_zone,
	   CASE WHEN b.quota_period IS NOT NULL THEN b.conf_capacity END AS quota,
	   q.used AS quota_used,
	   q.remaining AS quota_remaining,
	   q.window_start AS quota_window_start,
	   q.resets_at AS quota_resets_at
FROM ratebucket.buckets AS b,
	 LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n,
	 LATERAL ratebucket.quota_now(b, pg_catalog.clock_timestamp()) AS q;

COMMENT ON COLUMN ratebucket.bucket_status.quota_period IS
'For a calendar quota: hour, day, week or month; NULL for a rate bucket.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_time_zone IS
'For a calendar quota: the time zone of its calendar.';
COMMENT ON COLUMN ratebucket.bucket_status.quota IS
'For a calendar quota: the tokens it grants per window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_used IS
'For a calendar quota: tokens granted in the current window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_remaining IS
'For a calendar quota: tokens left in the current window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_window_start IS
'For a calendar quota: when the current window started.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_resets_at IS
'For a calendar quota: when the quota resets (the current window ends).';

REVOKE ALL ON FUNCTION
	ratebucket.bucket_configure_quota(text, float8, text, text)
	FROM PUBLIC;
-- Pure computations, like refill_tokens and bucket_now.
GRANT EXECUTE ON FUNCTION
	ratebucket.quota_window(text, text, timestamptz),
	ratebucket.quota_now(ratebucket.buckets, timestamptz)
	TO PUBLIC;
