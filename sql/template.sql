--
-- template: the configuration of endpoints nobody configured, by key
-- pattern (bucket_template, bucket_template_drop, bucket_template_for).
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

-- What the table holds, row by row (rates so low that nothing refills
-- while this test runs).
CREATE FUNCTION pg_temp.rows() RETURNS TABLE (endpoint text, conf_rate float8,
	conf_capacity float8, tokens numeric, template text, takes bigint)
LANGUAGE sql AS $$
	SELECT endpoint, conf_rate, conf_capacity, round(tokens::numeric, 3), template,
		   takes_granted
	FROM ratebucket.bucket_status ORDER BY endpoint
$$;

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

--
-- 1. Patterns: a prefix and one final '*'.  Bad input is an error with its
-- SQLSTATE, and changes no row of either table.
--
SELECT ratebucket.bucket_template('ok:*', 0.000001, 5) AS configured_now;
SELECT allowed FROM ratebucket.bucket_take('ok:1');
CREATE FUNCTION pg_temp.fingerprint() RETURNS text
LANGUAGE sql AS $$
	SELECT md5((SELECT coalesce(string_agg(b::text, '|' ORDER BY b.endpoint), '')
				FROM ratebucket.buckets AS b) ||
			   (SELECT coalesce(string_agg(t::text, '|' ORDER BY t.pattern), '')
				FROM ratebucket.bucket_templates AS t))
$$;
SELECT pg_temp.fingerprint() AS before \gset
WITH cases(stmt) AS (VALUES
	($$SELECT ratebucket.bucket_template('acct', 0.000001, 5)$$),
	($$SELECT ratebucket.bucket_template('a*b*', 0.000001, 5)$$),
	($$SELECT ratebucket.bucket_template('*x', 0.000001, 5)$$),
	($$SELECT ratebucket.bucket_template('', 0.000001, 5)$$),
	($$SELECT ratebucket.bucket_template(NULL, 0.000001, 5)$$),
	($$SELECT ratebucket.bucket_template(repeat('x', 255) || '*', 0.000001, 5)$$),
	-- the arguments of bucket_configure, checked as it checks them
	($$SELECT ratebucket.bucket_template('ok:*', 0, 5)$$),
	($$SELECT ratebucket.bucket_template('ok:*', 0.000001, NULL)$$),
	($$SELECT ratebucket.bucket_template('ok:*', 0.000001, 5, throttle_factor => 1.5)$$),
	($$SELECT ratebucket.bucket_template('ok:*', 0.000001, 5, breaker_failures => -1)$$),
	($$SELECT ratebucket.bucket_template_drop(NULL)$$),
	($$SELECT ratebucket.bucket_template_drop('acct')$$),
	($$SELECT ratebucket.bucket_template_for(NULL)$$),
	($$SELECT ratebucket.bucket_template_for('')$$))
SELECT stmt, pg_temp.try(stmt) AS result FROM cases;
SELECT pg_temp.fingerprint() = :'before' AS nothing_changed;
-- (a pattern of 255 bytes is accepted)
SELECT ratebucket.bucket_template(repeat('x', 254) || '*', 0.000001, 5) AS configured_now;
SELECT ratebucket.bucket_template_drop(repeat('x', 254) || '*') AS dropped,
	   ratebucket.bucket_template_drop('ok:*') AS dropped,
	   ratebucket.bucket_drop('ok:1') AS dropped;

-- With no template, a configured take of an endpoint nobody configured is
-- an error that says so, and creates nothing.
\set ON_ERROR_STOP 0
SELECT * FROM ratebucket.bucket_take('acct:1');
\set ON_ERROR_STOP 1
SELECT count(*) AS buckets FROM ratebucket.buckets;

--
-- 2. Which template matches: the longest prefix; "*" matches every key.
--
SELECT ratebucket.bucket_template('acct:*', 0.000001, 5) AS configured_now;
SELECT ratebucket.bucket_template('acct:9*', 0.000001, 3, breaker_failures => 2) AS configured_now;
SELECT ratebucket.bucket_template('*', 0.000001, 2) AS configured_now;
SELECT pattern, rate, capacity, floor_rate, throttle_factor, recovery_factor,
	   breaker_failures, configured_at IS NOT NULL AS has_configured_at
