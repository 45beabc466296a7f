--
-- storage: the two ways to the bucket rows.  Direct index and heap access
-- (ratebucket.direct_access = on, the default) serves every lookup, lock and
-- update of an existing row; SPI serves the rest, and everything when the
-- setting is off or the table is not as the extension made it.  Both must
-- give the same answers and leave the same rows.
--
-- A rate of 1e-6 tokens/s refills nothing measurable during a test.
-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

SELECT count(*) >= 0 AS cleared
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;

-- The same story on both paths: create, take, be refused, take twice in a
-- subtransaction (the second take sees the first) and roll it back.
CREATE FUNCTION storage_story(path text) RETURNS TABLE (step text, allowed boolean, remaining numeric)
LANGUAGE plpgsql AS $$
DECLARE
	ep text := 'st:' || path;
	r record;
BEGIN
	r := ratebucket.bucket_take(ep, 0.000001, 3, 2);
	step := 'first take of 2'; allowed := r.allowed; remaining := round(r.remaining::numeric, 3); RETURN NEXT;
	r := ratebucket.bucket_take(ep, 0.000001, 3, 2);
	step := 'take of 2 refused'; allowed := r.allowed; remaining := round(r.remaining::numeric, 3); RETURN NEXT;
	BEGIN
		r := ratebucket.bucket_take(ep, 0.000001, 3, 1);
		step := 'take 1, then roll back'; allowed := r.allowed; remaining := round(r.remaining::numeric, 3); RETURN NEXT;
		r := ratebucket.bucket_take(ep, 0.000001, 3, 1);
		step := 'the take sees the one before'; allowed := r.allowed; remaining := round(r.remaining::numeric, 3); RETURN NEXT;
		RAISE EXCEPTION 'roll back';
	EXCEPTION WHEN raise_exception THEN
		NULL;
	END;
	r := ratebucket.bucket_take_upto(ep, 0.000001, 3, 5);
	step := 'upto 5 grants the 1 given back'; allowed := r.granted = 1; remaining := round(r.remaining::numeric, 3); RETURN NEXT;
END $$;

SELECT * FROM storage_story('direct');
SET ratebucket.direct_access = off;
SELECT * FROM storage_story('spi');
RESET ratebucket.direct_access;

SELECT endpoint, rate, capacity, round(tokens::numeric, 3) AS tokens,
	   takes_granted, tokens_granted
FROM ratebucket.buckets WHERE endpoint LIKE 'st:%' ORDER BY endpoint;

-- A refused take locks nothing and writes nothing: no transaction id, no
-- row version.  A granted one writes the row once.
SELECT ratebucket.bucket_configure('st:empty', 0.000001, 1);
SELECT allowed FROM ratebucket.bucket_take('st:empty');
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('st:empty');
SELECT granted FROM ratebucket.bucket_take_upto('st:empty', 3);
SELECT pg_current_xact_id_if_assigned() IS NULL AS refusals_assigned_no_xid;
SELECT xmax = 0 AS row_not_locked FROM ratebucket.buckets WHERE endpoint = 'st:empty';
COMMIT;
SELECT ratebucket.bucket_configure('st:full', 0.000001, 10);
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('st:full');
SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS grant_assigned_xid;
COMMIT;

-- Neither path writes in a read-only transaction (nor on a standby); the
-- peeks still work there.
BEGIN READ ONLY;
SELECT * FROM ratebucket.bucket_take('st:full');
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM ratebucket.bucket_take_upto('st:full', 1);
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM ratebucket.bucket_take_all(ARRAY['st:empty']);
ROLLBACK;
BEGIN READ ONLY;
SELECT ratebucket.bucket_observe('st:full', 429);
ROLLBACK;
SET ratebucket.direct_access = off;
\set VERBOSITY terse
BEGIN READ ONLY;
SELECT ratebucket.bucket_observe('st:full', 429);
ROLLBACK;
\set VERBOSITY default
RESET ratebucket.direct_access;
BEGIN READ ONLY;
SELECT ratebucket.bucket_ready('st:full') AS ready,
	   ratebucket.bucket_ready('st:empty') AS empty_ready,
	   ratebucket.bucket_wait('st:empty') > 1000 AS empty_waits;
COMMIT;
SELECT takes_granted, throttles FROM ratebucket.buckets WHERE endpoint = 'st:full';

-- A table that is no longer as the extension made it is left to SPI, which
-- runs whatever it has: here a trigger, which the direct path would bypass.
CREATE TABLE storage_log (endpoint text, tokens float8);
CREATE FUNCTION storage_log_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.storage_log VALUES (NEW.endpoint, NEW.tokens);
	RETURN NEW;
END $$;
CREATE TRIGGER storage_log AFTER UPDATE ON ratebucket.buckets
	FOR EACH ROW EXECUTE FUNCTION storage_log_row();
SELECT allowed FROM ratebucket.bucket_take('st:full');
SELECT allowed FROM ratebucket.bucket_take('st:full', 2);
SELECT ratebucket.bucket_observe('st:full', 200);
SELECT endpoint, round(tokens::numeric, 3) AS tokens FROM storage_log;
DROP TRIGGER storage_log ON ratebucket.buckets;
-- Back to the direct path once the trigger is gone: nothing more is logged.
SELECT allowed FROM ratebucket.bucket_take('st:full');
SELECT count(*) AS logged FROM storage_log;

