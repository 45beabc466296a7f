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

COMMENT ON TABLE webhook_events IS
'The delivery queue: one row per event to send to its endpoint (a ratebucket bucket key), with its priority, state (pending, sending, delivered, failed), next attempt time, attempts made, other buckets it takes tokens from (limits) and in-flight cap.';
COMMENT ON TABLE webhook_parking IS
'Per throttled endpoint, where its parked events end and at what pace (claim_events parks the next ones after them).';
COMMENT ON FUNCTION claim_events(int, int, interval, float8, int, float8, float8) IS
'Claim up to batch due events, at most per_endpoint of each endpoint, only those whose endpoint and limits have tokens (and cap a slot): tokens and slots are spent only on the events returned, each leased until lease_until. Events of endpoints without tokens are parked until their tokens come. READ COMMITTED; call it alone in its transaction.';
COMMENT ON FUNCTION record_delivery(bigint, int, text, jsonb, boolean, int, timestamptz, timestamptz) IS
'Record the outcome of one claimed event (lock the batch''s events in id order first): the answer goes to ratebucket.bucket_observe; the event is delivered on 2xx, pending again after the cooldown or a backoff on 429, 503 with Retry-After or a failure, failed on another status or after max_attempts; its slot is freed. Returns the outcome, stale if the event is no longer this claim''s (pass claimed_lease), missing if it was deleted.';
COMMENT ON FUNCTION next_due() IS
'Seconds until a claim could find something (an event falls due, a bucket refills); NULL when nothing is pending.';
COMMENT ON FUNCTION requeue_expired() IS
'Put events whose lease ran out (their worker died) back in the queue, their attempt not counted, and free their slots; forget parking cursors an hour past. Returns the events requeued.';
COMMENT ON FUNCTION events_left(timestamptz) IS
'Events in flight, or pending and due before "before" (NULL: whenever).';
COMMENT ON FUNCTION explain_event(bigint) IS
'Why an event is not being sent: one row per thing that holds it (not configured, paused, breaker open, cooldown, quota spent, no tokens, cap full, not due, leased), with the key it concerns and when it lets go; one row due when nothing does.';
COMMENT ON FUNCTION record_deliveries(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'Record the outcomes of a whole batch in one call, each as record_delivery does, its locks taken in order by itself (the events in id order, then their buckets in endpoint order); returns each event''s outcome, in the order given.';
COMMENT ON FUNCTION explain_endpoint(text) IS
'Why an endpoint''s events are not being sent: what holds its best pending event (its bucket, that event''s limits and cap), then leased, not due, due or no events, with counts and times.';
COMMENT ON FUNCTION unpark(text) IS
'Bring back an endpoint''s events parked ahead at the pace its buckets allow now (claims do it by themselves within about a second). Returns how many moved.';
COMMENT ON VIEW event_waits IS
'explain_event for every event pending or in flight: filter it by endpoint or event_id.';
COMMENT ON FUNCTION due_endpoints(int) IS
'The endpoints with work now (events pending and due, or in flight past their lease), the most urgent first: for a worker that claims endpoint by endpoint (claim_endpoint).';
COMMENT ON FUNCTION claim_endpoint(text, int, interval, float8, float8) IS
'Claim up to max_events due events of one endpoint that its buckets (and cap) grant now, as claim_events claims each endpoint: tokens and slots spent only on the events returned, the refused put off until their token; its expired leases given back first. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION record_endpoint(text, bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'Record the outcomes of claimed events of one endpoint in one call, each as record_deliveries decides it; an id that is not an event of the endpoint is missing. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION distribute_queue() IS
'On a Citus coordinator, after ratebucket.distribute(): distribute the queue by endpoint, co-located with the buckets (the events'' primary key becomes (endpoint, id)), and make claim_endpoint, record_endpoint and explain_endpoint run on the endpoint''s node. Idempotent.';
COMMENT ON VIEW endpoint_status IS
'One row per endpoint with events pending or in flight: pending, due, parked, in_flight, next_due_at, and what configures its bucket (own, template, or none: its events wait until something does) and the template.';
