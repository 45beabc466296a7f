--
-- headers: parse_retry_after and parse_rate_limit, the parsers behind
-- bucket_observe.  Every call passes an explicit "at", so the outputs do not
-- depend on the clock: at is 2024-06-01 00:00:00 UTC, a Saturday, Unix time
-- 1717200000, throughout.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

\pset null '(null)'

-- Seconds from "at" to a UTC time written the way PostgreSQL reads it: an
-- independent oracle for the dates below.
CREATE FUNCTION pg_temp.secs(ts text) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
	SELECT extract(epoch FROM (ts || '+00')::timestamptz
								- '2024-06-01 00:00:00+00'::timestamptz)::float8
$$;

-- The declarations: pure given "at", so IMMUTABLE and PARALLEL SAFE; not
-- STRICT, since a NULL value is an absent field but a NULL "at" an error.
SELECT p.proname, p.provolatile, p.proparallel, p.proisstrict,
	   pg_get_function_arguments(p.oid) AS arguments,
	   pg_get_function_result(p.oid) AS result
FROM pg_proc p
WHERE p.pronamespace = 'ratebucket'::regnamespace
  AND p.proname IN ('parse_retry_after', 'parse_rate_limit')
ORDER BY p.proname;

--
-- Retry-After (RFC 9110 section 10.2.3): delay-seconds = 1*DIGIT, or an
-- HTTP-date (section 5.6.7).  "expected" is written by hand (delays) or
-- computed by PostgreSQL's own calendar (dates); NULL means "no answer":
-- absent or malformed.  Tabs are shown as \t.
--
WITH cases(note, v, expected) AS (VALUES
	-- delay-seconds
	('zero', '0', 0::float8),
	('one', '1', 1),
	('two minutes', '120', 120),
	('leading zeros', '007', 7),
	('leading/trailing SP', '  120  ', 120),
	('leading/trailing HTAB and SP', E'\t120\t ', 120),
	('2^31 - 1: exact', '2147483647', 2147483647),
	('2^31: exact', '2147483648', 2147483648),
	('2^31 + 1: saturates at 2^31', '2147483649', 2147483648),
	('huge: saturates at 2^31', '99999999999', 2147483648),
	('10000 nines: saturates', repeat('9', 10000), 2147483648),
	-- IMF-fixdate
	('IMF-fixdate, 2 min ahead', 'Sat, 01 Jun 2024 00:02:00 GMT',
	 pg_temp.secs('2024-06-01 00:02:00')),
	('IMF-fixdate, RFC example (past)', 'Sun, 06 Nov 1994 08:49:37 GMT',
	 pg_temp.secs('1994-11-06 08:49:37')),
	('IMF-fixdate, = at', 'Sat, 01 Jun 2024 00:00:00 GMT', 0),
	('IMF-fixdate, 29 Feb of a leap year', 'Thu, 29 Feb 2024 12:00:00 GMT',
	 pg_temp.secs('2024-02-29 12:00:00')),
	('IMF-fixdate, leap second 60', 'Sat, 01 Jun 2024 00:00:60 GMT', 60),
	('IMF-fixdate, day name not the date''s', 'Mon, 06 Nov 1994 08:49:37 GMT',
	 pg_temp.secs('1994-11-06 08:49:37')),
	('IMF-fixdate with OWS around it', E' \tSat, 01 Jun 2024 00:02:00 GMT ', 120),
	-- obsolete RFC 850, two-digit year
	('RFC 850, 30 s ahead', 'Saturday, 01-Jun-24 00:00:30 GMT', 30),
	('RFC 850, RFC example: 94 is 1994', 'Sunday, 06-Nov-94 08:49:37 GMT',
	 pg_temp.secs('1994-11-06 08:49:37')),
	('RFC 850, 70 is 2070 (46 y ahead)', 'Wednesday, 01-Jan-70 00:00:00 GMT',
	 pg_temp.secs('2070-01-01 00:00:00')),
	('RFC 850, 74: exactly 50 y ahead, 2074', 'Friday, 01-Jun-74 00:00:00 GMT',
	 pg_temp.secs('2074-06-01 00:00:00')),
	('RFC 850, 74: 50 y + 1 s ahead, 1974', 'Saturday, 01-Jun-74 00:00:01 GMT',
	 pg_temp.secs('1974-06-01 00:00:01')),
	('RFC 850, 23: last year', 'Tuesday, 28-Feb-23 00:00:00 GMT',
	 pg_temp.secs('2023-02-28 00:00:00')),
	-- asctime
	('asctime, 1 min ahead (day " 1")', 'Sat Jun  1 00:01:00 2024', 60),
	('asctime, RFC example (past)', 'Sun Nov  6 08:49:37 1994',
	 pg_temp.secs('1994-11-06 08:49:37')),
	('asctime, two-digit day', 'Sat Jun 15 00:00:00 2024',
	 pg_temp.secs('2024-06-15 00:00:00')),
	('asctime, day "01" (2DIGIT)', 'Sat Jun 01 00:01:00 2024', 60),
	-- absent: no answer, not an error
	('empty', '', NULL),
	('blank', '   ', NULL),
	('tab only', E'\t', NULL),
	('10000 spaces', repeat(' ', 10000), NULL),
	('NULL', NULL, NULL),
	-- malformed delays
	('word', 'abc', NULL),
	('negative', '-5', NULL),
	('plus sign', '+5', NULL),
	('fraction', '1.5', NULL),
	('unit', '10s', NULL),
	('two numbers', '1 2', NULL),
	('hex', '0x10', NULL),
	('exponent', '1e3', NULL),
	('10000 nines and a letter', repeat('9', 10000) || 'x', NULL),
	-- malformed dates
	('zone other than GMT', 'Sun, 06 Nov 1994 08:49:37 PST', NULL),
	('zone as offset', 'Sun, 06 Nov 1994 08:49:37 +0000', NULL),
	('31 February', 'Sun, 31 Feb 1994 08:49:37 GMT', NULL),
	('29 Feb of a common year', 'Wed, 29 Feb 2023 00:00:00 GMT', NULL),
	('day 00', 'Sun, 00 Nov 1994 08:49:37 GMT', NULL),
	('hour 25', 'Sun, 06 Nov 1994 25:49:37 GMT', NULL),
	('hour 24', 'Sun, 06 Nov 1994 24:00:00 GMT', NULL),
	('minute 60', 'Sun, 06 Nov 1994 08:60:37 GMT', NULL),
	('second 61', 'Sun, 06 Nov 1994 08:49:61 GMT', NULL),
	('month 13 (no such name)', 'Sun, 06 Mon 1994 08:49:37 GMT', NULL),
	('unknown day name', 'Xyz, 06 Nov 1994 08:49:37 GMT', NULL),
	('lower case (HTTP-date is case-sensitive)', 'sun, 06 nov 1994 08:49:37 gmt', NULL),
	('truncated: no seconds', 'Sun, 06 Nov 1994 08:49 GMT', NULL),
	('truncated: no time', 'Sun, 06 Nov 1994', NULL),
	('truncated: no GMT', 'Sun, 06 Nov 1994 08:49:37', NULL),
	('trailing junk', 'Sun, 06 Nov 1994 08:49:37 GMT junk', NULL),
	('IMF-fixdate, one-digit day', 'Sun, 6 Nov 1994 08:49:37 GMT', NULL),
	('IMF-fixdate, two-digit year', 'Sun, 06 Nov 94 08:49:37 GMT', NULL),
	('IMF-fixdate, long day name', 'Sunday, 06 Nov 1994 08:49:37 GMT', NULL),
	('IMF-fixdate, two spaces', 'Sun,  06 Nov 1994 08:49:37 GMT', NULL),
	('RFC 850, short day name', 'Sun, 06-Nov-94 08:49:37 GMT', NULL),
	('RFC 850, four-digit year', 'Sunday, 06-Nov-1994 08:49:37 GMT', NULL),
	('asctime, one space before 1-digit day', 'Sun Nov 6 08:49:37 1994', NULL),
	('asctime with GMT', 'Sun Nov  6 08:49:37 1994 GMT', NULL),
	('ISO 8601', '2024-06-01T00:00:30Z', NULL),
	('a date, then 10000 more bytes', 'Sun, 06 Nov 1994 08:49:37 GMT' || repeat('x', 10000), NULL)
)
SELECT note,
	   left(replace(v, E'\t', '\t'), 36) AS value,
	   ratebucket.parse_retry_after(v, '2024-06-01 00:00:00+00') AS seconds,
	   ratebucket.parse_retry_after(v, '2024-06-01 00:00:00+00')
		   IS NOT DISTINCT FROM expected AS ok
