--
-- quota: calendar quotas.  A quota is a bucket whose tokens come back in
-- full at each boundary of its period in a named time zone.  The calendar
-- arithmetic is checked at explicit times through quota_window; the takes
-- are checked against a window moved into the past through the table (a
-- test cannot wait for midnight).
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;
SET TIME ZONE 'UTC';

--
-- 1. Windows.  UTC: an hour, a day, an ISO week (from Monday), a month
-- (December ends at the new year).
--
SELECT p AS period, w.window_start, w.resets_at
FROM unnest(ARRAY['hour', 'day', 'week', 'month']) AS p,
	 LATERAL ratebucket.quota_window(p, 'UTC', '2026-12-31 23:30:15.5+00') AS w;
-- A window holds its start and not its end.
SELECT (ratebucket.quota_window('day', 'UTC', '2026-06-10 00:00:00+00')).window_start AS at_midnight,
	   (ratebucket.quota_window('day', 'UTC', '2026-06-09 23:59:59.999999+00')).resets_at AS a_microsecond_before;
-- Leap February.
SELECT * FROM ratebucket.quota_window('month', 'UTC', '2028-02-15 00:00+00');

-- America/New_York, on the days daylight saving time starts (2026-03-08,
-- 2 a.m. becomes 3 a.m.: a day of 23 hours) and ends (2026-11-01, 2 a.m.
-- becomes 1 a.m.: 25 hours), and the days around them.
SELECT d::date AS local_day, w.window_start, w.resets_at,
	   w.resets_at - w.window_start AS length
FROM unnest(ARRAY['2026-03-07 12:00', '2026-03-08 12:00', '2026-03-09 12:00',
				  '2026-10-31 12:00', '2026-11-01 12:00', '2026-11-02 12:00']) AS d,
	 LATERAL ratebucket.quota_window('day', 'America/New_York',
									 (d || ' America/New_York')::timestamptz) AS w;
-- The hours of those days: the skipped hour does not exist, the repeated
-- hour (1 a.m. EDT, then 1 a.m. EST) is two windows of an hour each.
SELECT at, w.window_start, w.resets_at
FROM unnest(ARRAY['2026-03-08 06:59:59+00', '2026-03-08 07:00:00+00',
				  '2026-11-01 05:30:00+00', '2026-11-01 06:30:00+00',
				  '2026-11-01 07:30:00+00']::timestamptz[]) AS at,
	 LATERAL ratebucket.quota_window('hour', 'America/New_York', at) AS w;
-- Weeks and months that contain a change: a week of 167 or 169 hours.
SELECT p AS period, w.window_start, w.resets_at, w.resets_at - w.window_start AS length
FROM unnest(ARRAY['week', 'month']) AS p,
	 unnest(ARRAY['2026-03-08 12:00+00', '2026-11-01 12:00+00']::timestamptz[]) AS at,
	 LATERAL ratebucket.quota_window(p, 'America/New_York', at) AS w
ORDER BY p, at;
-- A zone half an hour off UTC: its hours start at half past.
SELECT * FROM ratebucket.quota_window('hour', 'Asia/Kolkata', '2026-11-01 06:10+00');
SELECT * FROM ratebucket.quota_window('day', 'Asia/Kolkata', '2026-11-01 06:10+00');

-- Every 31 minutes through two months around each change, in zones with
-- and without daylight saving time: each window contains its instant,
-- starts where date_trunc(period, at, zone) says (days, weeks, months; and
-- hours away from a repeated hour), and ends where the next one starts.
WITH z(zone) AS (VALUES ('UTC'), ('America/New_York'), ('Europe/Berlin'),
					  ('Australia/Sydney'), ('Asia/Kolkata'), ('America/Sao_Paulo')),
	 t(at) AS (SELECT generate_series('2026-02-20'::timestamptz, '2026-04-10', '31 minutes')
			   UNION ALL
			   SELECT generate_series('2026-09-20'::timestamptz, '2026-11-10', '31 minutes')),
	 p(period) AS (VALUES ('hour'), ('day'), ('week'), ('month')),
	 w AS (SELECT z.zone, p.period, t.at, q.window_start, q.resets_at,
				  (ratebucket.quota_window(p.period, z.zone, q.resets_at)).window_start AS next_start
		   FROM z, p, t, LATERAL ratebucket.quota_window(p.period, z.zone, t.at) AS q)