-- An index of the user's own is maintained too (the take then goes through
-- SPI, and its updates are no longer HOT: the README says why not to).
CREATE INDEX storage_tokens ON ratebucket.buckets (tokens);
SELECT ratebucket.bucket_configure('st:indexed', 0.000001, 100);
SELECT count(*) FROM (SELECT ratebucket.bucket_take('st:indexed') FROM generate_series(1, 20)) AS t;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT endpoint FROM ratebucket.buckets WHERE tokens BETWEEN 79.5 AND 80.5;
SELECT endpoint, round(tokens::numeric, 3) AS tokens FROM ratebucket.buckets
WHERE tokens BETWEEN 79.5 AND 80.5;
RESET enable_seqscan;
DROP INDEX ratebucket.storage_tokens;

-- Many non-HOT updates: in one transaction nothing can prune a bucket's
-- old versions, its page fills, and the row moves to another page, where
-- only a new index entry (which the direct path must write) can find it.
SELECT allowed FROM ratebucket.bucket_take('st:many', 1000000, 1000000);
SELECT (ctid::text::point)[0] AS first_page FROM ratebucket.buckets
WHERE endpoint = 'st:many' \gset
BEGIN;
SELECT count(*) FILTER (WHERE (t).allowed) AS granted
FROM (SELECT ratebucket.bucket_take('st:many', 1000000, 1000000) AS t
	  FROM generate_series(1, 299)) AS s;
COMMIT;
SELECT takes_granted, (ctid::text::point)[0] <> :first_page AS moved_to_another_page
FROM ratebucket.buckets WHERE endpoint = 'st:many';
SET enable_seqscan = off;
SELECT count(*) AS found_by_index FROM ratebucket.buckets WHERE endpoint = 'st:many';
RESET enable_seqscan;

-- Where rows were found: a lookup starts where it found the endpoint's row
-- last time, and goes through the index whenever that place no longer leads
-- to it.  (1) The place truncated away: every row dropped, VACUUM truncates
-- the table to nothing, and the endpoint's take reads no block past its end.
SELECT count(*) AS filled
FROM (SELECT ratebucket.bucket_take('st:fill:' || g, 0.000001, 5)
	  FROM generate_series(1, 200) AS g) AS t;
SELECT allowed FROM ratebucket.bucket_take('st:last', 0.000001, 5);
SELECT allowed FROM ratebucket.bucket_take('st:last', 0.000001, 5);
SELECT (ctid::text::point)[0] > 0 AS past_the_first_page
FROM ratebucket.buckets WHERE endpoint = 'st:last';
SELECT count(*) > 0 AS dropped
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;
\i test/sql/vacuum_until_empty.sql
SELECT pg_relation_size('ratebucket.buckets') AS bytes_left;
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('st:last', 0.000001, 5);
-- (2) The place reused by another endpoint's row: the endpoint is compared,
-- the other row is left as it was, and the endpoint gets a row of its own.
SELECT ctid AS first_place FROM ratebucket.buckets WHERE endpoint = 'st:last' \gset
SELECT allowed FROM ratebucket.bucket_take('st:last', 0.000001, 5);
SELECT ratebucket.bucket_drop('st:last');
\i test/sql/vacuum_until_empty.sql
SELECT allowed FROM ratebucket.bucket_take('st:other', 0.000001, 5);
SELECT ctid = :'first_place' AS other_in_its_place
FROM ratebucket.buckets WHERE endpoint = 'st:other';
SELECT allowed, round(remaining::numeric, 3) AS remaining
FROM ratebucket.bucket_take('st:last', 0.000001, 5);
SELECT endpoint, round(tokens::numeric, 3) AS tokens, takes_granted
FROM ratebucket.buckets ORDER BY endpoint;

-- Pruning: a take prunes the page its bucket lies on (removes the versions
-- no transaction can see any more) only once the page is short of room,
-- and then all of them at once.  A plain read prunes a page as soon as it
-- has less free space than the fillfactor keeps, which at 50 a full page
-- has after any update.  60 buckets fill the first page as far as the
-- fillfactor lets them, and then some more; six takes of the first bucket,
-- each committed, leave the six versions they replaced in place: the
-- newest is the sixth line past the page's rows (a prune at each take
-- would have freed the lines, and the newest would be the first or second).
SELECT count(*) > 0 AS dropped
FROM (SELECT ratebucket.bucket_drop(endpoint) FROM ratebucket.buckets) AS d;
\i test/sql/vacuum_until_empty.sql
SELECT count(*) AS created
FROM (SELECT ratebucket.bucket_take('st:prune:' || g, 1000000, 1000000)
	  FROM generate_series(1, 60) AS g) AS t;
SELECT count(*) AS first_page_rows,
	   pg_relation_size('ratebucket.buckets') AS bytes_before
FROM ratebucket.buckets WHERE (ctid::text::point)[0] = 0 \gset
SELECT ctid AS probe_place FROM ratebucket.buckets WHERE endpoint = 'st:prune:1';
-- n takes of a bucket, each in a transaction of its own
CREATE PROCEDURE storage_takes(p_endpoint text, n int)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		PERFORM ratebucket.bucket_take(p_endpoint, 1000000, 1000000);
		COMMIT;
	END LOOP;
END $$;
CALL storage_takes('st:prune:1', 6);
SELECT (ctid::text::point)[0] AS page,
	   (ctid::text::point)[1] - :first_page_rows AS lines_past_the_rows
FROM ratebucket.buckets WHERE endpoint = 'st:prune:1';
-- A page short of room is pruned: after 300 more takes (the page has room
-- for some 20 more versions) the row is still on the first page, and the
-- table as long as it was.
CALL storage_takes('st:prune:1', 300);
SELECT takes_granted, (ctid::text::point)[0] AS page,
	   pg_relation_size('ratebucket.buckets') = :bytes_before AS same_length
FROM ratebucket.buckets WHERE endpoint = 'st:prune:1';

DROP TABLE storage_log;
DROP FUNCTION storage_log_row();
DROP FUNCTION storage_story(text);
DROP PROCEDURE storage_takes(text, int);

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
