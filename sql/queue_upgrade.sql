--
-- queue_upgrade: a queue on ratebucket_queue 1.0, with events in every
-- state, parked ones among them, and a worker's grants, updated with ALTER
-- EXTENSION ... UPDATE, ends up with the same objects as a fresh install of
-- the newest version (which runs sql/install/ratebucket_queue/, the
-- current surface), its rows untouched, its grants kept, and the queue
-- working on the old rows.  (As sql/upgrade.sql does for ratebucket.)
--

-- Set-up: nothing of either extension, nor this test's role.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket_queue CASCADE;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS qu CASCADE;
DROP ROLE IF EXISTS regress_rbq_upgrade_worker;
RESET client_min_messages;
CREATE SCHEMA qu;

-- The snapshot of the extension's objects: pg_temp.ext_objects(name).
\i test/sql/ext_objects.sql

--
-- 1. A fresh install of the newest version: the reference.
--
CREATE EXTENSION ratebucket_queue SCHEMA qu CASCADE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions
                     WHERE name = 'ratebucket_queue') AS is_default_version
FROM pg_extension WHERE extname = 'ratebucket_queue';
CREATE TEMP TABLE snap_fresh AS SELECT * FROM pg_temp.ext_objects('ratebucket_queue');
SELECT split_part(object, ' ', 1) AS kind, count(DISTINCT object) AS objects
FROM snap_fresh GROUP BY 1 ORDER BY 1;
DROP EXTENSION ratebucket_queue;

--
-- 2. Version 1.0, as released, with a queue in it.
--
CREATE EXTENSION ratebucket_queue VERSION '1.0' SCHEMA qu;
SELECT extversion FROM pg_extension WHERE extname = 'ratebucket_queue';
-- What 1.1 adds is not there yet.
SELECT to_regprocedure('qu.unpark(text)') IS NULL AS no_unpark,
       to_regprocedure('qu.explain_endpoint(text)') IS NULL AS no_explain_endpoint,
       (SELECT count(*) FROM pg_attribute
        WHERE attrelid IN ('qu.webhook_events'::regclass, 'qu.webhook_parking'::regclass)
          AND attname IN ('parked', 'limits', 'recheck_at')) AS new_columns;
CREATE TEMP TABLE snap_10 AS SELECT * FROM pg_temp.ext_objects('ratebucket_queue');

-- A worker, granted what doc/claim.md documents.
CREATE ROLE regress_rbq_upgrade_worker;
GRANT USAGE ON SCHEMA qu, ratebucket TO regress_rbq_upgrade_worker;
GRANT SELECT, INSERT, UPDATE ON qu.webhook_events TO regress_rbq_upgrade_worker;
GRANT USAGE ON SEQUENCE qu.webhook_events_id_seq TO regress_rbq_upgrade_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON qu.webhook_parking TO regress_rbq_upgrade_worker;
GRANT EXECUTE ON FUNCTION ratebucket.bucket_take_batch(ratebucket.batch_request[]),
    ratebucket.bucket_grantable(text, int), ratebucket.bucket_claimable(text, int),
    ratebucket.bucket_claimable(text, int, boolean),
    ratebucket.bucket_wait(text, float8),
    ratebucket.bucket_observe(text, int, text, jsonb, timestamptz)
    TO regress_rbq_upgrade_worker;
GRANT SELECT ON ratebucket.bucket_status TO regress_rbq_upgrade_worker;

-- q:open takes 2 a second in bursts of 2; q:paused is paused.  Rates so low
-- that nothing refills while the test runs.
SELECT ratebucket.bucket_configure('q:open', 0.001, 2),
       ratebucket.bucket_configure('q:paused', 0.001, 2), ratebucket.bucket_pause('q:paused');