SELECT count(*) AS windows_checked,
	   count(*) FILTER (WHERE NOT (window_start <= at AND at < resets_at)) AS not_containing,
	   count(*) FILTER (WHERE next_start <> resets_at) AS not_adjacent,
	   count(*) FILTER (WHERE window_start <> date_trunc(period, at, zone)
						AND NOT (period = 'hour' AND
								 date_trunc(period, at, zone) + interval '1 hour' = window_start)
						) AS not_date_trunc
FROM w;

--
-- 2. Takes.  500 a day in New York: the quota, used, then refused until
-- the reset (wait_seconds: the time to the boundary).
--
SELECT ratebucket.bucket_configure_quota('q:acct', 500, 'day', 'America/New_York');
SELECT ratebucket.bucket_configure('r:ep', 0.000001, 2);	-- nothing refills during the test
SELECT allowed, remaining, wait_seconds FROM ratebucket.bucket_take('q:acct');
SELECT allowed, remaining, wait_seconds FROM ratebucket.bucket_take('q:acct', 498);
SELECT granted, remaining, wait_seconds > 0 AS waits FROM ratebucket.bucket_take_upto('q:acct', 5);
-- Refused: wait_seconds is the time until the day ends in New York.
SELECT allowed, remaining,
	   abs(wait_seconds - extract(epoch FROM
		   (ratebucket.quota_window('day', 'America/New_York')).resets_at - clock_timestamp())) < 30
		   AS waits_until_the_reset
FROM ratebucket.bucket_take('q:acct');
SELECT granted, abs(wait_seconds - ratebucket.bucket_wait('q:acct')) < 30 AS same_wait
FROM ratebucket.bucket_take_upto('q:acct', 5);
SELECT ratebucket.bucket_ready('q:acct') AS ready,
	   ratebucket.bucket_claimable('q:acct', 10) AS claimable;
-- A take larger than the quota can never be granted: an error.
\set VERBOSITY terse
SELECT * FROM ratebucket.bucket_take('q:acct', 501);
-- The explicit-limits forms: an error, not a silent change of meaning.
SELECT * FROM ratebucket.bucket_take('q:acct', 10, 10);
SELECT * FROM ratebucket.bucket_take_upto('q:acct', 10, 10, 1);
\set VERBOSITY default

-- The status view: used, remaining, and when the quota resets.
SELECT endpoint, rate, capacity, tokens, configured, quota_period, quota_time_zone,
	   quota, quota_used, quota_remaining,
	   quota_window_start = (ratebucket.quota_window('day', 'America/New_York')).window_start AS window_now,
	   quota_resets_at = (ratebucket.quota_window('day', 'America/New_York')).resets_at AS resets_next,
	   takes_granted, tokens_granted
FROM ratebucket.bucket_status ORDER BY endpoint;

-- The boundary.  Move the row's last grant to the last microsecond of the
-- previous window: the next take finds a new day and the full quota.
UPDATE ratebucket.buckets
SET refilled_at = (ratebucket.quota_window('day', 'America/New_York')).window_start - interval '1 microsecond'
WHERE endpoint = 'q:acct';
SELECT tokens, quota_used, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_ready('q:acct') AS ready, ratebucket.bucket_wait('q:acct') AS wait,
	   ratebucket.bucket_claimable('q:acct', 10) AS claimable;
SELECT allowed, remaining, wait_seconds FROM ratebucket.bucket_take('q:acct', 2);
-- A grant at the window's very start belongs to it: no second reset.
UPDATE ratebucket.buckets
SET refilled_at = (ratebucket.quota_window('day', 'America/New_York')).window_start
WHERE endpoint = 'q:acct';
SELECT allowed, remaining FROM ratebucket.bucket_take('q:acct');
-- A clock behind the last grant never reopens the window it left: a row
-- last granted in the next window keeps its tokens now.
UPDATE ratebucket.buckets
SET refilled_at = (ratebucket.quota_window('day', 'America/New_York')).resets_at + interval '1 hour',
	tokens = 0
