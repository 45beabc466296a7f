/* ratebucket--1.6--1.7.sql */

-- ratebucket 1.6 -> 1.7: the status view and bucket_expire on Citus, and
-- endpoint_limits, every limit of an endpoint in one row.
--
-- distribute() puts the status view in a form Citus can plan (a striped
-- endpoint's stripes found by their keys listed first, rows passed as
-- ROW(b.*)::ratebucket.buckets, which a shard's row type becomes there),
-- here and on every worker: on a cluster, run it again after this update,
-- which brings the one-node form back.  bucket_expire runs on each shard
-- where the buckets are distributed.  The in-flight functions changed in
-- the library only (no statement of theirs reads the clock or a ctid in a
-- way a distributed table refuses).  bucket_status gets paused_until, last;
-- endpoint_limits is new, granted to no one.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.7'" to load this file. \quit

CREATE OR REPLACE FUNCTION ratebucket.bucket_expire(idle interval DEFAULT '1 hour')
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint := 0;
	deleted bigint;
	stmt text;
	p record;
	failed text;
BEGIN
	IF idle IS NULL OR idle OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'idle must be a non-negative interval'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Lock the candidates in endpoint order, skipping rows another
	-- transaction holds (a bucket being taken from is not idle): two
	-- expiries, or an expiry and a claim taking several buckets in
	-- endpoint order, never wait for each other in a cycle.  The locking
	-- re-checks the conditions against the newest version of each row.
	-- %1$s is the table: the buckets, or on Citus each of their shards.
	stmt := pg_catalog.format(
		'WITH d AS (DELETE FROM %%1$s AS b'
		' USING (SELECT c.ctid AS tid FROM %%1$s AS c'
		'        WHERE c.conf_rate IS NULL'
		'          AND c.refilled_at OPERATOR(pg_catalog.<=)'
		'              (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %L::pg_catalog.interval)'
		'          AND (ratebucket.bucket_now(ROW(c.*)::ratebucket.buckets,'
		'                                     pg_catalog.clock_timestamp())).expirable'
		'        ORDER BY c.endpoint'
		'        FOR UPDATE SKIP LOCKED) AS v'
		' WHERE b.ctid OPERATOR(pg_catalog.=) v.tid RETURNING 1)'
		' SELECT pg_catalog.count(*) FROM d', idle);
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS d
				   WHERE d.logicalrelid OPERATOR(pg_catalog.=) 'ratebucket.buckets'::pg_catalog.regclass) THEN
			-- Citus: on each shard, on the node that holds it, each in a
			-- transaction of its own; a shard with several placements
			-- counted once
			FOR p IN SELECT r.shardid,
							pg_catalog.bool_and(r.success) AS success,
							pg_catalog.max(r.result) FILTER (WHERE r.success) AS deleted,
							pg_catalog.string_agg(r.nodename OPERATOR(pg_catalog.||) ':'
												  OPERATOR(pg_catalog.||) r.nodeport
												  OPERATOR(pg_catalog.||) ': '
												  OPERATOR(pg_catalog.||) r.result, '; ')
								FILTER (WHERE NOT r.success) AS failure
					 FROM pg_catalog.run_command_on_placements('ratebucket.buckets', stmt) AS r
					 GROUP BY r.shardid ORDER BY r.shardid
			LOOP
				n := n OPERATOR(pg_catalog.+) COALESCE(p.deleted::pg_catalog.int8, 0);
				IF NOT p.success THEN
					failed := pg_catalog.concat_ws('; ', failed,
						pg_catalog.format('shard %s (%s)', p.shardid, p.failure));
				END IF;
			END LOOP;
			IF failed IS NOT NULL THEN
				RAISE EXCEPTION 'could not expire the buckets of every shard: %', failed
					USING ERRCODE = 'connection_exception',
						  DETAIL = pg_catalog.format('The other shards expired on their own: %s buckets were deleted there.',
													 n);
			END IF;
			RETURN n;
		END IF;
	END IF;
	EXECUTE pg_catalog.format(stmt, 'ratebucket.buckets') INTO deleted;
	RETURN deleted;
END;
$$;

COMMENT ON FUNCTION ratebucket.bucket_expire(interval) IS
'Delete buckets that were not configured, have not been refilled for idle, are full now, and hold nothing learned from feedback (a lowered rate, a cooldown, a pause, an open breaker, a run of failures): a later take recreates them full, so expiry changes no decision. Returns the number deleted. On Citus each shard expires on its node, in a transaction of its own.';

-- distribute() also puts the status view in its Citus form.
CREATE OR REPLACE FUNCTION ratebucket.distribute(shard_count int DEFAULT NULL)
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t record;
	f regprocedure;
	status_view text;
	failed text;
