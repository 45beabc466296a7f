--
-- feedback: bucket_observe, cooldowns, the effective rate (decrease, floor,
-- recovery), the circuit breaker, pause and resume.
--
-- Where time matters, the tests either use short durations set for this
-- session (the settings are superuser-only), or compute the state at an
-- explicit time with bucket_now(row, at).
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP ROLE IF EXISTS regress_rb_plain;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;
\set VERBOSITY terse

-- The outcome table: one fresh bucket per status.
SELECT s.label, o.outcome, o.breaker
FROM (VALUES ('200', 200, NULL), ('204', 204, NULL), ('299', 299, NULL),
			 ('100', 100, NULL), ('301', 301, NULL), ('304', 304, NULL),
			 ('400', 400, NULL), ('404', 404, NULL), ('409', 409, NULL),
			 ('408', 408, NULL), ('429', 429, NULL), ('429 + Retry-After', 429, '3'),
			 ('500', 500, NULL), ('502', 502, NULL), ('504', 504, NULL),
			 ('503', 503, NULL), ('503 + Retry-After', 503, '3'),
			 ('0 (no response)', 0, NULL), ('NULL (no response)', NULL, NULL))
	 AS s(label, status, ra),
	 LATERAL (SELECT ratebucket.bucket_take('o:' || s.label, 100, 10)) AS t,
	 LATERAL ratebucket.bucket_observe('o:' || s.label, s.status, s.ra) AS o
ORDER BY s.label;
-- What each did to its bucket.
SELECT endpoint, successes, failures, throttles, cooldowns, failure_run,
	   cooldown_seconds > 0 AS cooling, effective_rate, last_status
FROM ratebucket.bucket_status WHERE endpoint LIKE 'o:%' ORDER BY endpoint;

-- An endpoint without a bucket: the outcome is reported, nothing changes.
SELECT * FROM ratebucket.bucket_observe('o:unknown', 429, '10');
SELECT count(*) FROM ratebucket.buckets WHERE endpoint = 'o:unknown';

--
-- 429: a cooldown, and the effective rate drops to throttle_factor (0.7) of
-- the rate the request was sent at, down to the floor.
--
SELECT ratebucket.bucket_configure('f:api', 100, 10);
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate, breaker
FROM ratebucket.bucket_observe('f:api', 429, '2');
-- During the cooldown: not ready, and a take waits at least until its end.
SELECT ratebucket.bucket_ready('f:api') AS ready;
SELECT allowed, wait_seconds > 1.9 AND wait_seconds < 2.2 AS waits_past_cooldown
FROM ratebucket.bucket_take('f:api');
SELECT allowed, wait_seconds > 1.9 AND wait_seconds < 2.2 AS waits_past_cooldown
FROM ratebucket.bucket_take('f:api', 1000, 1000);
-- A 429 that arrives during that cooldown (with no send time) lowers nothing
-- more: it was sent before the first one could slow anyone down (a batch in
-- flight, other workers).  Its shorter cooldown does not cut the running one
-- short.
SELECT effective_rate, round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('f:api', 429, '1');
SELECT effective_rate, throttles, cooldowns FROM ratebucket.bucket_status WHERE endpoint = 'f:api';

-- Each 429 after the last cooldown multiplies the rate by 0.7, down to the
-- floor: by default 10% of the rate (10/s).  Cooldowns of 0 s here, so that
-- each 429 comes after the previous one's cooldown, and a 2xx before each
-- (a 429 with nothing but 429s heard since the cooldown ended is a lock-out,
-- below); no return above the lowered rate (return_fraction below
-- throttle_factor) and no climb (recovery_factor 1), so that the figures do
-- not grow in between.
SET ratebucket.min_cooldown = 0;
SET ratebucket.return_fraction = 0.5;
CREATE FUNCTION pg_temp.observe_after_2xx(ep text, retry_after text)
RETURNS TABLE (outcome text, cooldown_seconds float8, effective_rate float8, breaker text)
LANGUAGE sql AS $$
SELECT ratebucket.bucket_observe(ep, 200);
SELECT * FROM ratebucket.bucket_observe(ep, 429, retry_after);
$$;
SELECT ratebucket.bucket_configure('f:halve', 100, 10, recovery_factor => 1);
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate, breaker FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:halve', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate, at_floor_since IS NOT NULL AS at_floor, throttles, cooldowns,
	   failures, failure_run
