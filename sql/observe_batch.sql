--
-- observe_batch: bucket_observe_batch, a batch's answers with one lock and
-- one row write per endpoint: the same outcomes, cooldowns, rates and
-- breakers as one bucket_observe per answer, in the order given; every
-- element checked before anything is locked.
--

-- Set-up: a fresh install, whatever an earlier test left behind.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;
\set VERBOSITY terse

-- Two twins of each endpoint: "a" answered one call at a time, "b" in one
-- batch, the answers interleaved across endpoints.
SELECT ratebucket.bucket_configure(e, 100, 20)
FROM unnest(ARRAY['a:x', 'a:y', 'a:z', 'b:x', 'b:y', 'b:z']) AS e;

CREATE TEMP TABLE answers (n int, ep text, status int, ra text, hd jsonb);
INSERT INTO answers VALUES
	(1, 'y', 200, NULL, NULL),
	(2, 'x', 429, NULL, NULL),
	(3, 'y', 500, NULL, NULL),
	(4, 'x', 429, '7', NULL),
	(5, 'z', NULL, NULL, NULL),
	(6, 'y', 503, NULL, NULL),
	(7, 'z', 200, NULL, '{"RateLimit-Policy": "50;w=1"}'),
	(8, 'x', 200, NULL, NULL);

-- one at a time, for "a"
CREATE TEMP TABLE one_by_one AS
SELECT a.n, o.outcome, round(o.cooldown_seconds) AS cooldown,
	   round(o.effective_rate::numeric, 3) AS rate, o.breaker
FROM answers a
CROSS JOIN LATERAL ratebucket.bucket_observe('a:' || a.ep, a.status, a.ra, a.hd) o
ORDER BY a.n;

-- in one batch, for "b": one row write per endpoint, not per answer
BEGIN;
SELECT n_tup_upd + n_tup_ins AS writes_before
FROM pg_stat_xact_user_tables WHERE relid = 'ratebucket.buckets'::regclass \gset
CREATE TEMP TABLE batched AS
SELECT o.ord AS n, o.outcome, round(o.cooldown_seconds) AS cooldown,
	   round(o.effective_rate::numeric, 3) AS rate, o.breaker
FROM ratebucket.bucket_observe_batch(
		 (SELECT array_agg('b:' || ep ORDER BY n) FROM answers),
		 (SELECT array_agg(status ORDER BY n) FROM answers),
		 (SELECT array_agg(ra ORDER BY n) FROM answers),
		 (SELECT array_agg(hd ORDER BY n) FROM answers)) o;
SELECT n_tup_upd + n_tup_ins - :writes_before AS row_writes
FROM pg_stat_xact_user_tables WHERE relid = 'ratebucket.buckets'::regclass;
COMMIT;

SELECT * FROM batched ORDER BY n;
-- the same answers, one by one or batched (no row: none differs)
(SELECT * FROM one_by_one EXCEPT SELECT * FROM batched)
UNION ALL
(SELECT * FROM batched EXCEPT SELECT * FROM one_by_one);
-- and the same state: counters, factor, breaker, cooldown
SELECT substr(a.endpoint, 3) AS ep,
	   a.throttles = b.throttles AND a.failures = b.failures
	   AND a.successes = b.successes AND a.rate_factor = b.rate_factor
	   AND a.failure_run = b.failure_run AND a.cooldowns = b.cooldowns
	   AND a.target_factor IS NOT DISTINCT FROM b.target_factor
	   AND a.limit_factor IS NOT DISTINCT FROM b.limit_factor
	   AND (a.cooldown_until IS NULL) = (b.cooldown_until IS NULL) AS same,
	   b.throttles, b.failures, b.successes
FROM ratebucket.buckets a
JOIN ratebucket.buckets b ON substr(b.endpoint, 3) = substr(a.endpoint, 3)
WHERE a.endpoint LIKE 'a:%' AND b.endpoint LIKE 'b:%'
ORDER BY 1;

-- An endpoint without a bucket: the outcome only, nothing created.
SELECT ord, outcome, round(cooldown_seconds) AS cooldown, effective_rate, breaker
FROM ratebucket.bucket_observe_batch(ARRAY['nobody', 'b:x'], ARRAY[429, 200]);
SELECT count(*) AS created FROM ratebucket.buckets WHERE endpoint = 'nobody';
-- an empty batch
SELECT count(*) FROM ratebucket.bucket_observe_batch('{}', '{}');

-- Bad input: refused, every row as it was.
CREATE TEMP TABLE before AS SELECT * FROM ratebucket.buckets;
SELECT * FROM ratebucket.bucket_observe_batch(NULL, ARRAY[200]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x'], NULL);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', NULL], ARRAY[429, 429]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', 'b:y'], ARRAY[429]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', 'b:y'], ARRAY[429, 429], ARRAY['1']);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY[['b:x'], ['b:y']], ARRAY[[429], [429]]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', 'b:y'], ARRAY[429, 1000]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', ''], ARRAY[429, 429]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', 'b:y'], ARRAY[429, 429], NULL,
											  ARRAY['{}', '[1]']::jsonb[]);
SELECT * FROM ratebucket.bucket_observe_batch(ARRAY['b:x', 'b:y'], ARRAY[429, 429], NULL, NULL,
											  ARRAY[now(), 'infinity']);
SELECT count(*) AS changed
FROM (SELECT * FROM ratebucket.buckets EXCEPT SELECT * FROM before) c;

DROP EXTENSION ratebucket;
