-- distribute_queue: on a Citus coordinator where ratebucket.distribute()
-- has run, distribute the queue by endpoint, co-located with the buckets
-- (each endpoint's events on the node of its bucket), and make the
-- per-endpoint functions (claim_endpoint, record_endpoint,
-- explain_endpoint) run on the endpoint's node.  The events' primary key
-- becomes (endpoint, id), on every node: Citus needs the distribution
-- column in it.  Idempotent.  See doc/citus.md.
CREATE FUNCTION distribute_queue()
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rel regclass;
    f regprocedure;
    rekey text;
    failed text;
BEGIN
    IF to_regproc('pg_catalog.create_distributed_table') IS NULL THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Run CREATE EXTENSION citus, then ratebucket.distribute() and distribute_queue() on the coordinator.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
                   WHERE p.logicalrelid = 'ratebucket.buckets'::regclass) THEN
        RAISE EXCEPTION 'the buckets are not distributed'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run SELECT * FROM ratebucket.distribute() first.';
    END IF;
    -- the primary key, made (endpoint, id) where it is (id), on this node
    -- and on every worker (where the extension's own table is the shell)
    rekey := format($r$DO $do$ BEGIN
        IF (SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.o)
            FROM pg_catalog.pg_index i
            CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, o)
            JOIN pg_catalog.pg_attribute a
              ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
             AND a.attnum OPERATOR(pg_catalog.=) k.attnum
            WHERE i.indrelid OPERATOR(pg_catalog.=) %1$L::pg_catalog.regclass AND i.indisprimary)
           OPERATOR(pg_catalog.=) ARRAY['id']::pg_catalog.text[] THEN
            ALTER TABLE %1$s DROP CONSTRAINT webhook_events_pkey,
                ADD CONSTRAINT webhook_events_pkey PRIMARY KEY (endpoint, id);
        END IF;
    END $do$ $r$, '@extschema@.webhook_events');
    FOREACH rel IN ARRAY ARRAY['@extschema@.webhook_events'::regclass,
                               '@extschema@.webhook_parking'::regclass] LOOP
        object := rel::text;
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = rel) THEN
            action := 'already distributed';
        ELSE
            IF rel = '@extschema@.webhook_events'::regclass THEN
                EXECUTE rekey;
                SELECT string_agg(w.nodename || ':' || w.nodeport || ': ' || w.result, '; ')
                INTO failed
                FROM pg_catalog.run_command_on_workers(rekey) AS w WHERE NOT w.success;
                IF failed IS NOT NULL THEN
                    RAISE EXCEPTION 'could not change the primary key of % on every worker', rel
                        USING ERRCODE = 'connection_exception', DETAIL = failed;
                END IF;
                -- its statement trigger (NOTIFY webhook_events) would fire
                -- on the nodes that hold the shards, where nobody listens,
                -- and a NOTIFY cannot be part of a two-phase commit (an
                -- INSERT of events of several nodes): dropped.  Workers
                -- poll due_endpoints instead.
                DROP TRIGGER IF EXISTS webhook_events_notify ON @extschema@.webhook_events;
            END IF;
            PERFORM pg_catalog.create_distributed_table(rel, 'endpoint', colocate_with => 'ratebucket.buckets');
            action := 'distributed by endpoint, co-located with ratebucket.buckets';
        END IF;
        RETURN NEXT;
    END LOOP;
    FOREACH f IN ARRAY ARRAY['@extschema@.claim_endpoint(text,int,interval,float8,float8)'::regprocedure,
                             '@extschema@.record_endpoint(text,bigint[],int[],timestamptz[],text[],jsonb[],boolean[],timestamptz[],int)'::regprocedure,
                             '@extschema@.explain_endpoint(text)'::regprocedure] LOOP
        object := f::text;
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object d
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = f::oid
                     AND d.distribution_argument_index IS NOT NULL) THEN
            action := 'already delegated';
        ELSE
            PERFORM pg_catalog.create_distributed_function(f, '$1', colocate_with => 'ratebucket.buckets');
            action := 'delegated on its first argument';
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