FROM ratebucket.bucket_status WHERE endpoint = 'f:halve';

-- Recovery, computed from time: held during the cooldown, then a concave
-- return within return_time (2 s) to return_fraction (0.85) of the rate the
-- 429's request was sent at (100/s), then a convex climb across the gap to
-- the configured rate, all of it over recovery_interval (20 s; the 1200
-- requests that take at least as long take 12 s at 100/s), never above the
-- configured rate.  At explicit times:
SELECT b.cooldown_until AS cd FROM ratebucket.buckets b WHERE endpoint = 'f:api' \gset
SELECT d.label, round(n.effective_rate::numeric, 3) AS effective_rate,
	   n.at_floor_since IS NOT NULL AS at_floor, round(n.cooldown_seconds::numeric, 3) AS cooldown
FROM ratebucket.buckets b,
	 (VALUES ('during the cooldown', interval '-0.5 s'), ('cooldown end', '0'),
			 ('+1 s', '1 s'), ('+2 s', '2 s'), ('+5 s', '5 s'), ('+9.5 s', '9.5 s'),
			 ('+1 hour', '1 hour'), ('+1 day', '1 day')) AS d(label, after),
	 LATERAL ratebucket.bucket_now(b, :'cd'::timestamptz + d.after) AS n
WHERE b.endpoint = 'f:api'
ORDER BY d.after;

-- A configured floor: 30/s.
SELECT ratebucket.bucket_configure('f:floor', 100, 10, floor_rate => 30, recovery_factor => 1);
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:floor', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:floor', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:floor', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:floor', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate, at_floor_since IS NOT NULL AS at_floor
FROM ratebucket.bucket_status WHERE endpoint = 'f:floor';
-- A gentler multiplier, configured: x0.8.
SELECT ratebucket.bucket_configure('f:gentle', 100, 10, throttle_factor => 0.8, recovery_factor => 1);
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:gentle', '0');
SELECT round(effective_rate::numeric, 3) AS effective_rate FROM pg_temp.observe_after_2xx('f:gentle', '0');
-- Explicit limits: the decrease applies on top of the rate each take passes.
SELECT allowed FROM ratebucket.bucket_take('f:explicit', 40, 5);
SELECT effective_rate FROM ratebucket.bucket_observe('f:explicit', 429, '1');
RESET ratebucket.min_cooldown;
RESET ratebucket.return_fraction;

--
-- Retry-After, clamped to [min_cooldown, max_cooldown]; a malformed value is
-- the destination's fault: the default cooldown, and it is counted.
--
SET ratebucket.max_cooldown = '10s';
SET ratebucket.default_cooldown = '3s';
SELECT ra.label, round(o.cooldown_seconds::numeric, 0) AS cooldown
FROM (VALUES ('delta 4', '4'),
			 ('delta 0', '0'),
			 ('huge delta', '99999999'),
			 ('date in 6 s', to_char(clock_timestamp() AT TIME ZONE 'UTC' + interval '6.5 s',
									 'Dy, DD Mon YYYY HH24:MI:SS "GMT"')),
			 ('date in the past', 'Sun, 06 Nov 1994 08:49:37 GMT'),
			 ('malformed', 'soon'),
			 ('negative', '-5')) AS ra(label, value),
	 LATERAL (SELECT ratebucket.bucket_take('r:' || ra.label, 10, 10)) AS t,
	 LATERAL ratebucket.bucket_observe('r:' || ra.label, 429, ra.value) AS o
ORDER BY ra.label;
SELECT endpoint, malformed_headers FROM ratebucket.bucket_status
WHERE endpoint LIKE 'r:%' ORDER BY endpoint;
RESET ratebucket.max_cooldown;
RESET ratebucket.default_cooldown;
-- Retry-After may also come in the headers (any case); the argument wins.
SELECT allowed FROM ratebucket.bucket_take('r:headers', 10, 10);
SELECT round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('r:headers', 503, NULL, '{"retry-AFTER": "7"}');
SELECT round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('r:headers', 503, '8', '{"Retry-After": "3"}');
-- A shorter cooldown never cuts a longer one short.
SELECT round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('r:headers', 503, '2');

--
-- Rate-limit headers, whatever the status.
--
SELECT ratebucket.bucket_configure('h:api', 100, 10);
-- Remaining 0: a cooldown until the reset.
SELECT outcome, round(cooldown_seconds::numeric, 0) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('h:api', 200, NULL,
	'{"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "4"}');
