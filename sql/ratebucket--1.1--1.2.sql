/* ratebucket--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.2'" to load this file. \quit

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

-- The status view: one row per endpoint, striped or not.  A striped
-- endpoint's tokens and take counters are its stripes' (summed); its
-- stripes' own rows are not listed.  New column: stripes.
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
	   COALESCE(r.stripes, 1) AS stripes
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n
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

COMMENT ON COLUMN ratebucket.bucket_status.stripes IS
'Rows the bucket is striped over (1: not striped); see bucket_stripe.';
