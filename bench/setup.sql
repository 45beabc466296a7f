-- bench/setup.sql: the benchmark's objects, run once by bench/run with
--   psql -v ON_ERROR_STOP=1 -v nbuckets=<the largest BENCH_BUCKETS>
-- in a throwaway database of a throwaway server.

CREATE EXTENSION ratebucket;

-- 2. The floor for a durable row write: a bare primary-key UPDATE.  Same
--    fillfactor and autovacuum settings as ratebucket.buckets, so its updates
--    are HOT and its page pruning is comparable.
CREATE TABLE bare (
	id		integer PRIMARY KEY,
	tokens	bigint NOT NULL
) WITH (
	fillfactor = 50,
	autovacuum_vacuum_scale_factor = 0.0,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_cost_delay = 0,
	autovacuum_analyze_scale_factor = 0.05
);

-- 3. The same token bucket in PL/pgSQL: what a user would write by hand.
--    Same semantics as bucket_take(endpoint, rate, capacity, tokens): lock the
--    row, read the clock under the lock, refill, take and write back if
--    granted, write nothing if denied; a new bucket starts full.  It keeps only
--    tokens and refilled_at (no counters, no argument checks).
CREATE TABLE pl_buckets (
	endpoint	text COLLATE "C" PRIMARY KEY,
	tokens		float8 NOT NULL,
	refilled_at	timestamptz NOT NULL
) WITH (
	fillfactor = 50,
	autovacuum_vacuum_scale_factor = 0.0,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_cost_delay = 0,
	autovacuum_analyze_scale_factor = 0.05
);

CREATE FUNCTION pl_take(
	p_endpoint text,
	p_rate float8,
	p_capacity float8,
	p_tokens float8 DEFAULT 1,
	OUT allowed boolean,
	OUT remaining float8,
	OUT wait_seconds float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	b		pl_buckets%ROWTYPE;
	now_ts	timestamptz;
	t		float8;
BEGIN
	SELECT * INTO b FROM pl_buckets WHERE endpoint = p_endpoint FOR UPDATE;
	IF NOT FOUND THEN
		INSERT INTO pl_buckets (endpoint, tokens, refilled_at)
		VALUES (p_endpoint, p_capacity, clock_timestamp())
		ON CONFLICT (endpoint) DO NOTHING;
		SELECT * INTO b FROM pl_buckets WHERE endpoint = p_endpoint FOR UPDATE;
	END IF;

	now_ts := clock_timestamp();   -- read only now, under the row lock
	t := least(p_capacity,
			   b.tokens + p_rate * greatest(0, extract(epoch FROM now_ts - b.refilled_at)::float8));

	IF t >= p_tokens THEN
		allowed := true;
		remaining := t - p_tokens;
		wait_seconds := 0;
		UPDATE pl_buckets
		SET tokens = remaining, refilled_at = greatest(b.refilled_at, now_ts)
		WHERE endpoint = p_endpoint;
	ELSE
		allowed := false;
		remaining := t;
		wait_seconds := (p_tokens - t) / p_rate;
	END IF;
END;
$$;

-- Pre-create every bucket (one take each; endpoints '1' to :nbuckets, as
-- the scripts pass them) and every bare row, so that the measured runs only
-- update existing rows.
INSERT INTO bare (id, tokens)
SELECT g, 0 FROM generate_series(1, :nbuckets) AS g;

SELECT count(*) FILTER (WHERE t.allowed) AS ratebucket_created
FROM generate_series(1, :nbuckets) AS g,
	 LATERAL ratebucket.bucket_take(g::text, 1e6, 1e6) AS t;

SELECT count(*) FILTER (WHERE t.allowed) AS plpgsql_created
FROM generate_series(1, :nbuckets) AS g,
	 LATERAL pl_take(g::text, 1e6, 1e6) AS t;

VACUUM ANALYZE bare, pl_buckets, ratebucket.buckets;

-- The striped variant: one configured endpoint split over :stripes rows
-- (bucket_stripe), limits so high that every take is granted.
SELECT ratebucket.bucket_configure('striped', 1e6, 1e6);
SELECT ratebucket.bucket_stripe('striped', :stripes) AS striped_from;

-- The reserved variant: one configured endpoint with a token reserve
-- (bucket_reserve; the server preloads ratebucket), limits so high that
-- every take is granted.
SELECT ratebucket.bucket_configure('reserved', 1e6, 1e6);
SELECT ratebucket.bucket_reserve('reserved', :reserve_batch) AS reserved_before;
VACUUM ANALYZE ratebucket.buckets;