-- A published limit below the rate lowers the effective rate (20 per 1 s).
SELECT outcome, effective_rate
FROM ratebucket.bucket_observe('h:api', 200, NULL, '{"RateLimit-Policy": "20;w=1"}');
-- Above the rate, it changes nothing.
SELECT ratebucket.bucket_configure('h:high', 100, 10);
SELECT effective_rate
FROM ratebucket.bucket_observe('h:high', 200, NULL, '{"RateLimit-Policy": "\"default\";q=6000;w=10"}');
-- A 429 with no Retry-After but a reset: the reset is the cooldown.
SELECT round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('h:high', 429, NULL, '{"RateLimit": "limit=100, remaining=0, reset=6"}');
-- Malformed headers are counted, never an error.
SELECT outcome, effective_rate
FROM ratebucket.bucket_observe('h:high', 200, NULL,
	'{"X-RateLimit-Remaining": "lots", "RateLimit-Policy": "???", "Retry-After": "later"}');
SELECT malformed_headers FROM ratebucket.bucket_status WHERE endpoint = 'h:high';

--
-- The circuit breaker: opens after a run of failures (3 here), stays open,
-- lets one probe through when half-open; the probe's success closes it, its
-- failure reopens it for twice as long.  Short periods for the test.
--
SET ratebucket.breaker_open = '300ms';
SET ratebucket.breaker_max_open = '500ms';
SELECT ratebucket.bucket_configure('b:dest', 1000, 100, breaker_failures => 3);
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 500);
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 0);
-- a success ends the run
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 200);
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 502);
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', NULL);
-- a neutral outcome is not a failure; a 408 (request timeout) is: the third
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 404);
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 408);
SELECT breaker, breaker_seconds > 0.2 AS open_for_a_while, failures, failure_run, breaker_opens
FROM ratebucket.bucket_status WHERE endpoint = 'b:dest';
-- Open: takes are refused until it half-opens, and the refusals are not failures.
SELECT allowed, wait_seconds > 0.2 AND wait_seconds <= 0.3 AS waits_for_half_open
FROM ratebucket.bucket_take('b:dest');
SELECT ratebucket.bucket_ready('b:dest') AS ready;
SELECT failures, failure_run FROM ratebucket.bucket_status WHERE endpoint = 'b:dest';
-- Outcomes of requests sent before it opened are counted but do not move
-- the breaker.
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 500);
SELECT pg_sleep(0.35);
-- Half-open: one probe goes; the next take waits for its outcome.
SELECT breaker FROM ratebucket.bucket_status WHERE endpoint = 'b:dest';
SELECT ratebucket.bucket_ready('b:dest') AS ready;
SELECT allowed FROM ratebucket.bucket_take('b:dest') AS probe;
SELECT allowed, wait_seconds > 0 AS must_wait FROM ratebucket.bucket_take('b:dest');
SELECT ratebucket.bucket_ready('b:dest') AS ready;
-- The probe failed: open again, for twice as long (capped at 500 ms).
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 503);
SELECT breaker, breaker_seconds > 0.4 AS open_longer, breaker_opens
FROM ratebucket.bucket_status WHERE endpoint = 'b:dest';
SELECT pg_sleep(0.55);
SELECT allowed FROM ratebucket.bucket_take('b:dest') AS probe;
-- The probe succeeded: closed, and takes flow again.
SELECT outcome, breaker FROM ratebucket.bucket_observe('b:dest', 200);
SELECT allowed FROM ratebucket.bucket_take('b:dest');
SELECT allowed FROM ratebucket.bucket_take('b:dest');
SELECT breaker, failure_run, breaker_opens FROM ratebucket.bucket_status WHERE endpoint = 'b:dest';
-- The half-open state at an explicit time, from the row alone.
SELECT ratebucket.bucket_configure('b:other', 1000, 100, breaker_failures => 1);
SELECT breaker FROM ratebucket.bucket_observe('b:other', 500);
SELECT n.breaker, n.breaker_seconds
FROM ratebucket.buckets b, LATERAL ratebucket.bucket_now(b, b.breaker_open_until + interval '1 ms') n
WHERE b.endpoint = 'b:other';
-- breaker_failures => 0 disables the breaker.
SELECT ratebucket.bucket_configure('b:never', 1000, 100, breaker_failures => 0);
SELECT count(*) FILTER (WHERE o.breaker = 'closed') AS closed_after_10_failures
FROM generate_series(1, 10), LATERAL ratebucket.bucket_observe('b:never', 500) o;
RESET ratebucket.breaker_open;
RESET ratebucket.breaker_max_open;

