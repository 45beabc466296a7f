--
-- endpoint_limits: every limit of an endpoint in one row, and what holds a
-- take of it now (the first that applies: paused, breaker open, cooldown,
-- quota spent, no tokens, cap full) and until when.  Each endpoint here is
-- held by one thing, and one endpoint by two (the first wins); a take of
-- each shows that held_by says what a take meets.
--

SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

-- Rates so low that nothing refills while this test runs.
SELECT ratebucket.bucket_configure('l:free', 0.000001, 5, floor_rate => 0.0000001);
SELECT ratebucket.bucket_configure('l:paused', 0.000001, 5);
SELECT ratebucket.bucket_pause('l:paused', '1 hour');
SELECT ratebucket.bucket_configure('l:resumed_never', 0.000001, 5);
SELECT ratebucket.bucket_pause('l:resumed_never');
SELECT ratebucket.bucket_configure('l:open', 0.000001, 5, breaker_failures => 1);
SELECT outcome FROM ratebucket.bucket_observe('l:open', 503);
SELECT ratebucket.bucket_configure('l:cool', 1, 5, throttle_factor => 0.5);
SELECT outcome FROM ratebucket.bucket_observe('l:cool', 429, '600');
SELECT ratebucket.bucket_configure_quota('l:quota', 2, 'day');
SELECT allowed FROM ratebucket.bucket_take('l:quota', 2);
SELECT ratebucket.bucket_configure('l:empty', 0.001, 1);
SELECT allowed FROM ratebucket.bucket_take('l:empty');
SELECT ratebucket.bucket_configure('l:capped', 0.000001, 5);
SELECT ratebucket.inflight_configure('l:capped', 1);
SELECT cardinality(ratebucket.inflight_acquire('l:capped'));
-- paused and in a cooldown: the pause comes first
SELECT ratebucket.bucket_configure('l:both', 1, 5);
SELECT outcome FROM ratebucket.bucket_observe('l:both', 429, '600');
SELECT ratebucket.bucket_pause('l:both');

SELECT endpoint, held_by,
	   until IS NOT NULL AS has_until,
	   -- minutes left where the test sets them: the pause, the cooldown, the next token
	   CASE WHEN held_by IN ('paused', 'cooldown', 'no tokens')
			THEN round(extract(epoch FROM until - clock_timestamp()) / 60) END AS minutes_left,
	   round(tokens::numeric, 2) AS tokens, capacity, effective_rate, configured_rate, floor_rate,
	   breaker, paused, paused_until IS NOT NULL AS paused_until_set,
	   quota, quota_used, quota_remaining, cap, in_flight, stripes, configured
FROM ratebucket.endpoint_limits ORDER BY endpoint;

-- held_by says what a take meets: refused by each holder, granted where
-- nothing holds (the capped endpoint's bucket still grants: the cap holds
-- the claim's slot, not the take).
SELECT l.endpoint, l.held_by, t.allowed
FROM ratebucket.endpoint_limits AS l,
	 LATERAL ratebucket.bucket_take(l.endpoint, 1) AS t
WHERE l.endpoint <> 'l:capped'
ORDER BY l.endpoint;

-- A striped endpoint: its tokens are its stripes'.
SELECT ratebucket.bucket_configure('l:hot', 0.000001, 8);
SELECT ratebucket.bucket_stripe('l:hot', 4);
SELECT allowed FROM ratebucket.bucket_take('l:hot');
SELECT endpoint, held_by, round(tokens::numeric) AS tokens, stripes
FROM ratebucket.endpoint_limits WHERE endpoint = 'l:hot';

-- Closed to PUBLIC, like the other views.
SELECT has_table_privilege('public', 'ratebucket.endpoint_limits', 'SELECT') AS public_may_select;

DROP EXTENSION ratebucket;
