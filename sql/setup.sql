--
-- setup: install the extension and check what it installed.
--

-- Set-up: a fresh install, whatever an earlier test left behind (every
-- test file runs alone or in any order).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS ratebucket CASCADE;
DROP SCHEMA IF EXISTS ratebucket CASCADE;
RESET client_min_messages;
CREATE EXTENSION ratebucket;

-- Pinned schema, not relocatable.
SELECT extname, extversion, n.nspname AS schema, extrelocatable
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE extname = 'ratebucket';

-- Every function, table and view explains itself in psql (COMMENT ON).
SELECT p.oid::regprocedure AS function,
	   obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
FROM pg_proc p
WHERE p.pronamespace = 'ratebucket'::regnamespace
ORDER BY p.oid::regprocedure::text;

SELECT c.relname, c.relkind, obj_description(c.oid, 'pg_class') IS NOT NULL AS commented
FROM pg_class c
WHERE c.relnamespace = 'ratebucket'::regnamespace AND c.relkind IN ('r', 'v')
ORDER BY 1;

-- A take is a HOT update only if no index covers a column a take changes:
-- the only index is the primary key on endpoint.
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
FROM pg_index
WHERE indrelid = 'ratebucket.buckets'::regclass;

-- Room on each page for new row versions, and a hot-table autovacuum.
SELECT unnest(reloptions) AS option
FROM pg_class WHERE oid = 'ratebucket.buckets'::regclass
ORDER BY 1;

-- Configured endpoints are dumped by pg_dump.
SELECT extconfig::regclass[] AS config_tables, extcondition
FROM pg_extension WHERE extname = 'ratebucket';

-- Functions that write are volatile; the arithmetic is immutable.  The takes
-- and the peek run SQL of their own, so they tell the planner they cost more
-- than a comparison.
SELECT p.proname, p.provolatile, p.proparallel, p.procost, p.proisstrict, p.prosecdef,
	   p.proconfig
FROM pg_proc p
WHERE p.pronamespace = 'ratebucket'::regnamespace
ORDER BY p.proname, p.pronargs;

-- Clean-up: nothing of this test is left behind (neither drop would pass
-- without CASCADE if something were).
DROP EXTENSION ratebucket;
DROP SCHEMA ratebucket;