--
-- Pause and resume by hand.
--
SELECT ratebucket.bucket_configure('p:dest', 1000, 100);
SELECT ratebucket.bucket_pause('p:dest') AS paused, ratebucket.bucket_pause('p:missing') AS paused_missing;
SELECT allowed, wait_seconds FROM ratebucket.bucket_take('p:dest');
SELECT ratebucket.bucket_ready('p:dest') AS ready;
SELECT paused FROM ratebucket.bucket_status WHERE endpoint = 'p:dest';
SELECT ratebucket.bucket_resume('p:dest') AS resumed;
SELECT allowed FROM ratebucket.bucket_take('p:dest');
SELECT ratebucket.bucket_pause('p:dest', '2 seconds');
SELECT allowed, wait_seconds > 1.9 AND wait_seconds <= 2 AS waits_for_the_pause
FROM ratebucket.bucket_take('p:dest');
SELECT ratebucket.bucket_pause('p:dest', '-1 second');
SELECT ratebucket.bucket_pause('p:dest', '0');

--
-- bucket_reset forgets all of it; expiry never deletes a bucket that still
-- remembers something.
--
SELECT ratebucket.bucket_reset('f:api');
SELECT effective_rate, cooldown_seconds, breaker, at_floor_since, round(tokens::numeric, 3) AS tokens
FROM ratebucket.bucket_status WHERE endpoint = 'f:api';
SELECT allowed FROM ratebucket.bucket_take('x:throttled', 1000, 1, 1);
SELECT outcome FROM ratebucket.bucket_observe('x:throttled', 429, '0');
SELECT allowed FROM ratebucket.bucket_take('x:failing', 1000, 1, 1);
SELECT outcome FROM ratebucket.bucket_observe('x:failing', 500);
SELECT allowed FROM ratebucket.bucket_take('x:quiet', 1000, 1, 1);
SELECT pg_sleep(0.01);
SELECT ratebucket.bucket_expire('0') > 0 AS expired_some;
SELECT endpoint FROM ratebucket.buckets WHERE endpoint LIKE 'x:%' ORDER BY endpoint;

--
-- Recovery already earned is kept when a new cooldown starts: a second 429
-- after full recovery lowers the full rate again, and a cooldown without a
-- 429 (a 503 with Retry-After) lowers nothing.  Fast recovery for the test
-- (at 1000/s the interval is the time of 1200 requests, 1.2 s).
--
SET ratebucket.return_time = '100ms';
SET ratebucket.recovery_interval = '1s';
SET ratebucket.recovery_factor = 100;
SET ratebucket.min_cooldown = 0;
SELECT ratebucket.bucket_configure('k:api', 1000, 10);
SELECT effective_rate FROM ratebucket.bucket_observe('k:api', 429, '0');
SELECT pg_sleep(0.6);
SELECT effective_rate FROM ratebucket.bucket_status WHERE endpoint = 'k:api';
SELECT effective_rate FROM ratebucket.bucket_observe('k:api', 503, '0');
SELECT effective_rate FROM ratebucket.bucket_observe('k:api', 429, '1');
RESET ratebucket.return_time;
RESET ratebucket.recovery_interval;
RESET ratebucket.recovery_factor;
RESET ratebucket.min_cooldown;

--
-- Half-open: outcomes that arrive before the probe goes out are not the
-- probe's; any answer to the probe that is not a failure (a 404 here)
-- proves the destination is up and closes the breaker.
--
SET ratebucket.breaker_open = '200ms';
SELECT ratebucket.bucket_configure('k:dest', 1000, 100, breaker_failures => 1);
SELECT breaker FROM ratebucket.bucket_observe('k:dest', 500);
SELECT pg_sleep(0.25);
SELECT breaker FROM ratebucket.bucket_observe('k:dest', 0);
SELECT breaker FROM ratebucket.bucket_observe('k:dest', 200);
SELECT allowed FROM ratebucket.bucket_take('k:dest') AS probe;
SELECT outcome, breaker FROM ratebucket.bucket_observe('k:dest', 404);
SELECT allowed FROM ratebucket.bucket_take('k:dest');
-- Disabling the breaker (breaker_failures => 0) closes one left open.
SELECT breaker FROM ratebucket.bucket_observe('k:dest', 500);
SELECT ratebucket.bucket_configure('k:dest', 1000, 100, breaker_failures => 0);
SELECT breaker FROM ratebucket.bucket_observe('k:dest', 500);
SELECT allowed FROM ratebucket.bucket_take('k:dest');
RESET ratebucket.breaker_open;

