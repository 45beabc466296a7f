--
-- stripe: striped (hot) buckets.  bucket_stripe splits a configured
-- endpoint's bucket over k rows of rate/k and capacity/k; takes, peeks,
-- feedback and administration follow the stripes; bad input changes nothing.
-- (Which stripe a session starts at depends on its process id, so the
-- stripes' tokens are shown sorted.)
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

\set VERBOSITY terse
SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets
	  WHERE octet_length(endpoint) <= 1024) AS d;

-- Run a statement; return its SQLSTATE and message, or 'ok'.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;

-- Every row, to prove that refused calls change nothing.
CREATE FUNCTION pg_temp.fingerprint() RETURNS text
LANGUAGE sql AS $$
	SELECT md5(coalesce(string_agg(b::text, '|' ORDER BY b.endpoint), ''))
	   || (SELECT count(*) FROM ratebucket.bucket_stripes)
	FROM ratebucket.buckets b
$$;

-- The stripes of an endpoint as stored: count, limits, sorted tokens.
CREATE FUNCTION pg_temp.stripes(ep text)
RETURNS TABLE (stripes int, rate float8, capacity float8, conf_rate float8,
			   conf_capacity float8, tokens numeric[], takes bigint)
LANGUAGE sql AS $$
	SELECT r.stripes, min(s.rate), min(s.capacity), min(s.conf_rate), min(s.conf_capacity),
		   array_agg(round((ratebucket.bucket_now(s)).tokens::numeric, 2)
					 ORDER BY (ratebucket.bucket_now(s)).tokens),
		   sum(s.takes_granted)::bigint
	FROM ratebucket.bucket_stripes r,
		 generate_series(0, r.stripes - 1) AS i,
		 ratebucket.buckets s
	WHERE r.endpoint = ep AND s.endpoint = ratebucket.stripe_key(ep, i, r.stripes)
	GROUP BY r.stripes
$$;

-- 1. Striping: 8 tokens at 0.0001/s over 4 stripes of 2.
SELECT ratebucket.bucket_configure('s:hot', 0.0001, 8);
SELECT allowed, round(remaining::numeric, 2) AS remaining FROM ratebucket.bucket_take('s:hot', 2);
SELECT ratebucket.bucket_stripe('s:hot', 4) AS stripes_before;
SELECT * FROM pg_temp.stripes('s:hot');
-- The endpoint's row holds no tokens and never refills; the view shows the
-- stripes' tokens on the endpoint's line, and not the stripes' own rows.
SELECT tokens, refilled_at FROM ratebucket.buckets WHERE endpoint = 's:hot';
SELECT endpoint, round(tokens::numeric, 2) AS tokens, rate, capacity, stripes, takes_granted
FROM ratebucket.bucket_status ORDER BY endpoint;
SELECT count(*) AS rows, count(*) FILTER (WHERE octet_length(endpoint) > 1024) AS too_long_to_name
FROM ratebucket.buckets WHERE endpoint LIKE 's:hot%';
SELECT ratebucket.bucket_stripe('s:hot', 4) AS same_again;

-- 2. Takes: each is granted by one stripe; a stripe short of tokens is
-- passed over for the next; the bucket never grants more than it holds.
SELECT allowed, round(remaining::numeric, 2) AS remaining FROM ratebucket.bucket_take('s:hot', 1);
SELECT allowed, round(remaining::numeric, 2) AS remaining FROM ratebucket.bucket_take('s:hot', 2);
SELECT * FROM pg_temp.stripes('s:hot');
SELECT granted FROM ratebucket.bucket_take_upto('s:hot', 5);
SELECT granted FROM ratebucket.bucket_take_upto('s:hot', 5);
SELECT allowed, round(remaining::numeric, 2) AS remaining, wait_seconds BETWEEN 19000 AND 20001 AS waits_for_one_stripe
FROM ratebucket.bucket_take('s:hot', 2);
SELECT granted FROM ratebucket.bucket_take_upto('s:hot', 5);
SELECT * FROM pg_temp.stripes('s:hot');
SELECT round(tokens::numeric, 2) AS tokens, takes_granted, tokens_granted, last_used IS NOT NULL AS used
FROM ratebucket.bucket_status WHERE endpoint = 's:hot';
-- The explicit form: its limits are shared among the stripes too, and can
-- only tighten the configured ones.
SELECT allowed FROM ratebucket.bucket_take('s:hot', 1000, 1000, 1);

