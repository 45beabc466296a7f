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

-- Striped (hot) buckets
--
-- One endpoint's bucket split over k rows of ratebucket.buckets (its
-- stripes), each with rate/k and capacity/k: takes of one hot endpoint lock
-- different rows instead of queueing on one.  The endpoint's own row keeps
-- the configuration and the feedback state, holds no tokens, and has the
-- refill time infinity; stripe i of k is the row keyed
-- ratebucket.stripe_key(endpoint, i, k), longer than any endpoint may be.
--
CREATE TABLE ratebucket.bucket_stripes (
	endpoint	text PRIMARY KEY,
	stripes		int NOT NULL,
	striped_at	timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.bucket_stripes IS
'The endpoints whose bucket is striped, and over how many rows. Written only by bucket_stripe and bucket_drop.';
COMMENT ON COLUMN ratebucket.bucket_stripes.endpoint IS
'A configured endpoint of ratebucket.buckets.';
COMMENT ON COLUMN ratebucket.bucket_stripes.stripes IS
'Number of stripes (2 to 64); each holds rate/stripes and capacity/stripes.';
COMMENT ON COLUMN ratebucket.bucket_stripes.striped_at IS
'When bucket_stripe last changed the stripe count.';

-- Striping is configuration: pg_dump keeps it, like the configured rows
-- (the stripes are configured rows themselves).
SELECT pg_catalog.pg_extension_config_dump('ratebucket.bucket_stripes', '');

CREATE FUNCTION ratebucket.bucket_stripe(
	endpoint text,
	stripes int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_stripe'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_stripe(text, int) IS
'Split a configured endpoint''s bucket over stripes rows (2 to 64), each with rate/stripes and capacity/stripes, so that concurrent takes of one hot endpoint do not queue on one row lock; 1 puts it back in one row. A take is granted by one stripe, so it must fit in capacity/stripes. The tokens held now are shared among the new stripes. Returns the stripe count it had.';

CREATE FUNCTION ratebucket.stripe_key(
	endpoint text,
	stripe int,
	stripes int)
RETURNS text
AS 'MODULE_PATHNAME', 'ratebucket_stripe_key'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.stripe_key(text, int, int) IS
'The key in ratebucket.buckets of stripe (0 to stripes - 1) of a striped endpoint: longer than any endpoint may be, so no take can name it.';

REVOKE ALL ON ratebucket.bucket_stripes FROM PUBLIC;
REVOKE ALL ON FUNCTION ratebucket.bucket_stripe(text, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ratebucket.stripe_key(text, int, int) TO PUBLIC;

-- The status view, for both: one row per endpoint, striped or not (a
-- striped endpoint's tokens and take counters are its stripes', summed; the
-- stripes' own rows are not listed), with the quota columns and the stripe
-- count appended at the end.
CREATE OR REPLACE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   COALESCE(st.tokens, n.tokens) AS tokens,
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
	   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
				b.last_granted_at) AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
					b.created_at) AS idle,
	   b.takes_granted OPERATOR(pg_catalog.+) COALESCE(st.takes_granted, 0) AS takes_granted,
	   b.tokens_granted OPERATOR(pg_catalog.+) COALESCE(st.tokens_granted, 0) AS tokens_granted,
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
	   q.resets_at AS quota_resets_at,
	   COALESCE(r.stripes, 1) AS stripes
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n
	 CROSS JOIN LATERAL ratebucket.quota_now(b, pg_catalog.clock_timestamp()) AS q
	 LEFT JOIN LATERAL (
		 SELECT pg_catalog.sum((ratebucket.bucket_now(s, pg_catalog.clock_timestamp())).tokens) AS tokens,
				pg_catalog.max(s.last_granted_at) AS last_granted_at,
				CAST(pg_catalog.sum(s.takes_granted) AS pg_catalog.int8) AS takes_granted,
				pg_catalog.sum(s.tokens_granted) AS tokens_granted
		 FROM pg_catalog.generate_series(0, r.stripes OPERATOR(pg_catalog.-) 1) AS i
			  JOIN ratebucket.buckets AS s
				  ON s.endpoint OPERATOR(pg_catalog.=) ratebucket.stripe_key(b.endpoint, i, r.stripes)
	 ) AS st ON r.stripes IS NOT NULL
WHERE pg_catalog.octet_length(b.endpoint) OPERATOR(pg_catalog.<=) 1024;

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

COMMENT ON COLUMN ratebucket.bucket_status.stripes IS
'Rows the bucket is striped over (1: not striped); see bucket_stripe.';
