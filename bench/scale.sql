-- bench/scale.sql: objects of bench/run-scale, run once in each of its
-- databases with
--   psql -v ON_ERROR_STOP=1 -v nbuckets=<N>
-- Creates the extension and N buckets, named 1 .. N as bench/setup.sql
-- names them (bench/bucket_take.sql passes the number as the endpoint),
-- each exactly the row a first bucket_take(ep, 1e6, 1e6) creates: one real
-- take makes a template row, and N copies of it differ only in the
-- endpoint.  The column list is read from the catalog, so this follows the
-- table of the tree under test, and one INSERT ... SELECT is far quicker
-- than 1,000,000 takes.  Then the memory probe and the loops of the memory
-- measurement.

CREATE EXTENSION ratebucket;

SELECT allowed AS template_created FROM ratebucket.bucket_take('template', 1e6, 1e6);

-- INSERT INTO ratebucket.buckets (<every column>) SELECT <g::text for the
-- endpoint, the template's value for every other column> ..., built from the
-- catalog so that it follows the table's columns.  (Other tables the storage
-- may add are not copied: the buckets are then created as a first take would
-- find them only if the storage keeps them in ratebucket.buckets.)
SELECT format('INSERT INTO ratebucket.buckets (%s) SELECT %s '
			  'FROM ratebucket.buckets AS b, generate_series(1, %s) AS g '
			  'WHERE b.endpoint = %L',
			  string_agg(quote_ident(attname), ', ' ORDER BY attnum),
			  string_agg(CASE WHEN attname = 'endpoint' THEN 'g::text'
							  ELSE 'b.' || quote_ident(attname) END, ', ' ORDER BY attnum),
			  :nbuckets, 'template')
FROM pg_attribute AS a
WHERE attrelid = 'ratebucket.buckets'::regclass AND attnum > 0
  AND NOT attisdropped AND attgenerated = ''
  -- an identity or serial column (a bucket id, say) takes its default
  AND attidentity = ''
  AND NOT EXISTS (SELECT FROM pg_attrdef AS d
				  WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum
					AND pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%')
\gexec

DELETE FROM ratebucket.buckets WHERE endpoint = 'template';

-- The memory probe: one row per checkpoint in mem_log, and every memory
-- context of the backend in mem_ctx, read by the backend itself
-- (/proc/self/status and pg_backend_memory_contexts), so the measuring
-- statement runs in the very session that makes the calls.
CREATE TABLE mem_log (
	phase		text,
	calls		bigint,
	pid			int,
	vmrss_kb	bigint,
	rssanon_kb	bigint,
	rssshmem_kb	bigint,
	ctx_total	bigint,
	ctx_used	bigint,
	ctx_count	int,
	at			timestamptz DEFAULT clock_timestamp()
);
CREATE TABLE mem_ctx (
	phase		text,
	calls		bigint,
	name		text,
	parent		text,
	level		int,
	total_bytes	bigint
);

CREATE FUNCTION mem_snap(p_phase text, p_calls bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
	INSERT INTO mem_log (phase, calls, pid, vmrss_kb, rssanon_kb, rssshmem_kb,
						 ctx_total, ctx_used, ctx_count)
	SELECT p_phase, p_calls, pg_backend_pid(),
		   (regexp_match(s, 'VmRSS:\s+(\d+)'))[1]::bigint,
		   (regexp_match(s, 'RssAnon:\s+(\d+)'))[1]::bigint,
		   (regexp_match(s, 'RssShmem:\s+(\d+)'))[1]::bigint,
		   c.total, c.used, c.n
	FROM pg_read_file('/proc/self/status') AS s,
		 (SELECT sum(total_bytes)::bigint AS total, sum(used_bytes)::bigint AS used,
				 count(*)::int AS n
		  FROM pg_backend_memory_contexts) AS c;
	INSERT INTO mem_ctx (phase, calls, name, parent, level, total_bytes)
	SELECT p_phase, p_calls, name, parent, level, total_bytes
	FROM pg_backend_memory_contexts;
$$;

-- The control of the PL/pgSQL loop: a bare primary-key UPDATE, one row per
-- bucket (as bench/setup.sql's).
CREATE TABLE bare (
	id		integer PRIMARY KEY,
	tokens	bigint NOT NULL
) WITH (fillfactor = 50);
INSERT INTO bare (id, tokens) SELECT g, 0 FROM generate_series(1, :nbuckets) AS g;

-- The same calls from a PL/pgSQL loop in one CALL, one transaction per take
-- (COMMIT), with the probe at the given numbers of calls done.  Mode
-- 'plpgsql': bucket_take; 'plpgsql-control': the bare UPDATE instead, to tell
-- PL/pgSQL's own growth (a procedure that COMMITs in a loop) from the take's.
CREATE PROCEDURE mem_loop(p_mode text, p_calls int, p_points int[], p_nbuckets int)
LANGUAGE plpgsql AS $$
DECLARE
	ok	boolean;
	k	int;
BEGIN
	FOR i IN 0 .. p_calls LOOP
		IF i = ANY (p_points) THEN
			PERFORM mem_snap(p_mode, i);
			COMMIT;
		END IF;
		EXIT WHEN i = p_calls;
		-- random() once, outside the statement: in a WHERE clause it would be
		-- evaluated per row and the UPDATE would scan the table.
		k := 1 + floor(random() * p_nbuckets)::int;
		IF p_mode = 'plpgsql-control' THEN
			UPDATE bare SET tokens = tokens - 1 WHERE id = k;
		ELSE
			SELECT t.allowed INTO ok
			FROM ratebucket.bucket_take(k::text, 1e6, 1e6) AS t;
		END IF;
		COMMIT;
	END LOOP;
END;
$$;

VACUUM ANALYZE;
CHECKPOINT;

SELECT count(*) AS buckets FROM ratebucket.buckets;