FROM cases;

-- "at" moves a date, never a delay; a fractional "at" is exact.
SELECT ratebucket.parse_retry_after('Sat, 01 Jun 2024 00:00:30 GMT',
									'2024-06-01 00:00:10.25+00') AS date_from_fractional_at,
	   ratebucket.parse_retry_after('30', '1970-01-01 00:00:00+00') AS delay_any_at,
	   ratebucket.parse_retry_after('Sat, 01 Jun 2024 00:00:30 GMT',
									'2024-06-01 02:00:00+02') AS same_instant_other_zone;

-- The default "at" is the clock at the call: a delay does not depend on it,
-- and the RFC's 1994 example is in the past.
SELECT ratebucket.parse_retry_after('120') AS delay,
	   ratebucket.parse_retry_after('Sun, 06 Nov 1994 08:49:37 GMT') < 0 AS in_the_past;


--
-- Rate-limit fields.  Each case is a jsonb object of response headers as a
-- worker received them.  Columns are NULL when no field gave them;
-- malformed counts the fields given that could not be used.
--
WITH cases(note, headers) AS (VALUES
	('no headers', '{}'::jsonb),
	('NULL headers', NULL),
	-- draft -07: RateLimit as a Dictionary, RateLimit-Policy of integers
	('-07 RateLimit', '{"RateLimit": "limit=100, remaining=50, reset=30"}'),
	('-07 RateLimit + Policy', '{"RateLimit": "limit=100, remaining=99, reset=50", "RateLimit-Policy": "100;w=60"}'),
	('-07 limit and reset only', '{"RateLimit": "limit=10, reset=1"}'),
	('-07 Policy, 4 windows: lowest rate', '{"RateLimit-Policy": "10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400"}'),
	('-07 Policy with burst param', '{"RateLimit-Policy": "10;w=1;burst=1000, 1000;w=3600"}'),
	('-07 multiple windows example', '{"RateLimit": "limit=5000, remaining=100, reset=36000", "RateLimit-Policy": "1000;w=3600, 5000;w=86400"}'),
	('-07 lowered limit: Policy wins', '{"RateLimit": "limit=10, remaining=9, reset=50", "RateLimit-Policy": "100;w=60"}'),
	('-07 params and other keys ignored', '{"RateLimit": "limit=10;x=1, remaining=1, reset=7, extra=(1 2);p, flag"}'),
	('-07 duplicate key: last wins', '{"RateLimit": "limit=-1, remaining=5, limit=10"}'),
	-- draft -08 on: Lists of named items
	('-08 RateLimit', '{"RateLimit": "\"default\";r=50;t=30"}'),
	('-08 RateLimit-Policy', '{"RateLimit-Policy": "\"default\";q=100;w=60"}'),
	('-08 both, two policies', '{"RateLimit-Policy": "\"permin\";q=50;w=60,\"perhr\";q=1000;w=3600", "RateLimit": "\"permin\";r=20;t=40, \"perhr\";r=900;t=3000"}'),
	('-08 lowest r, then longest t', '{"RateLimit": "\"a\";r=0;t=10, \"b\";r=0;t=60, \"c\";r=7;t=1"}'),
	('-08 r without t', '{"RateLimit": "\"default\";r=999;pk=:dHJpYWwxMjEzMjM=:"}'),
	('-08 bytes quota skipped', '{"RateLimit-Policy": "\"peruser\";q=65535;qu=\"content-bytes\";w=10;pk=:sdfjLJUOUH==:, \"req\";q=100;w=60;qu=\"requests\""}'),
	('-08 windowless: lowest q', '{"RateLimit-Policy": "\"a\";q=100, \"b\";q=50"}'),
	('-08 a window beats none', '{"RateLimit-Policy": "\"a\";q=5, \"b\";q=100;w=60"}'),
	('-08 equal rates: lower q', '{"RateLimit-Policy": "\"a\";q=600;w=60, \"b\";q=10;w=1"}'),
	('-09 token names', '{"RateLimit": "default;r=5;t=3", "RateLimit-Policy": "default;q=10;w=1"}'),
	('-08 RFC 9651 params ignored', '{"RateLimit-Policy": "\"a\";q=100;w=60;c=\"fixed window\";b=?1;d=@1717200000;e=%\"caf%c3%a9\";f=1.5;g=tok/en"}'),
	('-08 q=0: nothing allowed', '{"RateLimit-Policy": "\"a\";q=0;w=20, \"b\";q=100;w=60", "RateLimit": "\"a\";r=0;t=20"}'),
	('list field on two lines (array)', '{"RateLimit-Policy": ["\"a\";q=100;w=60", "\"b\";q=10;w=60"], "RateLimit": ["\"a\";r=90", "", "\"b\";r=3;t=9"]}'),
	-- X-RateLimit-*, and RateLimit-Limit/-Remaining/-Reset of drafts -00 to -06
	('X- with delta reset', '{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": "30"}'),
	('X- with epoch reset', '{"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1717200042"}'),
	('X- epoch reset in the past: 0', '{"X-RateLimit-Reset": "1717199000"}'),
	('X- epoch reset with fraction', '{"X-RateLimit-Reset": "1717200001.5"}'),
	('X- reset 1e9 is a delay', '{"X-RateLimit-Reset": "1000000000"}'),
	('X- reset as an HTTP-date', '{"X-RateLimit-Reset": "Sat, 01 Jun 2024 00:01:00 GMT"}'),
	('X- values with OWS', '{"X-RateLimit-Limit": " 100\t", "X-RateLimit-Remaining": "\t9 "}'),
	('-00..-06 RateLimit-Limit etc.', '{"RateLimit-Limit": "100", "RateLimit-Remaining": "60", "RateLimit-Reset": "58"}'),
	('-00..-04 Limit with policies', '{"RateLimit-Limit": "10, 10;w=1, 50;w=60"}'),
	('X- present: RateLimit-Limit unread', '{"X-RateLimit-Limit": "5000", "RateLimit-Limit": "garbage"}'),
	('jsonb numbers', '{"x-ratelimit-limit": 100, "x-ratelimit-remaining": 7, "x-ratelimit-reset": 12.5, "retry-after": 5}'),
	('jsonb numbers, 1e3 and -1', '{"X-RateLimit-Limit": 1e3, "X-RateLimit-Remaining": -1}'),
	-- both forms: the IETF fields win, value by value
	('IETF and X-: IETF wins', '{"RateLimit": "limit=100, remaining=50, reset=30", "RateLimit-Policy": "100;w=60", "X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": "1717200100"}'),
	('IETF gaps filled by X-', '{"RateLimit": "\"d\";r=5", "X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "59", "X-RateLimit-Reset": "20"}'),
	('IETF malformed: X- used', '{"RateLimit": "garbage!!", "X-RateLimit-Remaining": "7"}'),
	-- names in any case, Retry-After
	('mixed-case names', '{"RATELIMIT-POLICY": "100;w=60", "x-RateLimit-Remaining": "3", "retry-AFTER": "Sat, 01 Jun 2024 00:00:30 GMT"}'),
	('Retry-After delay', '{"Retry-After": "120"}'),
	('Retry-After date in the past', '{"Retry-After": "Fri, 31 May 2024 23:59:00 GMT"}'),
	('Retry-After with RateLimit', '{"Retry-After": "20", "RateLimit": "limit=15, remaining=15, reset=40", "RateLimit-Policy": "100;w=60"}'),
	('two keys differing in case', '{"Retry-After": "10", "retry-after": "20"}'),
	('array: first line of a singleton', '{"Retry-After": ["10", "20"], "X-RateLimit-Remaining": ["3", "junk"]}'),
	('unknown names ignored', '{"Content-Type": "application/json", "X-RateLimit-Limit-Minute": "5", "RateLimit-Policy-X": "x"}'),
	-- absent rather than malformed
	('JSON nulls are absent', '{"X-RateLimit-Limit": null, "Retry-After": null, "RateLimit": [null]}'),
	('blank values are absent', '{"X-RateLimit-Limit": "  ", "RateLimit": "", "Retry-After": "\t"}'),
	-- malformed, each counted once
	('6 malformed fields', '{"RateLimit": "limit=-1, remaining=5", "RateLimit-Policy": "100;w=0", "X-RateLimit-Limit": "abc", "X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "NaN", "Retry-After": "soon"}'),
	('decimal where integer required', '{"RateLimit": "limit=1.5", "RateLimit-Policy": "100;w=1.5"}'),
	('q missing; r missing', '{"RateLimit-Policy": "\"a\";w=60", "RateLimit": "\"a\";t=30"}'),
	('trailing comma; upper-case key', '{"RateLimit-Policy": "100;w=60,", "RateLimit": "\"a\";R=10"}'),
	('unterminated string; bad item', '{"RateLimit-Policy": "\"a;q=10", "RateLimit": "?2;r=1"}'),
	('one bad item spoils the field', '{"RateLimit-Policy": "\"a\";q=10;w=60, \"b\";q=-1;w=60"}'),
	('X- junk: units, sign, exponent', '{"X-RateLimit-Limit": "100/min", "X-RateLimit-Remaining": "+5", "X-RateLimit-Reset": "1e9"}'),
	('not strings or numbers', '{"X-RateLimit-Limit": true, "RateLimit": {"limit": 100}, "Retry-After": [false], "RateLimit-Policy": [["100;w=60"]]}'),
	-- sizes
	('huge X- values saturate', jsonb_build_object('X-RateLimit-Limit', repeat('9', 10000), 'X-RateLimit-Remaining', '123456789012345678901234567890', 'X-RateLimit-Reset', '99999999999999', 'Retry-After', repeat('9', 10000))),
	('largest sf-integers', '{"RateLimit": "limit=999999999999999, remaining=999999999999999, reset=999999999999999"}'),
	('sf-integer of 16 digits', '{"RateLimit": "\"a\";r=1000000000000000"}'),
	('long garbage', jsonb_build_object('RateLimit', repeat('a=(', 5000), 'RateLimit-Policy', repeat(';', 10000), 'X-RateLimit-Reset', repeat('9', 5000) || '.')),
	('many items', jsonb_build_object('RateLimit-Policy', (SELECT string_agg(format('"p%s";q=%s;w=60', i, 1000 - i), ', ') FROM generate_series(1, 999) i)))
)
SELECT note, r."limit", r.window_seconds, r.remaining, r.reset_seconds,
	   r.retry_after_seconds, r.malformed