-- A finite pause reports its own end, however far.
SELECT ratebucket.bucket_pause('k:dest', '2 hours');
SELECT allowed, wait_seconds BETWEEN 7199 AND 7200 AS waits_two_hours
FROM ratebucket.bucket_take('k:dest');

--
-- One decrease per throttle episode, judged by the request's send time: a
-- 429 to a request sent before the last episode's cooldown ended (a late
-- answer from the same burst) lowers nothing, however late it is observed;
-- one sent after lowers the rate it was sent at.
--
SELECT ratebucket.bucket_configure('e:api', 100, 10);
SELECT clock_timestamp() AS before_episode \gset
SELECT effective_rate, round(cooldown_seconds::numeric, 0) AS cooldown
FROM ratebucket.bucket_observe('e:api', 429, '1', NULL, clock_timestamp());
SELECT rate_factor AS f1, factor_at AS at1 FROM ratebucket.buckets WHERE endpoint = 'e:api' \gset
SELECT pg_sleep(1.1);
-- the cooldown is over; an answer to a request of the same burst arrives:
-- the episode's curve is untouched (its cooldown is renewed: that
-- Retry-After still counts)
SELECT outcome FROM ratebucket.bucket_observe('e:api', 429, '1', NULL, :'before_episode');
SELECT rate_factor = :f1 AS same_low, factor_at = :'at1' AS same_curve, throttles, cooldowns
FROM ratebucket.buckets WHERE endpoint = 'e:api';
-- a request sent after the episode's cooldown (none here, so it ends at
-- once), once the destination took others: the next episode, from the
-- rate it was sent at (70/s)
SET ratebucket.min_cooldown = 0;
SELECT ratebucket.bucket_configure('e:next', 100, 10);
SELECT effective_rate FROM ratebucket.bucket_observe('e:next', 429, '0', NULL, clock_timestamp());
SELECT factor_at AS episode_end FROM ratebucket.buckets WHERE endpoint = 'e:next' \gset
SELECT outcome FROM ratebucket.bucket_observe('e:next', 200, NULL, NULL, :'episode_end');
SELECT round(effective_rate::numeric, 3) AS effective_rate
FROM ratebucket.bucket_observe('e:next', 429, '5', NULL, :'episode_end');
RESET ratebucket.min_cooldown;
-- A send time after the answer (a client clock ahead) counts as the answer's.
SELECT outcome FROM ratebucket.bucket_observe('e:api', 429, NULL, NULL, clock_timestamp() + interval '1 hour');
SELECT * FROM ratebucket.bucket_observe('e:api', 200, NULL, NULL, 'infinity');

--
-- Lock-outs.  A destination that counts requests in a window, the refused
-- ones included, or that holds a penalty, refuses the first requests after
-- a cooldown whatever their rate.  A 429 to a request sent within the time
-- of the first two tokens after a throttle episode's cooldown ended (0.1 s
-- at least), with nothing but 429s heard since it ended, doubles the
-- cooldown (up to 60 s and ratebucket.max_cooldown) and leaves the rate
-- where the episode put it; the return starts at the end of the longer
-- cooldown.  Send times are given, so that the figures do not depend on
-- how long the statements take.
--
SET ratebucket.default_cooldown = '200ms';
SET ratebucket.min_cooldown = '100ms';
SELECT ratebucket.bucket_configure('l:window', 10, 5);
-- the episode: 7/s, the default cooldown (a bare 429)
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('l:window', 429);
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:window' \gset
SELECT pg_sleep(0.25);
-- the first request after it, sent 10 ms after its end, refused: twice the
-- cooldown, the same rate
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('l:window', 429, NULL, NULL, :'cd'::timestamptz + interval '10 ms');
SELECT cooldown_until AS cd, factor_at = cooldown_until AS returns_after_it,
	   cooldown_until - cooldown_from AS lasts