BEGIN
	IF pg_catalog.to_regproc('pg_catalog.create_distributed_table') IS NULL THEN
		RAISE EXCEPTION 'Citus is not installed in this database'
			USING ERRCODE = 'feature_not_supported',
				  HINT = 'Run CREATE EXTENSION citus, then ratebucket.distribute() on the coordinator.';
	END IF;
	IF shard_count IS NOT NULL AND shard_count OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'shard_count must be at least 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR t IN SELECT * FROM (VALUES
			(1, 'ratebucket.buckets'::regclass, 'endpoint', NULL::text),
			(2, 'ratebucket.bucket_stripes'::regclass, 'endpoint', 'ratebucket.buckets'),
			(3, 'ratebucket.inflight_caps'::regclass, 'key', 'ratebucket.buckets'),
			(4, 'ratebucket.inflight_slots'::regclass, 'key', 'ratebucket.buckets'),
			(5, 'ratebucket.bucket_templates'::regclass, NULL, NULL)) AS v(o, rel, col, colocate)
		ORDER BY o
	LOOP
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS p
				   WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.rel) THEN
			object := t.rel::text; action := 'already distributed';
		ELSIF t.col IS NULL THEN
			-- the templates' statement trigger only tells the sessions of
			-- the node it fires on to read the templates again, which is
			-- what each node needs: "unsafe" triggers are safe here
			PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
			PERFORM pg_catalog.create_reference_table(t.rel);
			object := t.rel::text; action := 'reference table';
		ELSIF t.colocate IS NULL THEN
			PERFORM pg_catalog.create_distributed_table(t.rel, t.col, shard_count => shard_count);
			object := t.rel::text; action := 'distributed by ' || t.col;
		ELSE
			PERFORM pg_catalog.create_distributed_table(t.rel, t.col, colocate_with => t.colocate);
			object := t.rel::text;
			action := 'distributed by ' || t.col || ', co-located with ' || t.colocate;
		END IF;
		RETURN NEXT;
	END LOOP;
	-- The status view, in a form Citus can plan, here and on every worker:
	-- a striped endpoint's stripes hash to other shards than its row, so
	-- they are found by their keys, listed first (keys), which Citus runs
	-- as a step of its own; the rows go to the functions as
	-- ROW(b.*)::ratebucket.buckets, which a shard's own row type becomes
	-- there.  (On one node the view looks each stripe up from its
	-- endpoint's row instead, which reads only the stripes of the rows it
	-- returns; Citus refuses that join.)
	status_view := $view$
CREATE OR REPLACE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   COALESCE(st.tokens, n.tokens) AS tokens,
	   n.effective_rate,
	   n.cooldown_seconds,
	   n.paused,
	   n.breaker,
	   n.breaker_seconds,
	   n.at_floor_since,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.conf_floor_rate,
	   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
				b.last_granted_at) AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
					b.created_at) AS idle,
	   b.takes_granted OPERATOR(pg_catalog.+) COALESCE(st.takes_granted, 0) AS takes_granted,
	   b.tokens_granted OPERATOR(pg_catalog.+) COALESCE(st.tokens_granted, 0) AS tokens_granted,
	   b.successes,
	   b.failures,
	   b.throttles,
	   b.cooldowns,
	   b.breaker_opens,
	   b.malformed_headers,
	   b.failure_run,
	   b.last_status,
	   b.last_observed_at,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at,
	   b.quota_period,
	   b.quota_time_zone,
	   CASE WHEN b.quota_period IS NOT NULL THEN b.conf_capacity END AS quota,
	   q.used AS quota_used,
	   q.remaining AS quota_remaining,
	   q.window_start AS quota_window_start,
	   q.resets_at AS quota_resets_at,
	   COALESCE(r.stripes, 1) AS stripes,
	   b.template,
	   CASE WHEN n.paused THEN b.paused_until END AS paused_until
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(ROW(b.*)::ratebucket.buckets,
											  pg_catalog.clock_timestamp()) AS n
	 CROSS JOIN LATERAL ratebucket.quota_now(ROW(b.*)::ratebucket.buckets,
											 pg_catalog.clock_timestamp()) AS q
	 LEFT JOIN (
		 WITH keys AS MATERIALIZED (
			 SELECT k.endpoint, ratebucket.stripe_key(k.endpoint, i, k.stripes) AS key
			 FROM ratebucket.bucket_stripes AS k,
				  pg_catalog.generate_series(0, k.stripes OPERATOR(pg_catalog.-) 1) AS i)
		 SELECT keys.endpoint,
				pg_catalog.sum((ratebucket.bucket_now(ROW(s.*)::ratebucket.buckets,
													  pg_catalog.clock_timestamp())).tokens) AS tokens,
				pg_catalog.max(s.last_granted_at) AS last_granted_at,
				CAST(pg_catalog.sum(s.takes_granted) AS pg_catalog.int8) AS takes_granted,
				pg_catalog.sum(s.tokens_granted) AS tokens_granted
		 FROM keys
			  JOIN ratebucket.buckets AS s ON s.endpoint OPERATOR(pg_catalog.=) keys.key
		 GROUP BY keys.endpoint
	 ) AS st ON st.endpoint OPERATOR(pg_catalog.=) b.endpoint