INSERT INTO qu.webhook_events (endpoint, payload)
SELECT e, jsonb_build_object('n', n)
FROM unnest(ARRAY['q:open', 'q:paused']) e, generate_series(1, 4) n;
-- The worker claims: q:open's 2 tokens; its other 2 and q:paused's 4 are
-- parked; one delivered, one answered 500 (a retry after its backoff).
SET ROLE regress_rbq_upgrade_worker;
SELECT endpoint, count(*) AS claimed FROM qu.claim_events() GROUP BY 1;
SELECT qu.record_delivery(id, CASE WHEN id = 1 THEN 200 ELSE 500 END, claimed_lease => lease_until)
FROM qu.webhook_events WHERE status = 'sending' ORDER BY id;
RESET ROLE;
SELECT endpoint, status, count(*) AS events, bool_and(next_attempt_at > now()) AS ahead
FROM qu.webhook_events GROUP BY 1, 2 ORDER BY 1, 2;

-- Every row now, over 1.0's columns, fingerprinted.
CREATE FUNCTION pg_temp.fingerprint(t regclass, columns text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    f text;
BEGIN
    EXECUTE format($q$
        SELECT md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), ''))
        FROM (SELECT (SELECT jsonb_object_agg(c.key, c.value)
                      FROM jsonb_each(to_jsonb(x)) AS c
                      WHERE c.key = ANY ($1)) AS r
              FROM %s AS x) AS rows$q$, t)
    INTO f USING columns;
    RETURN f;
END $$;
CREATE TEMP TABLE columns_10 AS
SELECT c.oid::regclass AS t, array_agg(a.attname::text) AS columns
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
WHERE c.oid IN ('qu.webhook_events'::regclass, 'qu.webhook_parking'::regclass)
  AND a.attnum > 0 AND NOT a.attisdropped
GROUP BY c.oid;
CREATE TEMP TABLE prints_10 AS
SELECT t, pg_temp.fingerprint(t, columns) AS print FROM columns_10;
SELECT t, cardinality(columns) AS columns FROM columns_10 ORDER BY t::text;

--
-- 3. The update.
--
ALTER EXTENSION ratebucket_queue UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions
                     WHERE name = 'ratebucket_queue') AS is_default_version
FROM pg_extension WHERE extname = 'ratebucket_queue';

--
-- 4. The rows are untouched, and the new columns hold their defaults.
--
SELECT p.t, pg_temp.fingerprint(p.t, c.columns) = p.print AS unchanged
FROM prints_10 p JOIN columns_10 c USING (t) ORDER BY p.t::text;
SELECT count(*) FILTER (WHERE parked) AS marked_parked, count(*) AS events FROM qu.webhook_events;
SELECT endpoint, limits, recheck_at FROM qu.webhook_parking ORDER BY 1;

--
-- 5. The objects: the updated extension's against the fresh install's.  The
-- worker's grants on the tables are the only difference while they stand.
--
CREATE TEMP VIEW fresh_vs_updated AS
SELECT 'fresh only' AS side, * FROM (SELECT * FROM snap_fresh
                                     EXCEPT SELECT * FROM pg_temp.ext_objects('ratebucket_queue')) AS f
UNION ALL
SELECT 'updated only', * FROM (SELECT * FROM pg_temp.ext_objects('ratebucket_queue')
                               EXCEPT SELECT * FROM snap_fresh) AS u;
SELECT * FROM fresh_vs_updated ORDER BY object, property, side;