WHERE endpoint = 'q:acct';
SELECT allowed, remaining, wait_seconds > 86400 AS waits_past_that_window
FROM ratebucket.bucket_take('q:acct');
SELECT quota_used, quota_remaining,
	   quota_resets_at = (ratebucket.quota_window('day', 'America/New_York')).resets_at + interval '1 day' AS resets_after_that_window
FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_reset('q:acct');
SELECT quota_used, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';

--
-- 3. bucket_take_all: an endpoint's rate and its account's daily quota, all
-- or nothing.
--
SELECT ratebucket.bucket_configure_quota('q:acct', 1, 'day', 'America/New_York');
SELECT quota, quota_used, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_reset('q:acct');
SELECT allowed, wait_seconds, remaining FROM ratebucket.bucket_take_all(ARRAY['r:ep', 'q:acct']);
-- The quota is spent: refused, the rate bucket keeps its token, and the
-- wait is until the quota resets.
SELECT allowed, (SELECT array_agg(round(r::numeric, 3)) FROM unnest(remaining) r) AS remaining,
	   abs(wait_seconds - extract(epoch FROM
		   (ratebucket.quota_window('day', 'America/New_York')).resets_at - clock_timestamp())) < 30
		   AS waits_until_the_reset
FROM ratebucket.bucket_take_all(ARRAY['q:acct', 'r:ep']);
SELECT endpoint, round(tokens::numeric, 3) AS tokens, takes_granted FROM ratebucket.bucket_status ORDER BY endpoint;
-- A new day for the quota; the rate bucket spent: refused, and the quota
-- keeps its token.
UPDATE ratebucket.buckets
SET refilled_at = (ratebucket.quota_window('day', 'America/New_York')).window_start - interval '1 second'
WHERE endpoint = 'q:acct';
SELECT allowed FROM ratebucket.bucket_take('r:ep');
SELECT allowed, wait_seconds > 900000 AS waits_for_the_rate,
	   (SELECT array_agg(round(r::numeric, 3)) FROM unnest(remaining) r) AS remaining
FROM ratebucket.bucket_take_all(ARRAY['q:acct', 'r:ep']);
SELECT endpoint, round(tokens::numeric, 3) AS tokens, quota_used, quota_remaining, takes_granted
FROM ratebucket.bucket_status ORDER BY endpoint;

--
-- 4. Feedback.  A 429 with Retry-After puts the quota in a cooldown: its
-- takes wait for it, but what is left of the quota stays, and no rate is
-- lowered (a quota has none).
--
SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', 'Asia/Tokyo');
SELECT quota_period, quota_time_zone, quota, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT outcome, cooldown_seconds BETWEEN 599 AND 600 AS cooling, effective_rate, breaker
FROM ratebucket.bucket_observe('q:acct', 429, '600');
SELECT allowed, remaining, wait_seconds BETWEEN 500 AND 600 AS waits_out_the_cooldown
FROM ratebucket.bucket_take('q:acct');
SELECT s.quota_remaining, b.rate_factor, s.effective_rate, s.cooldowns, s.throttles
FROM ratebucket.bucket_status AS s JOIN ratebucket.buckets AS b USING (endpoint)
WHERE endpoint = 'q:acct';
-- A pause refuses too; a reset ends the cooldown and fills the quota.
SELECT ratebucket.bucket_reset('q:acct');
SELECT ratebucket.bucket_pause('q:acct', '10 minutes');
SELECT allowed, wait_seconds BETWEEN 500 AND 600 AS waits_out_the_pause FROM ratebucket.bucket_take('q:acct');
SELECT ratebucket.bucket_resume('q:acct');
SELECT allowed, remaining FROM ratebucket.bucket_take('q:acct', 3);