FROM cases,
	 LATERAL ratebucket.parse_rate_limit(headers, '2024-06-01 00:00:00+00') AS r;

-- The default "at": a delay needs no clock.
SELECT retry_after_seconds, malformed
FROM ratebucket.parse_rate_limit('{"Retry-After": "45"}');

--
-- Errors: headers that are not an object (NULL is fine: no headers), and a
-- NULL or infinite "at", which is the caller's mistake even when the value
-- is NULL.  Each with its SQLSTATE.
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

SELECT stmt, pg_temp.try(stmt) AS result
FROM (VALUES
	($$SELECT ratebucket.parse_rate_limit('["Retry-After", "10"]', '2024-06-01')$$),
	($$SELECT ratebucket.parse_rate_limit('"RateLimit: limit=1"', '2024-06-01')$$),
	($$SELECT ratebucket.parse_rate_limit('5', '2024-06-01')$$),
	($$SELECT ratebucket.parse_rate_limit('null', '2024-06-01')$$),
	($$SELECT ratebucket.parse_rate_limit(NULL, '2024-06-01')$$),
	($$SELECT ratebucket.parse_rate_limit('{}', NULL)$$),
	($$SELECT ratebucket.parse_rate_limit('{}', '-infinity')$$),
	($$SELECT ratebucket.parse_retry_after('120', NULL)$$),
	($$SELECT ratebucket.parse_retry_after(NULL, NULL)$$),
	($$SELECT ratebucket.parse_retry_after('120', 'infinity')$$)
) AS t(stmt);

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