--
-- 6. The queue on the old rows.  unpark finds nothing 1.0 marked: resumed,
-- q:paused's events come due when 1.0 put them (an hour ahead), and
-- explain_endpoint (an operator's: it reads ratebucket.buckets) says so.
-- Due again, the worker's claim sends q:paused's 2 tokens, the next parks
-- the other 2, marked now; reset, unpark brings them back.
--
SELECT ratebucket.bucket_resume('q:paused');
SELECT qu.unpark('q:paused') AS moved_of_10;
SELECT reason, round(extract(epoch FROM until - now()) / 600) * 600 AS in_s, detail
FROM qu.explain_endpoint('q:paused');
UPDATE qu.webhook_events SET next_attempt_at = now() WHERE endpoint = 'q:paused';
SET ROLE regress_rbq_upgrade_worker;
SELECT endpoint, count(*) AS claimed FROM qu.claim_events() GROUP BY 1 ORDER BY 1;
SELECT count(*) AS claimed FROM qu.claim_events();
RESET ROLE;
SELECT count(*) FILTER (WHERE parked AND next_attempt_at > now() + interval '10 minutes') AS marked,
       count(*) AS pending
FROM qu.webhook_events WHERE endpoint = 'q:paused' AND status = 'pending';
SELECT ratebucket.bucket_reset('q:paused');
SET ROLE regress_rbq_upgrade_worker;
SELECT qu.unpark('q:paused') AS moved;
SELECT endpoint, count(*) AS claimed FROM qu.claim_events() GROUP BY 1 ORDER BY 1;
RESET ROLE;

--
-- 7. With the worker's grants revoked the two are the same: the fresh
-- install ran the current surface, the updated one 1.0 and the update
-- scripts, and any object, property, comment or privilege in which they
-- differ is listed here.  Then what the update changed against 1.0: 1.1's
-- columns, index and functions (unpark, explain_endpoint, explain_keys,
-- record_deliveries, recheck_parked, repace_parked), the new bodies of
-- claim_events, record_delivery, requeue_expired, explain_event and
-- next_due, and every function's search_path (1.4: pg_catalog, pg_temp).
--
REVOKE ALL ON ALL TABLES IN SCHEMA qu FROM regress_rbq_upgrade_worker;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA qu FROM regress_rbq_upgrade_worker;
SELECT * FROM fresh_vs_updated ORDER BY object, property, side;
SELECT coalesce(n.object, o.object) AS object, coalesce(n.property, o.property) AS property,
       o.value IS NOT NULL AS in_10, n.value IS NOT NULL AS updated
FROM snap_10 AS o
FULL JOIN pg_temp.ext_objects('ratebucket_queue') AS n
  ON (n.object, n.property) = (o.object, o.property)
WHERE o.value IS DISTINCT FROM n.value
ORDER BY 1, 2;

--
-- 8. The update to 1.5, or a fresh install, with ratebucket older than
-- 1.10: refused, nothing changed.
--
DROP EXTENSION ratebucket_queue;
DROP EXTENSION ratebucket;
CREATE EXTENSION ratebucket VERSION '1.9';
CREATE EXTENSION ratebucket_queue VERSION '1.4' SCHEMA qu;
\set VERBOSITY default
\set SHOW_CONTEXT never
ALTER EXTENSION ratebucket_queue UPDATE TO '1.5';
\set VERBOSITY terse
\set SHOW_CONTEXT errors
SELECT extversion, to_regprocedure('qu.record_check(bigint[],int[],timestamptz[],text[],jsonb[],boolean[],timestamptz[],int)') IS NULL AS unchanged
FROM pg_extension WHERE extname = 'ratebucket_queue';
DROP EXTENSION ratebucket_queue;
\set VERBOSITY default
\set SHOW_CONTEXT never
CREATE EXTENSION ratebucket_queue SCHEMA qu;
\set VERBOSITY terse
\set SHOW_CONTEXT errors
CREATE EXTENSION ratebucket_queue VERSION '1.4' SCHEMA qu;
ALTER EXTENSION ratebucket UPDATE;
ALTER EXTENSION ratebucket_queue UPDATE TO '1.5';
SELECT extversion FROM pg_extension WHERE extname = 'ratebucket_queue';

-- Clean-up.
REVOKE ALL ON SCHEMA qu, ratebucket FROM regress_rbq_upgrade_worker;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM regress_rbq_upgrade_worker;
REVOKE ALL ON ratebucket.bucket_status FROM regress_rbq_upgrade_worker;
DROP ROLE regress_rbq_upgrade_worker;
DROP EXTENSION ratebucket_queue;
DROP SCHEMA qu;
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