WHERE pg_catalog.octet_length(b.endpoint) OPERATOR(pg_catalog.<=) 1024;
$view$;
	object := 'ratebucket.bucket_status';
	IF pg_catalog.pg_get_viewdef('ratebucket.bucket_status'::pg_catalog.regclass)
	   OPERATOR(pg_catalog.~) 'WITH keys AS' THEN
		action := 'already in its Citus form';
	ELSE
		action := 'replaced by its Citus form, here and on every worker';
	END IF;
	EXECUTE status_view;
	SELECT pg_catalog.string_agg(w.nodename OPERATOR(pg_catalog.||) ':'
								 OPERATOR(pg_catalog.||) w.nodeport
								 OPERATOR(pg_catalog.||) ': '
								 OPERATOR(pg_catalog.||) w.result, '; ')
	INTO failed
	-- (a worker refuses DDL on the extension's objects unless told this
	-- is not to be propagated)
	FROM pg_catalog.run_command_on_workers(
			 'SET citus.enable_ddl_propagation TO off; ' OPERATOR(pg_catalog.||) status_view) AS w
	WHERE NOT w.success;
	IF failed IS NOT NULL THEN
		RAISE EXCEPTION 'could not replace ratebucket.bucket_status on every worker: %', failed
			USING ERRCODE = 'connection_exception';
	END IF;
	RETURN NEXT;
	FOR f IN SELECT p.oid::regprocedure
			 FROM pg_catalog.pg_proc AS p
			 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'ratebucket'::regnamespace
			   AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY[
					 'bucket_take', 'bucket_take_upto', 'bucket_ready', 'bucket_wait',
					 'bucket_claimable', 'bucket_grantable', 'bucket_configure',
					 'bucket_configure_quota', 'bucket_stripe', 'bucket_observe',
					 'bucket_pause', 'bucket_resume', 'bucket_reset', 'bucket_drop',
					 'inflight_configure', 'inflight_acquire', 'inflight_release',
					 'inflight_renew', 'inflight_drop'])
			 ORDER BY 1::text
	LOOP
		object := f::text;
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object AS d
				   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
					 AND d.objid OPERATOR(pg_catalog.=) f::oid
					 AND d.distribution_argument_index IS NOT NULL) THEN
			action := 'already delegated';
		ELSE
			PERFORM pg_catalog.create_distributed_function(f, '$1',
														   colocate_with => 'ratebucket.buckets');
			action := 'delegated on its first argument';
		END IF;
		RETURN NEXT;
	END LOOP;
END;
$$;

CREATE OR REPLACE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   COALESCE(st.tokens, n.tokens) AS tokens,
	   n.effective_rate,
	   n.cooldown_seconds,
	   n.paused,
	   n.breaker,
	   n.breaker_seconds,
	   n.at_floor_since,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.conf_floor_rate,
	   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
				b.last_granted_at) AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
					b.created_at) AS idle,
	   b.takes_granted OPERATOR(pg_catalog.+) COALESCE(st.takes_granted, 0) AS takes_granted,
	   b.tokens_granted OPERATOR(pg_catalog.+) COALESCE(st.tokens_granted, 0) AS tokens_granted,
	   b.successes,
	   b.failures,
	   b.throttles,
	   b.cooldowns,
	   b.breaker_opens,
	   b.malformed_headers,
	   b.failure_run,
	   b.last_status,
	   b.last_observed_at,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at,
	   b.quota_period,
	   b.quota_time_zone,
	   CASE WHEN b.quota_period IS NOT NULL THEN b.conf_capacity END AS quota,
	   q.used AS quota_used,
	   q.remaining AS quota_remaining,
	   q.window_start AS quota_window_start,
	   q.resets_at AS quota_resets_at,
	   COALESCE(r.stripes, 1) AS stripes,
	   b.template,
	   CASE WHEN n.paused THEN b.paused_until END AS paused_until
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n
	 CROSS JOIN LATERAL ratebucket.quota_now(b, pg_catalog.clock_timestamp()) AS q
	 LEFT JOIN LATERAL (
		 SELECT pg_catalog.sum((ratebucket.bucket_now(s, pg_catalog.clock_timestamp())).tokens) AS tokens,
				pg_catalog.max(s.last_granted_at) AS last_granted_at,
				CAST(pg_catalog.sum(s.takes_granted) AS pg_catalog.int8) AS takes_granted,
				pg_catalog.sum(s.tokens_granted) AS tokens_granted
		 FROM pg_catalog.generate_series(0, r.stripes OPERATOR(pg_catalog.-) 1) AS i
			  JOIN ratebucket.buckets AS s
				  ON s.endpoint OPERATOR(pg_catalog.=) ratebucket.stripe_key(b.endpoint, i, r.stripes)
	 ) AS st ON r.stripes IS NOT NULL