--
-- 5. Reconfiguring keeps what the window used: 3 of 10 used, a quota of 5
-- leaves 2; of 2, none.  bucket_configure makes it a rate bucket again,
-- and bucket_configure_quota turns a rate bucket into a quota, full.
--
SELECT ratebucket.bucket_configure_quota('q:acct', 5, 'day', 'Asia/Tokyo');
SELECT quota, quota_used, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_configure_quota('q:acct', 2, 'day', 'Asia/Tokyo');
SELECT quota, quota_used, quota_remaining FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_configure('q:acct', 0.000001, 4);
SELECT rate, capacity, round(tokens::numeric, 3) AS tokens, quota_period, quota_time_zone, quota,
	   quota_used, quota_remaining, quota_window_start, quota_resets_at
FROM ratebucket.bucket_status WHERE endpoint = 'q:acct';
SELECT ratebucket.bucket_configure_quota('r:ep', 100, 'MONTH', 'europe/berlin');
SELECT endpoint, rate, capacity, tokens, quota_period, quota_time_zone, quota_remaining
FROM ratebucket.bucket_status WHERE endpoint = 'r:ep';
SELECT ratebucket.bucket_configure_quota('q:new', 7, 'hour');	-- a new endpoint, UTC
SELECT endpoint, quota_period, quota_time_zone, quota_remaining, configured
FROM ratebucket.bucket_status WHERE endpoint = 'q:new';
-- Quotas are configuration: pg_dump keeps them, bucket_expire never
-- deletes them.
SELECT endpoint FROM ratebucket.buckets WHERE conf_rate IS NOT NULL ORDER BY endpoint;
SELECT ratebucket.bucket_expire('0 seconds') AS expired;

--
-- 6. Bad input: a clear error with its SQLSTATE, and no row changed.
--
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END;
$$;
CREATE FUNCTION pg_temp.fingerprint() RETURNS text
LANGUAGE sql AS $$
	SELECT md5(coalesce(string_agg(b::text, '|' ORDER BY b.endpoint), ''))
	FROM ratebucket.buckets b
$$;
SELECT pg_temp.fingerprint() AS before \gset
WITH cases(stmt) AS (VALUES
	($$SELECT ratebucket.bucket_configure_quota(NULL, 10, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('', 10, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota(repeat('x', 1025), 10, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', NULL, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 0, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', -1, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 'NaN', 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 'Infinity', 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 1e13, 'day')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, NULL)$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'fortnight')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, '')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'days')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', NULL)$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', '')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', 'Mars/Olympus_Mons')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', 'PST')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:acct', 10, 'day', repeat('x', 300))$$),
	($$SELECT ratebucket.bucket_configure_quota('q:never', 10, 'day', 'Mars/Olympus_Mons')$$),
	($$SELECT ratebucket.bucket_configure_quota('q:never', 10, 'decade')$$),
	($$SELECT ratebucket.bucket_take('r:ep', 101)$$),
	($$SELECT ratebucket.bucket_take('r:ep', 1, 1)$$),
	($$SELECT ratebucket.bucket_take_upto('r:ep', 1, 1, 1)$$),
	($$SELECT ratebucket.bucket_take_all(ARRAY['r:ep', 'q:new'], ARRAY[1, 8])$$),
	($$SELECT ratebucket.quota_window('fortnight', 'UTC')$$),
	($$SELECT ratebucket.quota_window('day', 'Mars/Olympus_Mons')$$),
	($$SELECT ratebucket.quota_window('day', 'UTC', 'infinity')$$)
)
SELECT stmt, left(pg_temp.try(stmt), 100) AS result FROM cases;
SELECT pg_temp.fingerprint() = :'before' AS unchanged;
-- No bucket was created either; NULL in, NULL out for the
-- pure function.
SELECT count(*) AS created FROM ratebucket.buckets WHERE endpoint = 'q:never';
SELECT * FROM ratebucket.quota_window(NULL, 'UTC');
-- The time zone database's spelling is stored.
SELECT ratebucket.bucket_configure_quota('q:case', 1, 'Week', 'asia/tokyo');
SELECT quota_period, quota_time_zone FROM ratebucket.buckets WHERE endpoint = 'q:case';

RESET TIME ZONE;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