FROM ratebucket.buckets WHERE endpoint = 'l:window' \gset
SELECT :'returns_after_it' AS returns_after_it, :'lasts' AS lasts;
-- a 429 to a request sent before that (another of the same burst) changes
-- nothing
SELECT effective_rate, cooldown_until = :'cd' AS same_cooldown
FROM ratebucket.bucket_observe('l:window', 429, NULL, NULL, :'cd'::timestamptz - interval '100 ms'),
	 ratebucket.buckets WHERE endpoint = 'l:window';
SELECT pg_sleep(0.45);
-- again: twice that
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('l:window', 429, NULL, NULL, :'cd'::timestamptz + interval '10 ms');
-- and again, up to ratebucket.max_cooldown (1 s here)
SET ratebucket.max_cooldown = '1s';
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:window' \gset
SELECT pg_sleep(0.85);
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('l:window', 429, NULL, NULL, :'cd'::timestamptz + interval '10 ms');
RESET ratebucket.max_cooldown;
SELECT effective_rate, throttles, cooldowns FROM ratebucket.bucket_status WHERE endpoint = 'l:window';
-- How long the destination stayed closed since the episode began: twice
-- the last cooldown less the default, what cooldowns doubling from the
-- default add up to (1.8 s here, where max_cooldown held the last to 1 s).
-- A level must hold that long and 10 s more before it counts as one that held.
SELECT round(lockout_seconds::numeric, 1) AS lockout_seconds FROM ratebucket.buckets WHERE endpoint = 'l:window';
-- Out of the lock-out, the rate returns as the episode set it: 7/s at the
-- end of the last cooldown, 0.85 of 10/s two seconds (return_time) later.
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:window' \gset
SELECT d.label, round(n.effective_rate::numeric, 3) AS effective_rate
FROM ratebucket.buckets b,
	 (VALUES ('cooldown end', interval '0'), ('+2 s', '2 s')) AS d(label, after),
	 LATERAL ratebucket.bucket_now(b, :'cd'::timestamptz + d.after) AS n
WHERE b.endpoint = 'l:window'
ORDER BY d.after;

-- Not a lock-out: a 2xx heard since the cooldown ended (the destination
-- took a request back: it refills as it goes).  The 429 after it is the
-- next episode: 0.7 of the rate it was sent at, a little above 7/s (the
-- return had begun).
SELECT ratebucket.bucket_configure('l:bucket', 10, 5);
SELECT effective_rate FROM ratebucket.bucket_observe('l:bucket', 429);
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:bucket' \gset
SELECT pg_sleep(0.25);
SELECT outcome FROM ratebucket.bucket_observe('l:bucket', 200, NULL, NULL, :'cd'::timestamptz + interval '5 ms');
SELECT round(effective_rate::numeric, 3) AS effective_rate, round(cooldown_seconds::numeric, 1) AS cooldown
FROM ratebucket.bucket_observe('l:bucket', 429, NULL, NULL, :'cd'::timestamptz + interval '10 ms');
-- Not a lock-out: a request sent later than the first two tokens at the
-- rate of the moment (7/s: some 0.29 s); the next episode lowers the rate.
SELECT ratebucket.bucket_configure('l:late', 10, 5);
SELECT effective_rate FROM ratebucket.bucket_observe('l:late', 429);
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:late' \gset
SELECT pg_sleep(0.65);
SELECT effective_rate < 7 AS lowered, round(cooldown_seconds::numeric, 1) AS cooldown
FROM ratebucket.bucket_observe('l:late', 429, NULL, NULL, :'cd'::timestamptz + interval '0.4 s');
-- A lock-out whose 429 says when to come back: that time, not twice the
-- last cooldown; the rate stays.
SELECT ratebucket.bucket_configure('l:says', 10, 5);
SELECT effective_rate FROM ratebucket.bucket_observe('l:says', 429);
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:says' \gset
SELECT pg_sleep(0.25);
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown, effective_rate
FROM ratebucket.bucket_observe('l:says', 429, '1', NULL, :'cd'::timestamptz + interval '10 ms');
-- A new episode whose 429 asks for a longer wait than a token bucket would
-- (over 2 s): a window spent until its end.  The rate returns to what the
-- window fits: what was sent since the last episode's cooldown ended (1 s
-- at the rate of the moment), over that time and the wait (3 s): a
-- quarter of the rate it was sent at, but never below what the rate drops
-- to, 0.7 of it, where a token bucket's wait would have brought it back to
-- 0.85 of it.
SELECT ratebucket.bucket_configure('l:fixed', 10, 5);
SELECT effective_rate FROM ratebucket.bucket_observe('l:fixed', 429);
SELECT cooldown_until AS cd FROM ratebucket.buckets WHERE endpoint = 'l:fixed' \gset
SELECT pg_sleep(1.1);
SELECT outcome FROM ratebucket.bucket_observe('l:fixed', 200, NULL, NULL, :'cd'::timestamptz + interval '0.5 s');
SELECT n.effective_rate AS sent_rate
FROM ratebucket.buckets b, ratebucket.bucket_now(b, :'cd'::timestamptz + interval '1 s') AS n
WHERE b.endpoint = 'l:fixed' \gset
SELECT outcome, round(cooldown_seconds::numeric, 1) AS cooldown
FROM ratebucket.bucket_observe('l:fixed', 429, '3', NULL, :'cd'::timestamptz + interval '1 s');
SELECT n.effective_rate BETWEEN 0.69 * :sent_rate AND 0.71 * :sent_rate AS returns_to_0_7
FROM ratebucket.buckets b, ratebucket.bucket_now(b, b.cooldown_until + interval '2 s') AS n
WHERE b.endpoint = 'l:fixed';
RESET ratebucket.default_cooldown;
RESET ratebucket.min_cooldown;