WHERE pg_catalog.octet_length(b.endpoint) OPERATOR(pg_catalog.<=) 1024;

COMMENT ON COLUMN ratebucket.bucket_status.paused_until IS
'While paused: until when (infinity: until bucket_resume); NULL otherwise.';

-- What limits each endpoint, in one row: what holds a take of it now, if
-- anything (the first that applies: paused, breaker open, cooldown, quota
-- spent, no tokens, cap full) and until when, then each limit's figures:
-- the bucket, its feedback state, its quota, the in-flight cap keyed like
-- the endpoint, its stripes.  The view to open first when an endpoint's
-- sends wait.
CREATE VIEW ratebucket.endpoint_limits AS
SELECT s.endpoint,
	   h.held_by,
	   h.until,
	   s.tokens,
	   s.capacity,
	   s.effective_rate,
	   COALESCE(s.conf_rate, s.rate) AS configured_rate,
	   s.conf_floor_rate AS floor_rate,
	   s.at_floor_since,
	   s.cooldown_seconds,
	   s.breaker,
	   s.breaker_seconds,
	   s.paused,
	   s.paused_until,
	   s.quota,
	   s.quota_used,
	   s.quota_remaining,
	   s.quota_resets_at,
	   i.cap,
	   i.in_flight,
	   s.stripes,
	   s.configured,
	   s.template
FROM ratebucket.bucket_status AS s
	 LEFT JOIN ratebucket.inflight_status AS i ON i.key OPERATOR(pg_catalog.=) s.endpoint
	 CROSS JOIN LATERAL (
		 SELECT CASE WHEN s.paused THEN 'paused'
					 WHEN s.breaker OPERATOR(pg_catalog.=) 'open' THEN 'breaker open'
					 WHEN s.cooldown_seconds OPERATOR(pg_catalog.>) 0 THEN 'cooldown'
					 WHEN s.quota IS NOT NULL
						  AND s.quota_remaining OPERATOR(pg_catalog.<) 1 THEN 'quota spent'
					 WHEN s.quota IS NULL AND s.tokens OPERATOR(pg_catalog.<) 1 THEN 'no tokens'
					 WHEN i.in_flight OPERATOR(pg_catalog.>=) i.cap THEN 'cap full'
				END AS held_by,
				CASE WHEN s.paused
						  THEN NULLIF(s.paused_until, 'infinity'::pg_catalog.timestamptz)
					 WHEN s.breaker OPERATOR(pg_catalog.=) 'open'
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs => s.breaker_seconds)
					 WHEN s.cooldown_seconds OPERATOR(pg_catalog.>) 0
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs => s.cooldown_seconds)
					 WHEN s.quota IS NOT NULL
						  AND s.quota_remaining OPERATOR(pg_catalog.<) 1 THEN s.quota_resets_at
					 WHEN s.quota IS NULL AND s.tokens OPERATOR(pg_catalog.<) 1
						  AND s.effective_rate OPERATOR(pg_catalog.>) 0
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs =>
								   (1 OPERATOR(pg_catalog.-) s.tokens) OPERATOR(pg_catalog./) s.effective_rate)
				END AS until) AS h;

COMMENT ON VIEW ratebucket.endpoint_limits IS
'One row per endpoint: what holds a take of it now (paused, breaker open, cooldown, quota spent, no tokens, cap full; NULL: nothing) and until when, then every limit in force: the bucket, its rate against the configured one and its floor, cooldown, breaker, pause, quota, the in-flight cap keyed like the endpoint, stripes.';
COMMENT ON COLUMN ratebucket.endpoint_limits.held_by IS
'What refuses a take now, the first that applies: paused, breaker open, cooldown, quota spent, no tokens, cap full; NULL when a take would be granted.';
COMMENT ON COLUMN ratebucket.endpoint_limits.until IS
'When held_by lets go: the end of the pause (NULL: until bucket_resume), of the open breaker, of the cooldown, the quota''s reset, the next token; NULL for a full cap (a slot frees when a delivery is recorded or its lease ends).';
COMMENT ON COLUMN ratebucket.endpoint_limits.cap IS
'The in-flight cap whose key is the endpoint (inflight_configure), if there is one.';

REVOKE ALL ON ratebucket.endpoint_limits FROM PUBLIC;