-- 3. Peeks: ready, wait and claimable answer for the best stripe.
SELECT ratebucket.bucket_reset('s:hot') AS reset;
SELECT * FROM pg_temp.stripes('s:hot');
SELECT allowed FROM ratebucket.bucket_take('s:hot', 2);
SELECT ratebucket.bucket_ready('s:hot', 2) AS ready_2, ratebucket.bucket_wait('s:hot', 2) AS wait_2,
	   ratebucket.bucket_claimable('s:hot', 10) AS claimable;
SELECT (ratebucket.bucket_take('s:hot', 2)).allowed FROM generate_series(1, 3);
SELECT ratebucket.bucket_ready('s:hot', 1) AS ready_1,
	   ratebucket.bucket_wait('s:hot', 1) BETWEEN 39000 AND 40001 AS wait_one_stripe,
	   ratebucket.bucket_claimable('s:hot', 10) AS claimable;

-- 4. Feedback reaches every stripe: a 429 cools the whole bucket down and
-- lowers its rate; a pause refuses every take; reset forgets both.
SELECT ratebucket.bucket_reset('s:hot') AS reset;
SELECT outcome, cooldown_seconds BETWEEN 59 AND 60 AS cooling, effective_rate
FROM ratebucket.bucket_observe('s:hot', 429, '60');
SELECT round(tokens::numeric, 2) AS tokens, cooldown_seconds BETWEEN 59 AND 60 AS cooling,
	   effective_rate, throttles, cooldowns
FROM ratebucket.bucket_status WHERE endpoint = 's:hot';
SELECT allowed, wait_seconds >= 59 AS waits_out_the_cooldown
FROM ratebucket.bucket_take('s:hot', 1);
SELECT count(*) FILTER (WHERE s.cooldown_until > now()) AS stripes_cooling,
	   count(*) FILTER (WHERE s.rate_factor = 0.7) AS stripes_lowered
FROM generate_series(0, 3) i JOIN ratebucket.buckets s
  ON s.endpoint = ratebucket.stripe_key('s:hot', i, 4);
SELECT ratebucket.bucket_reset('s:hot') AS reset;
SELECT outcome FROM ratebucket.bucket_observe('s:hot', 200);
SELECT ratebucket.bucket_pause('s:hot') AS paused;
SELECT allowed FROM ratebucket.bucket_take('s:hot', 1);
SELECT paused, round(tokens::numeric, 2) AS tokens FROM ratebucket.bucket_status WHERE endpoint = 's:hot';
SELECT ratebucket.bucket_resume('s:hot') AS resumed;
SELECT allowed FROM ratebucket.bucket_take('s:hot', 1);
SELECT successes, failure_run, last_status FROM ratebucket.bucket_status WHERE endpoint = 's:hot';

-- 5. Configure again: every stripe takes its share of the new limits, and
-- keeps its tokens (cut to the new capacity).
SELECT ratebucket.bucket_configure('s:hot', 0.0002, 4);
SELECT * FROM pg_temp.stripes('s:hot');
SELECT rate, capacity, conf_rate, conf_capacity, round(tokens::numeric, 2) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 's:hot';

-- 6. Restriping keeps the tokens and the counters: 4 -> 2 -> 1 -> 2.
SELECT ratebucket.bucket_configure('s:hot', 0.0001, 8);
SELECT ratebucket.bucket_reset('s:hot') AS reset;
SELECT allowed FROM ratebucket.bucket_take('s:hot', 2);
SELECT ratebucket.bucket_stripe('s:hot', 2) AS stripes_before;
SELECT * FROM pg_temp.stripes('s:hot');
SELECT round(tokens::numeric, 2) AS tokens, stripes, takes_granted FROM ratebucket.bucket_status WHERE endpoint = 's:hot';
SELECT ratebucket.bucket_stripe('s:hot', 1) AS stripes_before;
SELECT count(*) AS rows FROM ratebucket.buckets WHERE endpoint LIKE 's:hot%';
SELECT round(tokens::numeric, 2) AS tokens, stripes, takes_granted FROM ratebucket.bucket_status WHERE endpoint = 's:hot';
SELECT round(b.tokens::numeric, 2) AS stored_tokens, b.refilled_at < 'infinity' AS refills
FROM ratebucket.buckets b WHERE endpoint = 's:hot';
SELECT allowed, round(remaining::numeric, 2) AS remaining FROM ratebucket.bucket_take('s:hot', 6);
SELECT ratebucket.bucket_stripe('s:hot', 2) AS stripes_before;
SELECT * FROM pg_temp.stripes('s:hot');