FROM ratebucket.bucket_templates ORDER BY pattern;
SELECT k, ratebucket.bucket_template_for(k) AS template
FROM unnest(ARRAY['acct:1', 'acct:9', 'acct:99', 'acct:', 'acct', 'mail.example']) AS k;
-- Matching is on bytes, case and all.
SELECT ratebucket.bucket_template_for('ACCT:1') AS upper_case;

--
-- 3. A first configured take configures the endpoint from its template,
-- under the row lock, in the take's transaction; the endpoint then follows
-- that template.
--
SELECT allowed, remaining FROM ratebucket.bucket_take('acct:1', 2);
SELECT allowed, remaining FROM ratebucket.bucket_take('acct:90');
SELECT * FROM pg_temp.rows();
SELECT endpoint, configured, breaker, stripes FROM ratebucket.bucket_status ORDER BY endpoint;
-- Its feedback policy came with it: acct:90's breaker opens after 2
-- failures, not ratebucket.breaker_failures (5).
SELECT outcome, breaker FROM ratebucket.bucket_observe('acct:90', 500);
SELECT outcome, breaker FROM ratebucket.bucket_observe('acct:90', 500);
-- A rolled-back first take leaves no row behind.
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('acct:2');
ROLLBACK;
SELECT count(*) AS acct_2_rows FROM ratebucket.buckets WHERE endpoint = 'acct:2';
-- An endpoint whose bucket came from explicit takes (no configuration) is
-- configured at its first configured take: its tokens are kept, cut to the
-- template's capacity.
SELECT allowed, remaining FROM ratebucket.bucket_take('acct:3', 0.000001, 10, 1);
SELECT configured, template FROM ratebucket.bucket_status WHERE endpoint = 'acct:3';
SELECT allowed, remaining FROM ratebucket.bucket_take('acct:3');
SELECT * FROM pg_temp.rows() WHERE endpoint = 'acct:3';

--
-- 4. Peeks judge an endpoint a template would configure as that
-- configuration would leave it (full, for a new one), and write nothing.
--
SELECT ratebucket.bucket_claimable('acct:4', 10, configured_only => true) AS claimable,
	   ratebucket.bucket_grantable('acct:4', 10) AS grantable,
	   ratebucket.bucket_grantable('acct:3', 10) AS grantable_of_acct_3,
	   ratebucket.bucket_grantable('other', 10) AS grantable_of_other;
SELECT count(*) AS acct_4_rows FROM ratebucket.buckets WHERE endpoint = 'acct:4';

--
-- 5. The other first uses: bucket_take_all, bucket_take_batch, bucket_observe
-- and bucket_pause configure the endpoint too; bucket_resume, bucket_reset
-- and bucket_drop of an endpoint with no row do nothing.
--
SELECT allowed, remaining FROM ratebucket.bucket_take_all(ARRAY['acct:5', 'acct:6']);
SELECT granted FROM ratebucket.bucket_take_batch(
	ARRAY[ROW(ARRAY['acct:7', 'acct:8'], 3, NULL)]::ratebucket.batch_request[]);
SELECT outcome, cooldown_seconds FROM ratebucket.bucket_observe('acct:10', 429, '60');
SELECT ratebucket.bucket_pause('acct:11') AS paused;
SELECT ratebucket.bucket_resume('acct:12') AS resumed,
	   ratebucket.bucket_reset('acct:12') AS reset,
	   ratebucket.bucket_drop('acct:12') AS dropped;
SELECT endpoint, template, paused, cooldown_seconds > 0 AS cooling, takes_granted
FROM ratebucket.bucket_status
WHERE endpoint IN ('acct:5', 'acct:6', 'acct:7', 'acct:8', 'acct:10', 'acct:11', 'acct:12')
ORDER BY endpoint;

