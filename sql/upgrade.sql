--
-- upgrade: a database on 1.0, with configured endpoints, state and grants,
-- updated with ALTER EXTENSION ... UPDATE, ends up with the same objects as
-- a fresh install of the newest version, its rows untouched, its grants
-- kept, and the new functions working on the old rows and closed to PUBLIC.
-- (The model is contrib's oldextversions tests.)
--
-- The fresh install runs the install script the build makes of
-- sql/install/ratebucket.sql, the current surface written as one file: the
-- comparison proves that file equal to 1.0 and every update.
--

-- Set-up: no ratebucket yet, nor the roles of this test, whatever an
-- earlier test left behind (every test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP ROLE IF EXISTS regress_rb_upgrade_worker, regress_rb_upgrade_nobody;
RESET client_min_messages;

-- The snapshot of the extension's objects: pg_temp.ext_objects(name).
\i test/sql/ext_objects.sql

--
-- 1. A fresh install of the newest version: its snapshot is the reference.
--
CREATE EXTENSION ratebucket;
SELECT extversion = (SELECT default_version FROM pg_available_extensions
					 WHERE name = 'ratebucket') AS is_default_version
FROM pg_extension WHERE extname = 'ratebucket';
-- The newest version has an install script of its own (the built surface),
-- so that is what this install ran, not 1.0 and the updates.
SELECT (pg_stat_file(c.setting || '/extension/ratebucket--' || e.default_version || '.sql',
					 true)).size > 0 AS has_its_own_install_script
FROM pg_config AS c, pg_available_extensions AS e
WHERE c.name = 'SHAREDIR' AND e.name = 'ratebucket';

CREATE TEMP TABLE snap_fresh AS SELECT * FROM pg_temp.ext_objects('ratebucket');
-- What the snapshot covers.
SELECT split_part(object, ' ', 1) AS kind, count(DISTINCT object) AS objects,
	   count(*) AS properties
FROM snap_fresh GROUP BY 1 ORDER BY 1;

DROP EXTENSION ratebucket;

--
-- 2. Version 1.0, as released, filled through its own API.
--
CREATE EXTENSION ratebucket VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'ratebucket';

-- The functions 1.1 adds do not exist yet.
SELECT f AS function_of_1_1, to_regprocedure(f) IS NOT NULL AS exists
FROM unnest(ARRAY['ratebucket.bucket_take_upto(text,float8,float8,int)',
				  'ratebucket.bucket_take_upto(text,int)',
				  'ratebucket.bucket_claimable(text,int)',
				  'ratebucket.bucket_wait(text,float8)']) AS f;
-- Nor those of 1.2, nor its columns.
SELECT f AS function_of_1_2, to_regprocedure(f) IS NOT NULL AS exists
FROM unnest(ARRAY['ratebucket.bucket_configure_quota(text,float8,text,text)',
				  'ratebucket.quota_window(text,text,timestamptz)',
				  'ratebucket.quota_now(ratebucket.buckets,timestamptz)',
				  'ratebucket.bucket_stripe(text,int)',
				  'ratebucket.stripe_key(text,int,int)']) AS f;
SELECT to_regclass('ratebucket.bucket_stripes') IS NULL AS no_stripe_table;
-- Nor those of 1.6, nor its tables.
SELECT f AS function_of_1_6, to_regprocedure(f) IS NOT NULL AS exists
FROM unnest(ARRAY['ratebucket.bucket_template(text,float8,float8,float8,float8,float8,int)',
				  'ratebucket.bucket_template_drop(text)',
				  'ratebucket.bucket_template_for(text)',
				  'ratebucket.distribute(int)']) AS f;
SELECT to_regclass('ratebucket.bucket_templates') IS NULL AS no_template_table;
SELECT count(*) AS quota_columns FROM pg_attribute
WHERE attrelid = 'ratebucket.buckets'::regclass AND attname LIKE 'quota%';

CREATE TEMP TABLE snap_10 AS SELECT * FROM pg_temp.ext_objects('ratebucket');

-- bucket_stripe (1.2) as the worker: its SQLSTATE, or 'ok'.
CREATE FUNCTION pg_temp.try_stripe() RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE $q$SELECT ratebucket.bucket_stripe('u:cooling', 4)$q$;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END;
$$;

-- A worker, granted what the README documents for 1.0, and a role with no
-- grant at all (it has only what PUBLIC has).
CREATE ROLE regress_rb_upgrade_worker;
CREATE ROLE regress_rb_upgrade_nobody;
GRANT USAGE ON SCHEMA ratebucket TO regress_rb_upgrade_worker;
GRANT EXECUTE ON FUNCTION
	ratebucket.bucket_take(text, float8, float8, float8),
	ratebucket.bucket_take(text, float8),
	ratebucket.bucket_ready(text, float8),
	ratebucket.bucket_observe(text, int, text, jsonb)
	TO regress_rb_upgrade_worker;
GRANT SELECT ON ratebucket.bucket_status TO regress_rb_upgrade_worker;

-- Rates so low that nothing refills while this test runs.
-- u:api: configured, every feedback setting overridden, 2 tokens taken,
-- two failures in a row (below its breaker's 3).
SELECT ratebucket.bucket_configure('u:api', 0.000001, 10, floor_rate => 0.0000002,
								   throttle_factor => 0.25, recovery_factor => 1.5,
								   breaker_failures => 3);
SELECT allowed, remaining FROM ratebucket.bucket_take('u:api', 2);
SELECT outcome, breaker FROM ratebucket.bucket_observe('u:api', 500);
SELECT outcome, breaker FROM ratebucket.bucket_observe('u:api', 503);
-- u:cooling: a 429 with Retry-After: a half-hour cooldown, which empties the
-- bucket until it ends (so its rate of 1/s refills nothing during the test),
-- and the rate halved.
SELECT ratebucket.bucket_configure('u:cooling', 1, 4, throttle_factor => 0.5);
SELECT outcome, cooldown_seconds, effective_rate
FROM ratebucket.bucket_observe('u:cooling', 429, '1800');
-- u:paused: paused until resumed.
SELECT ratebucket.bucket_configure('u:paused', 0.000001, 3);
SELECT ratebucket.bucket_pause('u:paused');
-- u:adhoc: not configured, created by the worker's take with explicit limits.
SET ROLE regress_rb_upgrade_worker;
SELECT allowed, remaining FROM ratebucket.bucket_take('u:adhoc', 0.000001, 5, 2);
RESET ROLE;

-- What a user builds on the takes: a view and a SQL function that call
-- them (each recorded as depending on the functions: DROP FUNCTION would
-- refuse), and a statement prepared in this session, planned before the
-- update.  u:built: not configured, created by that statement.
CREATE VIEW u_built_take AS
SELECT * FROM ratebucket.bucket_take('u:built', 0.000001, 5);
CREATE FUNCTION u_built_take(e text) RETURNS boolean
LANGUAGE sql
BEGIN ATOMIC
	SELECT allowed FROM ratebucket.bucket_take(e, 0.000001, 5, 2);
END;
PREPARE u_built_take(text) AS
SELECT allowed, round(remaining::numeric, 3) AS remaining, wait_seconds
FROM ratebucket.bucket_take($1, 0.000001, 5);
EXECUTE u_built_take('u:built');
-- And one that returns the row whole, as one value (of type record); its
-- endpoint, u:built-row, is new.
PREPARE u_built_row(text) AS SELECT ratebucket.bucket_take($1, 0.000001, 5) AS t;
EXECUTE u_built_row('u:built-row');
SELECT count(*) AS dependents
FROM pg_depend
WHERE refobjid = 'ratebucket.bucket_take(text, float8, float8, float8)'::regprocedure
  AND deptype = 'n';

-- The stored state (a cooldown's end is a time: shown as "cooling").
SELECT endpoint, conf_rate, conf_capacity, conf_floor_rate, conf_throttle_factor,
	   conf_recovery_factor, conf_breaker_failures, round(tokens::numeric, 3) AS tokens,
	   takes_granted, rate_factor, coalesce(cooldown_until > now(), false) AS cooling, paused_until,
	   failure_run, failures, throttles
FROM ratebucket.buckets ORDER BY endpoint;

-- Every row, kept as it is now, and a fingerprint of every row (as in
-- errors.sql), over the columns 1.0 has: a later update may add columns.
CREATE TEMP TABLE rows_10 AS
SELECT b.endpoint, to_jsonb(b) AS r FROM ratebucket.buckets AS b;
CREATE TEMP TABLE columns_10 AS
SELECT array_agg(attname::text) AS columns
FROM pg_attribute
WHERE attrelid = 'ratebucket.buckets'::regclass AND attnum > 0 AND NOT attisdropped;
CREATE FUNCTION pg_temp.fingerprint(columns text[]) RETURNS text
LANGUAGE sql AS $$
	SELECT md5(coalesce(string_agg(r::text, '|' ORDER BY endpoint), ''))
	FROM (SELECT b.endpoint,
				 (SELECT jsonb_object_agg(c.key, c.value)
				  FROM jsonb_each(to_jsonb(b)) AS c
				  WHERE c.key = ANY (columns)) AS r
		  FROM ratebucket.buckets AS b) AS rows
$$;
SELECT pg_temp.fingerprint(columns) AS before FROM columns_10 \gset
SELECT cardinality(columns) AS columns, :'before' <> md5('') AS rows_fingerprinted
FROM columns_10;

--
-- 3. The update, to the default version (step by step from 1.0, through
-- every script on the way).  Not while a view or a SQL function body calls
-- bucket_take (1.9 changes its declared result): the update refuses, and
-- changes nothing.  (Without the error's context: PostgreSQL 18 adds the
-- script's statement to it.)
--
\set SHOW_CONTEXT never
ALTER EXTENSION ratebucket UPDATE;
\set SHOW_CONTEXT errors
SELECT extversion FROM pg_extension WHERE extname = 'ratebucket';
DROP VIEW u_built_take;
DROP FUNCTION u_built_take(text);
ALTER EXTENSION ratebucket UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions
					 WHERE name = 'ratebucket') AS is_default_version
FROM pg_extension WHERE extname = 'ratebucket';

--
-- 4. The rows are untouched: the same fingerprint, and, row by row, every
-- value each row held is still there.
--
SELECT pg_temp.fingerprint(columns) = :'before' AS same_fingerprint FROM columns_10;
SELECT o.endpoint, coalesce(to_jsonb(n) @> o.r, false) AS unchanged
FROM rows_10 AS o LEFT JOIN ratebucket.buckets AS n USING (endpoint)
ORDER BY o.endpoint;
SELECT count(*) AS rows_now FROM ratebucket.buckets;

-- The statement prepared before the update runs, planned again, with the
-- same columns; the view and the function, created again, run too.  The
-- one that returns the row whole fails: its one column's type would now be
-- take_result, not record.  Prepared again, it runs.
EXECUTE u_built_take('u:built');
EXECUTE u_built_row('u:built-row');
DEALLOCATE u_built_row;
PREPARE u_built_row(text) AS SELECT ratebucket.bucket_take($1, 0.000001, 5) AS t;
EXECUTE u_built_row('u:built-row2');
DEALLOCATE u_built_row;
SELECT pg_typeof(ratebucket.bucket_take('u:built-row2', 0.000001, 5)) AS row_type;
CREATE VIEW u_built_take AS
SELECT * FROM ratebucket.bucket_take('u:built', 0.000001, 5);
CREATE FUNCTION u_built_take(e text) RETURNS boolean
LANGUAGE sql
BEGIN ATOMIC
	SELECT allowed FROM ratebucket.bucket_take(e, 0.000001, 5, 2);
END;
SELECT allowed, round(remaining::numeric, 3) AS remaining, wait_seconds FROM u_built_take;
SELECT u_built_take('u:built') AS allowed;
SELECT ratebucket.bucket_drop('u:built'), ratebucket.bucket_drop('u:built-row'),
	   ratebucket.bucket_drop('u:built-row2');
DEALLOCATE u_built_take;
DROP VIEW u_built_take;
DROP FUNCTION u_built_take(text);

--
-- 5. Grants made on 1.0 survive; the new functions are not open to PUBLIC.
-- For every function: may the worker, and may a role with no grant, call it?
--
SELECT f.oid::regprocedure AS function,
	   has_function_privilege('regress_rb_upgrade_worker', f.oid, 'EXECUTE') AS worker,
	   has_function_privilege('regress_rb_upgrade_nobody', f.oid, 'EXECUTE') AS nobody
FROM pg_proc f
WHERE f.pronamespace = 'ratebucket'::regnamespace
ORDER BY f.oid::regprocedure::text;
SELECT has_table_privilege('regress_rb_upgrade_worker', 'ratebucket.bucket_status', 'SELECT') AS worker_reads_status,
	   has_table_privilege('regress_rb_upgrade_nobody', 'ratebucket.bucket_status', 'SELECT') AS nobody_reads_status;
-- And in practice: the worker still takes, and is refused a 1.1 function
-- nobody granted it.
SET ROLE regress_rb_upgrade_worker;
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('u:adhoc', 0.000001, 5, 1);
SELECT ratebucket.bucket_wait('u:adhoc');
RESET ROLE;

--
-- 6. The objects: the updated extension's snapshot against the fresh
-- install's.  While the worker's grants stand they are the only difference,
-- which shows the comparison sees privileges.
--
CREATE TEMP VIEW fresh_vs_updated AS
SELECT 'fresh only' AS side, * FROM (SELECT * FROM snap_fresh
									 EXCEPT SELECT * FROM pg_temp.ext_objects('ratebucket')) AS f
UNION ALL
SELECT 'updated only', * FROM (SELECT * FROM pg_temp.ext_objects('ratebucket')
							   EXCEPT SELECT * FROM snap_fresh) AS u;
SELECT * FROM fresh_vs_updated ORDER BY object, property, side;

-- Without them, none: the symmetric difference is empty.  The fresh
-- install ran the current surface (sql/install/ratebucket.sql), the updated
-- one 1.0 and every update script: any object, property, comment or
-- privilege in which the two differ is listed here.  The listing below, of
-- what the update changed, checks the update scripts themselves.
REVOKE ALL ON SCHEMA ratebucket FROM regress_rb_upgrade_worker;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM regress_rb_upgrade_worker;
REVOKE ALL ON ratebucket.bucket_status FROM regress_rb_upgrade_worker;
SELECT * FROM fresh_vs_updated ORDER BY object, property, side;

-- What the update changed, against the 1.0 snapshot: the objects of 1.1
-- (the claim helpers, bucket_take_all, the in-flight caps) and of 1.2 (the
-- quota columns of the table and of the view, the view's new definition,
-- bucket_configure_quota, quota_window, quota_now; bucket_stripes,
-- bucket_stripe, stripe_key, the view's stripes) and of 1.3
-- (bucket_grantable, bucket_claimable's configured_only form, the type
-- batch_request, bucket_take_batch, inflight_acquire's new body) and of 1.4
-- (the in-flight functions' language, library and C symbol) and of 1.5 (the
-- table's columns target_factor, burst_factor, limit_factor and
-- limit_burst_factor, the comments of rate_factor and factor_at, and the
-- form of bucket_observe with a fifth argument, sent_at) and of 1.6 (the
-- table's column template and the view's, bucket_templates, its trigger
-- and its functions, bucket_template, bucket_template_drop and
-- bucket_template_for; distribute) and of 1.7 and 1.8 (endpoint_limits,
-- the table's and the view's column reserve, bucket_reserve and
-- bucket_reserves) and of 1.9 (the types take_result and take_upto_result,
-- and bucket_take's and bucket_take_upto's result and arguments), with all
-- their properties (privileges, comments and dependencies included), and
-- nothing else.  A later version's update adds its own lines here.
SELECT coalesce(n.object, o.object) AS object, coalesce(n.property, o.property) AS property,
	   o.value AS "1.0", n.value AS updated
FROM snap_10 AS o
FULL JOIN pg_temp.ext_objects('ratebucket') AS n ON (n.object, n.property) = (o.object, o.property)
WHERE o.value IS DISTINCT FROM n.value
ORDER BY 1, 2;

--
-- 7. The new functions work on the old rows.
--
-- Three of u:api's 8 tokens in one take; the rest of u:adhoc's 2.
SELECT granted, round(remaining::numeric, 3) AS remaining, wait_seconds
FROM ratebucket.bucket_take_upto('u:api', 3);
SELECT granted, round(remaining::numeric, 3) AS remaining,
	   wait_seconds > 900000 AS waits_for_the_next_token
FROM ratebucket.bucket_take_upto('u:adhoc', 0.000001, 5, 10);
-- The cooldown and the pause carried over: u:cooling waits out the rest of
-- its half hour (more than a quarter of an hour, however slow the machine)
-- and then 2 s for a token at the halved rate; a pause's wait is capped at
-- ratebucket.max_cooldown (1 h).
SELECT granted, wait_seconds BETWEEN 900 AND 1802 AS waits_out_the_cooldown
FROM ratebucket.bucket_take_upto('u:cooling', 2);
SELECT ratebucket.bucket_wait('u:api') AS wait_api,
	   ratebucket.bucket_wait('u:cooling') BETWEEN 900 AND 1802 AS wait_cooling,
	   ratebucket.bucket_wait('u:paused') AS wait_paused;
-- Once per endpoint per execution: u:api's 5 whole tokens, then NULL.
SELECT e, ratebucket.bucket_claimable(e, 10) AS n
FROM (VALUES (1, 'u:api'), (2, 'u:api'), (3, 'u:cooling'), (4, 'u:paused'),
			 (5, 'u:adhoc')) AS v(i, e)
ORDER BY i;

--
-- 8. The old functions still work, and the status view shows what 1.0 left:
-- the overrides, the pause, the cooldown and its lowered rate, the failures.
--
SELECT allowed, round(remaining::numeric, 3) AS remaining FROM ratebucket.bucket_take('u:api');
SELECT allowed, wait_seconds BETWEEN 900 AND 1802 AS waits_out_the_cooldown
FROM ratebucket.bucket_take('u:cooling');
SELECT allowed FROM ratebucket.bucket_take('u:paused');
SELECT ratebucket.bucket_ready('u:paused') AS ready_paused;
SELECT endpoint, configured, conf_floor_rate, paused,
	   cooldown_seconds BETWEEN 900 AND 1800 AS cooling, effective_rate < rate AS lowered,
	   breaker, failure_run, takes_granted
FROM ratebucket.bucket_status ORDER BY endpoint;
-- A third failure in a row opens u:api's breaker: its override (3, where
-- the default is 5) carried over.  And the pause ends when resumed.
SELECT outcome, breaker FROM ratebucket.bucket_observe('u:api', 500);
SELECT ratebucket.bucket_resume('u:paused');
SELECT allowed FROM ratebucket.bucket_take('u:paused');

-- 1.2: an old row becomes a calendar quota (written through the columns
-- the update added, in the session that ran the update), and the status
-- view shows it.
SELECT ratebucket.bucket_configure_quota('u:adhoc', 3, 'day', 'Asia/Tokyo');
SELECT allowed, remaining FROM ratebucket.bucket_take('u:adhoc', 2);
SELECT endpoint, configured, quota_period, quota_time_zone, quota, quota_used, quota_remaining
FROM ratebucket.bucket_status WHERE endpoint = 'u:adhoc';

--
-- 9. Striping (1.2) works on rows 1.0 created: u:cooling, configured on 1.0
-- and cooling down, striped over 2 keeps its cooldown on both stripes; the
-- worker, granted bucket_take (as 1.0 documented), takes from it unchanged
-- (and cannot stripe); put back in one row, it is as it was.
--
SELECT ratebucket.bucket_stripe('u:cooling', 2) AS stripes_before;
SELECT stripes, round(tokens::numeric, 3) AS tokens, cooldown_seconds BETWEEN 900 AND 1800 AS cooling,
	   effective_rate
FROM ratebucket.bucket_status WHERE endpoint = 'u:cooling';
GRANT USAGE ON SCHEMA ratebucket TO regress_rb_upgrade_worker;
GRANT EXECUTE ON FUNCTION ratebucket.bucket_take(text, float8) TO regress_rb_upgrade_worker;
SET ROLE regress_rb_upgrade_worker;
-- (the rest of the cooldown, then 4 s for a token: a stripe refills at half
-- the halved rate)
SELECT allowed, wait_seconds BETWEEN 900 AND 1804 AS waits_out_the_cooldown
FROM ratebucket.bucket_take('u:cooling');
SELECT pg_temp.try_stripe() AS worker_stripes;
RESET ROLE;
REVOKE ALL ON SCHEMA ratebucket FROM regress_rb_upgrade_worker;
REVOKE ALL ON FUNCTION ratebucket.bucket_take(text, float8) FROM regress_rb_upgrade_worker;
SELECT ratebucket.bucket_stripe('u:cooling', 1) AS stripes_before;
SELECT stripes, round(tokens::numeric, 3) AS tokens, cooldown_seconds BETWEEN 900 AND 1800 AS cooling
FROM ratebucket.bucket_status WHERE endpoint = 'u:cooling';

--
-- 10. Templates (1.6) leave the endpoints 1.0 configured alone (they have
-- a configuration of their own), and configure a new one at its first take.
--
SELECT ratebucket.bucket_template('u:*', 2, 6) AS configured_now;
SELECT allowed, remaining FROM ratebucket.bucket_take('u:new', 1);
SELECT endpoint, conf_rate, conf_capacity, template
FROM ratebucket.bucket_status ORDER BY endpoint;
SELECT ratebucket.bucket_template_drop('u:*');
SELECT ratebucket.bucket_drop('u:new');

DROP ROLE regress_rb_upgrade_worker, regress_rb_upgrade_nobody;

-- The extension is at the newest version.
SELECT extversion = (SELECT default_version FROM pg_available_extensions
					 WHERE name = 'ratebucket') AS is_default_version
FROM pg_extension WHERE extname = 'ratebucket';

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