-- 7. Bad input: a clear error, and nothing changed.
SELECT ratebucket.bucket_configure('s:small', 1, 3);
SELECT pg_temp.fingerprint() AS before \gset
WITH cases(stmt) AS (VALUES
	($$SELECT ratebucket.bucket_stripe('s:hot', NULL)$$),
	($$SELECT ratebucket.bucket_stripe(NULL, 2)$$),
	($$SELECT ratebucket.bucket_stripe('s:hot', 0)$$),
	($$SELECT ratebucket.bucket_stripe('s:hot', 65)$$),
	($$SELECT ratebucket.bucket_stripe('s:hot', -1)$$),
	($$SELECT ratebucket.bucket_stripe('s:small', 4)$$),
	($$SELECT ratebucket.bucket_stripe('s:unknown', 2)$$),
	($$SELECT ratebucket.bucket_stripe('', 2)$$),
	($$SELECT ratebucket.bucket_take('s:hot', 5)$$),
	($$SELECT ratebucket.bucket_take('s:hot', 8)$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['s:small', 's:hot'])$$),
	($$SELECT ratebucket.bucket_configure('s:hot', 1, 1.5)$$),
	($$SELECT ratebucket.bucket_take(ratebucket.stripe_key('s:hot', 0, 2), 1)$$),
	($$SELECT ratebucket.bucket_reset(ratebucket.stripe_key('s:hot', 0, 2))$$),
	($$SELECT ratebucket.stripe_key('s:hot', 2, 2)$$),
	($$SELECT ratebucket.stripe_key('s:hot', 0, 0)$$))
SELECT stmt, pg_temp.try(stmt) AS result FROM cases;
SELECT pg_temp.fingerprint() = :'before' AS unchanged;
SELECT ratebucket.stripe_key('s', 0, 1) IS NULL AS key_null, ratebucket.stripe_key(NULL, 0, 2) IS NULL AS null_key;

-- 8. Expiry leaves striped endpoints alone (they are configured); drop
-- deletes the endpoint's row, its stripes and its stripe count.
SELECT ratebucket.bucket_expire('0') AS expired;
SELECT count(*) AS rows FROM ratebucket.buckets WHERE endpoint LIKE 's:hot%';
SELECT ratebucket.bucket_drop('s:hot') AS dropped, ratebucket.bucket_drop('s:hot') AS again;
SELECT count(*) AS rows FROM ratebucket.buckets WHERE endpoint LIKE 's:hot%';
SELECT count(*) AS striped FROM ratebucket.bucket_stripes;
SELECT pg_temp.try($$SELECT ratebucket.bucket_take('s:hot', 1)$$) AS take_after_drop;
-- Configured again from scratch, it is one row.
SELECT ratebucket.bucket_configure('s:hot', 0.0001, 8);
SELECT allowed, round(remaining::numeric, 2) AS remaining FROM ratebucket.bucket_take('s:hot', 8);

-- 9. Only an administrator stripes; stripe_key is pure and open.
SELECT has_function_privilege('public', 'ratebucket.bucket_stripe(text, int)', 'EXECUTE') AS public_stripes,
	   has_function_privilege('public', 'ratebucket.stripe_key(text, int, int)', 'EXECUTE') AS public_keys,
	   has_table_privilege('public', 'ratebucket.bucket_stripes', 'SELECT') AS public_reads;

SELECT ratebucket.bucket_drop('s:hot'), ratebucket.bucket_drop('s:small');

-- 10. A calendar quota is one row: it cannot be striped, and a striped
-- endpoint cannot become a quota; both refusals change nothing.
SELECT ratebucket.bucket_configure_quota('s:quota', 100, 'day');
SELECT pg_temp.try($$SELECT ratebucket.bucket_stripe('s:quota', 4)$$) AS stripe_a_quota;
SELECT stripes, quota, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 's:quota';
SELECT ratebucket.bucket_configure('s:rate', 100, 40);
SELECT ratebucket.bucket_stripe('s:rate', 4);
SELECT pg_temp.try($$SELECT ratebucket.bucket_configure_quota('s:rate', 100, 'day')$$) AS quota_a_striped;
SELECT stripes, conf_rate, conf_capacity, quota FROM ratebucket.bucket_status WHERE endpoint = 's:rate';
SELECT ratebucket.bucket_drop('s:quota'), ratebucket.bucket_drop('s:rate');

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