--
-- 6. A change of a template is carried to the endpoints that follow it, at
-- once: their tokens are kept, cut to the new capacity.  An endpoint
-- configured by hand is left alone, and so is one that follows a more
-- specific template.
--
SELECT ratebucket.bucket_configure('acct:own', 0.000001, 7);
SELECT ratebucket.bucket_template('acct:*', 0.000001, 4) AS configured_now;
SELECT * FROM pg_temp.rows() WHERE endpoint LIKE 'acct:%';
-- A raise: the tokens stay what they were (a new endpoint would start full).
SELECT ratebucket.bucket_template('acct:*', 0.000001, 6) AS configured_now;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:1', 'acct:5');
-- A new, more specific template takes over the endpoints it matches from a
-- less specific one.
SELECT ratebucket.bucket_template('acct:1*', 0.000001, 8) AS configured_now;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:1', 'acct:10', 'acct:11', 'acct:5');

-- bucket_configure gives an endpoint a configuration of its own: it follows
-- no template any more.  So does bucket_configure_quota.
SELECT ratebucket.bucket_configure('acct:5', 0.000001, 9);
SELECT ratebucket.bucket_configure_quota('acct:6', 100, 'day', 'UTC');
SELECT ratebucket.bucket_template('acct:*', 0.000001, 5) AS configured_now;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:5', 'acct:6', 'acct:7');

-- A striped endpoint that follows a template: a change reaches its stripes.
SELECT ratebucket.bucket_stripe('acct:7', 2);
SELECT ratebucket.bucket_template('acct:*', 0.000002, 4) AS configured_now;
SELECT s.endpoint = ratebucket.stripe_key('acct:7', 0, 2) AS stripe_0, s.conf_rate, s.conf_capacity
FROM ratebucket.buckets AS s
WHERE s.endpoint IN (ratebucket.stripe_key('acct:7', 0, 2), ratebucket.stripe_key('acct:7', 1, 2))
ORDER BY 1 DESC;
SELECT ratebucket.bucket_stripe('acct:7', 1);

--
-- 7. Dropping a template: its endpoints follow the next template that
-- matches them, or, with none, keep their configuration as their own.
--
SELECT ratebucket.bucket_template_drop('acct:1*') AS dropped;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:1', 'acct:10', 'acct:11');
SELECT ratebucket.bucket_template_drop('acct:*') AS dropped;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:1', 'acct:90');
SELECT ratebucket.bucket_template_drop('*') AS dropped;
SELECT ratebucket.bucket_template_drop('*') AS dropped_again;
SELECT * FROM pg_temp.rows() WHERE endpoint IN ('acct:1', 'acct:9', 'acct:90');
-- (acct:9 never had a row; acct:90 kept acct:9*'s configuration)
SELECT ratebucket.bucket_template_drop('acct:9*') AS dropped;
SELECT count(*) FILTER (WHERE template IS NOT NULL) AS following,
	   count(*) FILTER (WHERE conf_rate IS NULL) AS unconfigured
FROM ratebucket.buckets;
SELECT count(*) AS templates FROM ratebucket.bucket_templates;

--
-- 8. A dropped endpoint that a template matches comes back full at its next
-- use, configured by it; and a template written to the table directly (by
-- its owner, or by a restore) is seen at once.
--
INSERT INTO ratebucket.bucket_templates (pattern, rate, capacity, configured_at)
VALUES ('mail:*', 0.000001, 3, now());
SELECT ratebucket.bucket_template_for('mail:x') AS template;
SELECT allowed, remaining FROM ratebucket.bucket_take('mail:x', 3);
SELECT ratebucket.bucket_drop('mail:x');
SELECT allowed, remaining FROM ratebucket.bucket_take('mail:x', 1);
-- A row written by hand that is no template is ignored, with a warning.
INSERT INTO ratebucket.bucket_templates (pattern, rate, capacity, configured_at)
VALUES ('mail:y', 0.000001, 3, now()), ('m*il:*', 0.000001, 3, now()), ('mai*', 0, 3, now());
SELECT ratebucket.bucket_template_for('mail:y') AS template;
DELETE FROM ratebucket.bucket_templates;
SELECT ratebucket.bucket_template_for('mail:y') AS template;
SELECT pg_temp.try($$SELECT ratebucket.bucket_take('mail:y')$$) AS result;

-- Clean-up: nothing of this test is left behind.
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
