/* ratebucket--1.5--1.6.sql */

-- ratebucket 1.5 -> 1.6: templates, the configuration of endpoints nobody
-- configured, by key pattern; and distribute(), for a Citus cluster.
--
-- The bucket table gets the template an endpoint follows, the status view
-- shows it last; the templates have a table of their own, and three
-- functions.  The library reads a row that lacks the new column as
-- following no template, and a schema without the templates' table as
-- having none, so the old functions keep working until this update runs.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.6'" to load this file. \quit

ALTER TABLE ratebucket.buckets ADD COLUMN template text;

COMMENT ON COLUMN ratebucket.buckets.template IS
'The pattern of the template (bucket_template) that configured the endpoint, which it follows; NULL when configured by bucket_configure, or not configured.';

--
-- Templates
--
CREATE TABLE ratebucket.bucket_templates (
	pattern			text PRIMARY KEY,
	rate			float8 NOT NULL,
	capacity		float8 NOT NULL,
	floor_rate		float8,
	throttle_factor	float8,
	recovery_factor	float8,
	breaker_failures int,
	configured_at	timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.bucket_templates IS
'The configuration of endpoints nobody configured, by key pattern (a prefix and a final *). Written only by bucket_template and bucket_template_drop.';
COMMENT ON COLUMN ratebucket.bucket_templates.pattern IS
'A prefix followed by *: ''acct:*'' matches every key that starts with acct:, ''*'' every key. Of those that match a key, the longest prefix configures it.';
COMMENT ON COLUMN ratebucket.bucket_templates.configured_at IS
'When bucket_template last changed the template.';

CREATE FUNCTION ratebucket.bucket_templates_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'ratebucket_templates_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_templates_changed() IS
'Trigger of bucket_templates: tells every session to read the templates again.';

CREATE TRIGGER bucket_templates_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ratebucket.bucket_templates
	FOR EACH STATEMENT EXECUTE FUNCTION ratebucket.bucket_templates_changed();

SELECT pg_catalog.pg_extension_config_dump('ratebucket.bucket_templates', '');

CREATE FUNCTION ratebucket.bucket_template(
	pattern text,
	rate float8,
	capacity float8,
	floor_rate float8 DEFAULT NULL,
	throttle_factor float8 DEFAULT NULL,
	recovery_factor float8 DEFAULT NULL,
	breaker_failures int DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'ratebucket_template'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_template(text, float8, float8, float8, float8, float8, int) IS
'Create or replace the template of a pattern (a prefix and a final *, such as acct:* or *), with bucket_configure''s arguments: endpoints nobody configured that it matches are configured from it at their first use. Endpoints that follow it, and those it matches that follow a less specific template, are configured from it now; returns how many.';

CREATE FUNCTION ratebucket.bucket_template_drop(pattern text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_template_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_template_drop(text) IS
'Drop a template: the endpoints that followed it follow the next template that matches them, or keep their configuration as their own. False if there was no such template.';

CREATE FUNCTION ratebucket.bucket_template_for(endpoint text)
RETURNS text
AS 'MODULE_PATHNAME', 'ratebucket_template_for'
LANGUAGE C STABLE PARALLEL RESTRICTED;

COMMENT ON FUNCTION ratebucket.bucket_template_for(text) IS
'The pattern of the template that configures the endpoint when it has no configuration of its own; NULL if none matches.';

--
-- Scale-out (Citus)
--
-- distribute: on a Citus coordinator, distribute ratebucket's tables by
-- endpoint (the stripes and the in-flight caps co-located with the
-- buckets, the templates a reference table on every node) and register
-- every function that works on one endpoint as a distributed function on
-- its first argument, so that a bare SELECT of it runs on the node that
-- holds the endpoint.  Idempotent: what is already distributed is left as
-- it is.  See doc/citus.md.
--
CREATE FUNCTION ratebucket.distribute(shard_count int DEFAULT NULL)
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t record;
	f regprocedure;
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

COMMENT ON FUNCTION ratebucket.distribute(int) IS
'On a Citus coordinator: distribute the buckets by endpoint (shard_count: Citus''s default when NULL), co-locate the stripes and the in-flight caps with them, make the templates a reference table, and register every per-endpoint function to run on the node that holds its endpoint. Idempotent; one row per table and function, saying what was done.';

-- The status view, with the template last.
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
	   b.template
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

COMMENT ON COLUMN ratebucket.bucket_status.template IS
'The template the endpoint was configured by and follows (bucket_template); NULL if configured by bucket_configure or not at all.';

-- Like every object an update adds, granted to no one (the view keeps the
-- grants it had).
REVOKE ALL ON TABLE ratebucket.bucket_templates FROM PUBLIC;
REVOKE ALL ON FUNCTION
	ratebucket.bucket_templates_changed(),
	ratebucket.bucket_template(text, float8, float8, float8, float8, float8, int),
	ratebucket.bucket_template_drop(text),
	ratebucket.bucket_template_for(text),
	ratebucket.distribute(int)
	FROM PUBLIC;