--
-- A level that held (the last episode's return level, 0.5 here): a refusal
-- of the climb above it once it held 10 s (5 % above it, 20 s after the
-- return) returns to the level whole; one at the level itself (3 s after
-- the return, the climb not 1 % above it yet) returns a little below it
-- (0.88 of it, for 3 s held), with no dip.  The state is written by hand:
-- a level that held 20 s would take 20 s to build.
--
SET ratebucket.recovery_interval = '60s';
SET ratebucket.min_cooldown = 0;
SELECT ratebucket.bucket_configure('lv:above', 100, 10), ratebucket.bucket_configure('lv:at', 100, 10);
UPDATE ratebucket.buckets
SET rate_factor = 0.5, target_factor = 0.5,
    factor_at = clock_timestamp() - CASE endpoint WHEN 'lv:above' THEN interval '22 s' ELSE interval '5 s' END
WHERE endpoint IN ('lv:above', 'lv:at');
SELECT endpoint, effective_rate BETWEEN 52 AND 53 AS above_level, effective_rate BETWEEN 50 AND 50.5 AS at_level
FROM ratebucket.bucket_status WHERE endpoint LIKE 'lv:%' ORDER BY endpoint;
SELECT e AS endpoint, (ratebucket.bucket_observe(e, 429, '0', NULL, clock_timestamp())).outcome
FROM unnest(ARRAY['lv:above', 'lv:at']) e;
SELECT endpoint, round(rate_factor::numeric, 2) AS low, round(target_factor::numeric, 2) AS returns_to
FROM ratebucket.buckets WHERE endpoint LIKE 'lv:%' ORDER BY endpoint;
RESET ratebucket.recovery_interval;
RESET ratebucket.min_cooldown;

--
-- What a destination publishes: RateLimit-Policy q;w is q/w per second and
-- bursts of q, a ceiling for the rate and the capacity until it publishes
-- another; a remaining count caps the tokens held.
--
-- (A floor low enough not to hide the policy; rates so low that nothing
-- refills while the takes run.)
SELECT ratebucket.bucket_configure('l:api', 6, 30, floor_rate => 0.001);
SELECT outcome, round(effective_rate::numeric, 3) AS effective_rate
FROM ratebucket.bucket_observe('l:api', 200, NULL, '{"RateLimit-Policy": "15;w=100"}');
SELECT round(s.tokens::numeric, 3) AS tokens, round(b.limit_factor::numeric, 4) AS limit_factor,
	   b.limit_burst_factor
FROM ratebucket.bucket_status s JOIN ratebucket.buckets b USING (endpoint)
WHERE endpoint = 'l:api';
SELECT count(*) FILTER (WHERE a) AS granted_of_20
FROM (SELECT (ratebucket.bucket_take('l:api')).allowed AS a FROM generate_series(1, 20)) x;
-- a higher policy raises the ceiling again
SELECT round(effective_rate::numeric, 3) AS effective_rate
FROM ratebucket.bucket_observe('l:api', 200, NULL, '{"RateLimit-Policy": "45;w=10"}');
-- remaining 2 of the destination's window: no more than 2 tokens held
SELECT ratebucket.bucket_configure('l:rem', 0.01, 30);
SELECT outcome FROM ratebucket.bucket_observe('l:rem', 200, NULL, '{"RateLimit": "limit=30, remaining=2, reset=1"}');
SELECT count(*) FILTER (WHERE a) AS granted_of_5
FROM (SELECT (ratebucket.bucket_take('l:rem')).allowed AS a FROM generate_series(1, 5)) x;
-- A take with limits of its own (1/s, burst 5, below the configured
-- 1000/s): a remaining count refills the row at those limits, not at the
-- configured ones, and only caps it.  Emptied, then 0.1 s later a 200 with
-- 900 remaining: about 0.1 token earned, so at most 1 of 20 takes.
SELECT ratebucket.bucket_configure('l:crm', 1000, 1000);
SELECT count(*) FILTER (WHERE a) >= 5 AS took_the_burst, NOT bool_and(a) AS then_refused
FROM (SELECT (ratebucket.bucket_take('l:crm', 1, 5)).allowed AS a FROM generate_series(1, 10)) x;
SELECT pg_sleep(0.1);
SELECT outcome, effective_rate
FROM ratebucket.bucket_observe('l:crm', 200, NULL, '{"X-RateLimit-Remaining": "900"}');
SELECT count(*) FILTER (WHERE a) <= 1 AS within_bound
FROM (SELECT (ratebucket.bucket_take('l:crm', 1, 5)).allowed AS a FROM generate_series(1, 20)) x;
-- The refill since the request was sent is at the row's rate too: 4 held
-- after a take, then 0 remaining for a request sent 1 s ago: 1 token held.
SELECT ratebucket.bucket_configure('l:crm-sent', 1000, 1000);
SELECT allowed FROM ratebucket.bucket_take('l:crm-sent', 1, 5);
SELECT outcome
FROM ratebucket.bucket_observe('l:crm-sent', 200, NULL, '{"X-RateLimit-Remaining": "0"}',
							   clock_timestamp() - interval '1 s');
SELECT count(*) FILTER (WHERE a) >= 1 AS refilled_since_sent, count(*) FILTER (WHERE a) <= 1 AS within_bound
FROM (SELECT (ratebucket.bucket_take('l:crm-sent', 1, 5)).allowed AS a FROM generate_series(1, 20)) x;

--
-- Bad input: a clear error, nothing changed.
--
SELECT * FROM ratebucket.bucket_observe('f:api', 1000);
SELECT * FROM ratebucket.bucket_observe('f:api', -1);
SELECT * FROM ratebucket.bucket_observe('f:api', 99);
SELECT * FROM ratebucket.bucket_observe('f:api', 200, NULL, '[1, 2]');
SELECT * FROM ratebucket.bucket_observe('f:api', 200, NULL, '"text"');
SELECT * FROM ratebucket.bucket_observe(NULL, 200);
SELECT * FROM ratebucket.bucket_observe('', 200);
SELECT ratebucket.bucket_configure('f:api', 100, 10, floor_rate => 0);
SELECT ratebucket.bucket_configure('f:api', 100, 10, floor_rate => 'NaN');
SELECT ratebucket.bucket_configure('f:api', 100, 10, throttle_factor => 0);
SELECT ratebucket.bucket_configure('f:api', 100, 10, throttle_factor => 1.5);
SELECT ratebucket.bucket_configure('f:api', 100, 10, recovery_factor => 0.9);
SELECT ratebucket.bucket_configure('f:api', 100, 10, breaker_failures => -1);
SELECT ratebucket.bucket_pause(NULL);
SELECT ratebucket.bucket_resume('');
SELECT successes, failures, throttles, last_status FROM ratebucket.bucket_status WHERE endpoint = 'f:api';
-- Unprivileged roles cannot change the policy's settings.
CREATE ROLE regress_rb_plain;
SET ROLE regress_rb_plain;
SET ratebucket.max_cooldown = '1s';
SET ratebucket.throttle_factor = 1;
RESET ROLE;
DROP ROLE regress_rb_plain;
\set VERBOSITY default

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
