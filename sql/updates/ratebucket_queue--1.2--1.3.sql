-- ratebucket_queue 1.2 -> 1.3: the queue endpoint by endpoint, and on a
-- Citus cluster.  due_endpoints lists the endpoints with work, claim_endpoint
-- claims one endpoint's events and record_endpoint records them, each in
-- statements on that endpoint's rows only; distribute_queue distributes the
-- queue by endpoint beside ratebucket's buckets, where those three run on
-- the endpoint's node.  events_left is the same count in PL/pgSQL, and
-- explain_keys writes a rate below 0.001/s as it is, not as 0.000.

\echo Use "ALTER EXTENSION ratebucket_queue UPDATE TO '1.3'" to load this file. \quit

-- events_left in PL/pgSQL, the same count: Citus plans no SQL function with
-- parameters, and a worker of a distributed queue calls it.  (Replaced in
-- place: its grants and comment stay.)
CREATE OR REPLACE FUNCTION events_left(before timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
BEGIN
    -- (PL/pgSQL: Citus plans no SQL function with parameters)
    RETURN (SELECT count(*) FROM webhook_events
            WHERE status = 'sending'
               OR (status = 'pending' AND (before IS NULL OR next_attempt_at < before)));
END $$;

-- explain_keys: what holds a send that takes from these buckets (in this
-- order, each once) and holds a slot of this in-flight cap (NULL: none),
-- one row per hold, each with when it lets go (NULL: not known, or never
-- by itself) and what to do: for each bucket 'not configured' (the claim
-- leaves its events alone), 'paused', 'breaker open', 'cooldown', 'quota
-- spent', 'no tokens'; then 'not configured' or 'cap full' for the cap.
-- A key without a configuration that a template matches holds nothing: the
-- first claim that reaches it configures it from the template, full.
-- The figures are ratebucket's at now_ (bucket_status, inflight_status,
-- and buckets for the end of a pause).
CREATE OR REPLACE FUNCTION explain_keys(keys text[], cap_key text, now_ timestamptz)
RETURNS TABLE (reason text, key text, until timestamptz, detail text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
    b record;
    c record;
    k text;
BEGIN
    FOR k IN SELECT t.u FROM unnest(keys) WITH ORDINALITY t(u, o)
             GROUP BY t.u ORDER BY min(t.o) LOOP
        SELECT s.configured, s.paused, s.breaker, s.breaker_seconds, s.cooldown_seconds,
               s.tokens, s.effective_rate, s.quota, s.quota_remaining, s.quota_resets_at,
               p.paused_until
        INTO b
        FROM ratebucket.bucket_status s
        LEFT JOIN ratebucket.buckets p ON p.endpoint = s.endpoint
        WHERE s.endpoint = k;
        IF NOT FOUND OR NOT b.configured THEN
            -- a template that matches it configures it, full, at the first
            -- claim that reaches it: nothing holds it
            IF ratebucket.bucket_template_for(k) IS NULL THEN
                RETURN QUERY SELECT 'not configured'::text, k, NULL::timestamptz,
                    'no limits stored for it, and no template matches it: the claim leaves '
                    'its events alone until ratebucket.bucket_configure or '
                    'ratebucket.bucket_template sets them'::text;
            END IF;
        ELSIF b.paused THEN
            RETURN QUERY SELECT 'paused'::text, k,
                CASE WHEN b.paused_until < 'infinity' THEN b.paused_until END,
                'paused by ratebucket.bucket_pause: ratebucket.bucket_resume ends it'::text;
        ELSIF b.breaker = 'open' THEN
            RETURN QUERY SELECT 'breaker open'::text, k,
                now_ + make_interval(secs => b.breaker_seconds),
                'its circuit breaker opened on failures; half-open then: one probe goes'::text;
        ELSIF b.cooldown_seconds > 0 THEN
            RETURN QUERY SELECT 'cooldown'::text, k,
                now_ + make_interval(secs => b.cooldown_seconds),
                'the destination asked for a pause (a 429 or a 503 with Retry-After)'::text;
        ELSIF b.quota IS NOT NULL AND b.quota_remaining < 1 THEN
            RETURN QUERY SELECT 'quota spent'::text, k, b.quota_resets_at,
                format('its quota of %s is used up until it resets', b.quota);
        ELSIF b.quota IS NULL AND b.tokens < 1 THEN
            RETURN QUERY SELECT 'no tokens'::text, k,
                CASE WHEN b.effective_rate > 0
                     THEN now_ + make_interval(secs => (1 - b.tokens) / b.effective_rate) END,
                -- the rate to 6 decimals, without trailing zeros: 0.0001/s, 20/s
                format('%s tokens now, refilling at %s/s', round(b.tokens::numeric, 3),
                       trim_scale(round(b.effective_rate::numeric, 6)));
        END IF;
    END LOOP;

    IF cap_key IS NOT NULL THEN
        SELECT i.cap, i.in_flight, i.oldest, i.lease INTO c
        FROM ratebucket.inflight_status i WHERE i.key = cap_key;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'not configured'::text, cap_key, NULL::timestamptz,
                'no in-flight cap stored for it: the claim leaves its events alone until '
                'ratebucket.inflight_configure sets it'::text;
        ELSIF c.in_flight >= c.cap THEN
            RETURN QUERY SELECT 'cap full'::text, cap_key, c.oldest + c.lease,
                format('%s of %s slots in flight: one frees when its outcome is recorded, '
                       'or at the latest when the oldest lease ends', c.in_flight, c.cap);
        END IF;
    END IF;
END $$;

--
-- Per endpoint: the claim, its recording and the endpoints to claim, for a
-- queue on a Citus cluster (distribute_queue), where each endpoint's events
-- and buckets live on one node and a call on one endpoint runs there; they
-- work on one node too.  claim_events and record_deliveries look across
-- endpoints in one statement, which a distributed queue cannot run.
--

-- due_endpoints: the endpoints with work now: events pending and due, or
-- in flight with their lease run out (claim_endpoint gives those back).
-- The most urgent first: the highest priority due, then the longest due.
-- No bucket is read: an endpoint without tokens is listed, and its claim
-- puts its events off until its next token.
CREATE FUNCTION due_endpoints(max_endpoints int DEFAULT 100)
RETURNS TABLE (endpoint text, due bigint, expired bigint, oldest timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- (PL/pgSQL: Citus plans no SQL function with parameters)
    RETURN QUERY
    SELECT e.endpoint,
           count(*) FILTER (WHERE e.status = 'pending'),
           count(*) FILTER (WHERE e.status = 'sending'),
           min(e.next_attempt_at) FILTER (WHERE e.status = 'pending')
    FROM webhook_events e
    WHERE (e.status = 'pending' AND e.next_attempt_at <= now())
       OR (e.status = 'sending' AND e.lease_until < now())
    GROUP BY e.endpoint
    ORDER BY max(e.priority) FILTER (WHERE e.status = 'pending') DESC NULLS LAST,
             min(e.next_attempt_at) FILTER (WHERE e.status = 'pending') NULLS FIRST,
             e.endpoint
    LIMIT greatest(max_endpoints, 0);
END $$;

-- claim_endpoint: claim up to max_events due events of one endpoint, as
-- claim_events claims those of each endpoint it meets:
--   1. its events whose lease ran out go back to the queue (their slots
--      freed, the attempt not counted), as requeue_expired does;
--   2. the head: the first due event in queue order, and its limits and
--      cap; the events claimed are those due with the same limits and cap;
--   3. nothing if the endpoint, a limit or the cap has no configuration
--      (nor a template), or a striped endpoint comes with limits or a cap:
--      the first max_events due events of the head are set aside for
--      unclaimable_wait, as claim_events sets them aside;
--   4. how many its buckets and cap could grant now, without a lock
--      (bucket_grantable, the cap's free slots); none:
--      the first max_events due events of the head are put off until the
--      buckets have a token (or cap_wait, for a full cap), parked;
--   5. up to that many events locked, FOR UPDATE SKIP LOCKED (another
--      worker's are passed over), then one bucket_take_batch for them
--      (the endpoint, its limits, a slot of the cap each);
--   6. those granted are leased to the caller and returned; those refused
--      are put off by the wait the take said, parked.
-- Tokens and slots are spent only on events returned here; a rollback
-- gives them back.  One endpoint per call: on Citus, a bare
-- SELECT * FROM claim_endpoint(...) runs on the endpoint's node.
CREATE FUNCTION claim_endpoint(
    for_endpoint text,
    max_events int DEFAULT 10,
    lease interval DEFAULT '30 seconds',
    cap_wait float8 DEFAULT 0.5,
    unclaimable_wait float8 DEFAULT 5)
RETURNS TABLE (id bigint, endpoint text, attempts int, payload jsonb, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ep      text := claim_endpoint.for_endpoint;
    x_ids   bigint[];
    x_caps  text[];
    x_slots bigint[];
    head    record;
    n       int;
    m       int;
    wait    float8;
    park    boolean;
    ids     bigint[];
    t       record;
    refused bigint[];
    granted bigint[];
    slots   bigint[];
BEGIN
    IF ep IS NULL THEN
        RAISE EXCEPTION 'for_endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_events IS NULL OR max_events < 1 THEN
        RAISE EXCEPTION 'max_events must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cap_wait IS NULL OR NOT (cap_wait >= 0 AND cap_wait <= 366 * 86400.0)
       OR unclaimable_wait IS NULL
       OR NOT (unclaimable_wait >= 0 AND unclaimable_wait <= 366 * 86400.0) THEN
        RAISE EXCEPTION 'cap_wait and unclaimable_wait must be between 0 and a year of seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. expired leases (each statement on this endpoint's events only, and
    -- ratebucket's functions in statements of their own: on Citus a
    -- statement on the queue runs on its shard, where no call may reach
    -- another table through Citus)
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.inflight_key ORDER BY x.id),
           array_agg(x.slot ORDER BY x.id)
    INTO x_ids, x_caps, x_slots
    FROM (SELECT e.id, e.inflight_key, e.slot FROM webhook_events e
          WHERE e.endpoint = ep AND e.status = 'sending' AND e.lease_until < now()
          ORDER BY e.id
          FOR UPDATE SKIP LOCKED) x;
    IF x_ids IS NOT NULL THEN
        PERFORM ratebucket.inflight_release(s.cap, array_agg(s.slot))
        FROM unnest(x_caps, x_slots) AS s(cap, slot)
        WHERE s.slot IS NOT NULL
        GROUP BY s.cap;
        UPDATE webhook_events e
        SET status = 'pending', lease_until = NULL, next_attempt_at = now(), slot = NULL,
            parked = false
        WHERE e.endpoint = ep AND e.id = ANY (x_ids);
    END IF;

    -- 2. the head
    SELECT e.limits, e.inflight_key INTO head
    FROM webhook_events e
    WHERE e.endpoint = ep AND e.status = 'pending' AND e.next_attempt_at <= now()
    ORDER BY e.priority DESC, e.next_attempt_at
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- 3. and 4. what could be granted
    -- (bucket_grantable, not bucket_claimable: that one answers once per
    -- endpoint per statement, or per transaction in PL/pgSQL)
    -- (a NULL, no configuration, sticks: least() would pass over it)
    n := ratebucket.bucket_grantable(ep, max_events);
    FOR m IN SELECT ratebucket.bucket_grantable(k.key, max_events)
             FROM unnest(head.limits) AS k(key) LOOP
        n := CASE WHEN m IS NULL OR n IS NULL THEN NULL ELSE least(n, m) END;
    END LOOP;
    IF head.inflight_key IS NOT NULL THEN
        m := claim_cap_free(head.inflight_key);
        n := CASE WHEN m IS NULL OR n IS NULL THEN NULL ELSE least(n, m) END;
    END IF;
    IF n IS NULL
       OR ((cardinality(head.limits) > 0 OR head.inflight_key IS NOT NULL)
           AND EXISTS (SELECT 1 FROM claim_bucket_info(ARRAY[ep] || head.limits) i
                       WHERE i.striped)) THEN
        -- left alone, as claim_events leaves them: set aside for
        -- unclaimable_wait, so that due_endpoints lists what can go
        wait := unclaimable_wait;
        park := false;
    ELSIF n <= 0 THEN
        -- nothing to grant: put off until the buckets have a token (a full
        -- cap: cap_wait), parked; at least a millisecond: left due, the
        -- head would keep the endpoint's other events behind it, each
        -- claim finding it again
        SELECT greatest(max(ratebucket.bucket_wait(k.key)),
                        CASE WHEN head.inflight_key IS NOT NULL
                                  AND claim_cap_free(head.inflight_key) = 0
                             THEN cap_wait ELSE 0 END,
                        0.001)
        INTO wait
        FROM unnest(ARRAY[ep] || head.limits) AS k(key);
        park := true;
    END IF;
    IF wait IS NOT NULL THEN
        -- the head's first max_events due events
        UPDATE webhook_events e
        SET next_attempt_at = now() + make_interval(secs => least(wait, 366 * 86400.0)),
            parked = park
        WHERE e.endpoint = ep
          AND e.id IN (SELECT d.id FROM webhook_events d
                       WHERE d.endpoint = ep
                         AND d.limits = head.limits
                         AND d.inflight_key IS NOT DISTINCT FROM head.inflight_key
                         AND d.status = 'pending' AND d.next_attempt_at <= now()
                       ORDER BY d.priority DESC, d.next_attempt_at
                       LIMIT max_events
                       FOR UPDATE SKIP LOCKED);
        RETURN;
    END IF;

    -- 5. lock, then take
    SELECT array_agg(l.id ORDER BY l.priority DESC, l.next_attempt_at, l.id) INTO ids
    FROM (SELECT e.id, e.priority, e.next_attempt_at FROM webhook_events e
          WHERE e.endpoint = ep
            AND e.limits = head.limits
            AND e.inflight_key IS NOT DISTINCT FROM head.inflight_key
            AND e.status = 'pending' AND e.next_attempt_at <= now()
          ORDER BY e.priority DESC, e.next_attempt_at
          LIMIT n
          FOR UPDATE SKIP LOCKED) l;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    SELECT b.granted, b.wait_seconds, b.slots INTO t
    FROM ratebucket.bucket_take_batch(ARRAY[
             ROW(ARRAY(SELECT DISTINCT k FROM unnest(ARRAY[ep] || head.limits) AS k),
                 cardinality(ids), head.inflight_key)::ratebucket.batch_request]) AS b;

    -- 6. the refused put off, the granted leased (the arrays cut here:
    -- Citus cannot send a subscript in a statement to the shard)
    refused := ids[t.granted + 1:];
    IF cardinality(refused) > 0 THEN
        UPDATE webhook_events e
        SET next_attempt_at = now() + make_interval(secs => least(t.wait_seconds, 366 * 86400.0)),
            parked = true
        WHERE e.endpoint = ep AND e.id = ANY (refused);
    END IF;
    IF t.granted > 0 THEN
        granted := ids[1:t.granted];
        slots := t.slots[1:t.granted];
        RETURN QUERY
        UPDATE webhook_events e
        SET status = 'sending', lease_until = now() + lease, slot = g.slot, parked = false
        FROM unnest(granted, slots) AS g(id, slot)
        WHERE e.endpoint = ep AND e.id = g.id
        RETURNING e.id, e.endpoint, e.attempts, e.payload, e.lease_until;
    END IF;
END $$;

-- record_endpoint: what came back for claimed events of one endpoint, in
-- one call, each event decided as record_deliveries decides it (the same
-- arguments, the endpoint first).  It locks the events in id order, then
-- observes each answer on the endpoint's bucket in id order, writes the
-- events in one statement and frees their slots.  An id that is not an
-- event of this endpoint is 'missing'.  One endpoint per call: on Citus, a
-- bare SELECT * FROM record_endpoint(...) runs on the endpoint's node.
CREATE FUNCTION record_endpoint(
    for_endpoint text,
    event_ids bigint[],
    http_statuses int[],
    claimed_leases timestamptz[],
    retry_afters text[] DEFAULT NULL,
    headers jsonb[] DEFAULT NULL,
    sent boolean[] DEFAULT NULL,
    sent_ats timestamptz[] DEFAULT NULL,
    max_attempts int DEFAULT 25)
RETURNS TABLE (event_id bigint, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ep     text := record_endpoint.for_endpoint;
    n      int := coalesce(cardinality(event_ids), 0);
    found_ bigint[];
    r      record;
    fb     record;
    tries  int;
    wait   float8;
    d_ord  bigint[] := '{}';
    d_id   bigint[] := '{}';
    d_out  text[] := '{}';
    d_state text[] := '{}';
    d_try  int[] := '{}';
    d_http int[] := '{}';
    d_wait float8[] := '{}';
    d_slot bigint[] := '{}';
    d_cap  text[] := '{}';
    t      record;
    at_    timestamptz;
    d_next timestamptz[];
BEGIN
    IF ep IS NULL THEN
        RAISE EXCEPTION 'for_endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF event_ids IS NULL OR array_position(event_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'event_ids must not be NULL nor hold a NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF coalesce(cardinality(http_statuses), -1) <> n
       OR coalesce(cardinality(claimed_leases), -1) <> n
       OR coalesce(cardinality(retry_afters), n) <> n
       OR coalesce(cardinality(headers), n) <> n
       OR coalesce(cardinality(sent), n) <> n
       OR coalesce(cardinality(sent_ats), n) <> n THEN
        RAISE EXCEPTION 'the arrays of a batch must be as long as event_ids (%)', n
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'http_statuses and claimed_leases are required; the others may be NULL.';
    END IF;
    IF (SELECT count(DISTINCT x) FROM unnest(event_ids) x) <> n THEN
        RAISE EXCEPTION 'event_ids must not repeat an event' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts IS NULL OR max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- the events, in id order, as claims and other batches lock them
    SELECT array_agg(w.id) INTO found_
    FROM (SELECT e.id FROM webhook_events e
          WHERE e.endpoint = ep AND e.id = ANY (event_ids)
          ORDER BY e.id FOR UPDATE) w;

    FOR r IN
        SELECT u.o, u.id, u.status, u.lease, u.ra, u.hd, coalesce(u.snt, true) AS snt, u.sa,
               u.id = ANY (coalesce(found_, '{}')) AS here
        FROM unnest(event_ids, http_statuses, claimed_leases,
                    coalesce(retry_afters, array_fill(NULL::text, ARRAY[n])),
                    coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])),
                    coalesce(sent, array_fill(NULL::boolean, ARRAY[n])),
                    coalesce(sent_ats, array_fill(NULL::timestamptz, ARRAY[n])))
             WITH ORDINALITY AS u(id, status, lease, ra, hd, snt, sa, o)
        ORDER BY u.id
    LOOP
        d_ord := d_ord || r.o;
        d_id := d_id || r.id;
        IF NOT r.here THEN
            d_out := d_out || 'missing'::text;
            d_state := d_state || NULL::text;
            d_slot := d_slot || NULL::bigint;
            d_cap := d_cap || NULL::text;
        ELSE
            SELECT * INTO fb FROM ratebucket.bucket_observe(ep, r.status, r.ra, r.hd, r.sa);
            SELECT e.status AS was, e.lease_until, e.attempts, e.slot, e.inflight_key INTO STRICT t
            FROM webhook_events e WHERE e.endpoint = ep AND e.id = r.id;
            IF t.was <> 'sending' OR t.lease_until IS DISTINCT FROM coalesce(r.lease, t.lease_until) THEN
                d_out := d_out || 'stale'::text;
                d_state := d_state || NULL::text;
            ELSE
                tries := t.attempts + CASE WHEN r.snt THEN 1 ELSE 0 END;
                wait := greatest(coalesce(fb.cooldown_seconds, 0),
                                 CASE WHEN fb.outcome = 'failure'
                                      THEN retry_backoff(tries) ELSE 0 END);
                d_out := d_out || fb.outcome::text;
                d_state := d_state || CASE WHEN fb.outcome = 'success' THEN 'delivered'
                                           WHEN fb.outcome = 'neutral' OR tries >= max_attempts
                                           THEN 'failed'
                                           ELSE 'pending' END;
            END IF;
            d_slot := d_slot || t.slot;
            d_cap := d_cap || t.inflight_key;
        END IF;
        d_try := d_try || tries;
        d_http := d_http || r.status;
        d_wait := d_wait || wait;
        tries := NULL;
        wait := NULL;
    END LOOP;

    PERFORM ratebucket.inflight_release(x.cap, array_agg(x.slot))
    FROM unnest(d_state, d_slot, d_cap) AS x(state, slot, cap)
    WHERE x.state IS NOT NULL AND x.slot IS NOT NULL
    GROUP BY x.cap;

    -- the clock once, and the times computed here: Citus runs no clock
    -- nor time arithmetic inside a CASE of a distributed UPDATE
    at_ := clock_timestamp();
    d_next := ARRAY(SELECT at_ + make_interval(secs => coalesce(w.s, 0))
                    FROM unnest(d_wait) WITH ORDINALITY AS w(s, o) ORDER BY w.o);
    UPDATE webhook_events e
    SET status = d.state, attempts = d.tries, last_status = d.http,
        delivered_at = CASE WHEN d.state = 'delivered' THEN at_ ELSE e.delivered_at END,
        next_attempt_at = CASE WHEN d.state = 'pending' THEN d.next ELSE e.next_attempt_at END,
        lease_until = NULL, slot = NULL,
        parked = d.state = 'pending' AND d.outcome <> 'failure'
    FROM unnest(d_id, d_state, d_try, d_http, d_next, d_out) AS d(id, state, tries, http, next, outcome)
    WHERE e.endpoint = ep AND e.id = d.id AND d.state IS NOT NULL;

    RETURN QUERY
    SELECT d.id, d.outcome
    FROM unnest(d_ord, d_id, d_out) AS d(o, id, outcome)
    ORDER BY d.o;
END $$;

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
SET search_path = pg_catalog, @extschema@, pg_temp
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
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'ratebucket.buckets'::regclass) THEN
        RAISE EXCEPTION 'the buckets are not distributed'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run SELECT * FROM ratebucket.distribute() first.';
    END IF;
    -- the primary key, made (endpoint, id) where it is (id), on this node
    -- and on every worker (where the extension's own table is the shell)
    rekey := format($r$DO $do$ BEGIN
        IF (SELECT array_agg(a.attname::text ORDER BY k.o)
            FROM pg_index i
            CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, o)
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = %1$L::regclass AND i.indisprimary) = ARRAY['id'] THEN
            ALTER TABLE %1$s DROP CONSTRAINT webhook_events_pkey,
                ADD CONSTRAINT webhook_events_pkey PRIMARY KEY (endpoint, id);
        END IF;
    END $do$ $r$, '@extschema@.webhook_events');
    FOREACH rel IN ARRAY ARRAY['webhook_events'::regclass, 'webhook_parking'::regclass] LOOP
        object := '@extschema@.' || rel::text;
        IF EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = rel) THEN
            action := 'already distributed';
        ELSE
            IF rel = 'webhook_events'::regclass THEN
                EXECUTE rekey;
                SELECT string_agg(w.nodename || ':' || w.nodeport || ': ' || w.result, '; ')
                INTO failed
                FROM run_command_on_workers(rekey) AS w WHERE NOT w.success;
                IF failed IS NOT NULL THEN
                    RAISE EXCEPTION 'could not change the primary key of % on every worker', rel
                        USING ERRCODE = 'connection_exception', DETAIL = failed;
                END IF;
                -- its statement trigger (NOTIFY webhook_events) would fire
                -- on the nodes that hold the shards, where nobody listens,
                -- and a NOTIFY cannot be part of a two-phase commit (an
                -- INSERT of events of several nodes): dropped.  Workers
                -- poll due_endpoints instead.
                DROP TRIGGER IF EXISTS webhook_events_notify ON webhook_events;
            END IF;
            PERFORM create_distributed_table(rel, 'endpoint', colocate_with => 'ratebucket.buckets');
            action := 'distributed by endpoint, co-located with ratebucket.buckets';
        END IF;
        RETURN NEXT;
    END LOOP;
    FOREACH f IN ARRAY ARRAY['claim_endpoint(text,int,interval,float8,float8)'::regprocedure,
                             'record_endpoint(text,bigint[],int[],timestamptz[],text[],jsonb[],boolean[],timestamptz[],int)'::regprocedure,
                             'explain_endpoint(text)'::regprocedure] LOOP
        object := '@extschema@.' || f::text;
        IF EXISTS (SELECT 1 FROM pg_dist_object d
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = f::oid
                     AND d.distribution_argument_index IS NOT NULL) THEN
            action := 'already delegated';
        ELSE
            PERFORM create_distributed_function(f, '$1', colocate_with => 'ratebucket.buckets');
            action := 'delegated on its first argument';
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

COMMENT ON FUNCTION due_endpoints(int) IS
'The endpoints with work now (events pending and due, or in flight past their lease), the most urgent first: for a worker that claims endpoint by endpoint (claim_endpoint).';
COMMENT ON FUNCTION claim_endpoint(text, int, interval, float8, float8) IS
'Claim up to max_events due events of one endpoint that its buckets (and cap) grant now, as claim_events claims each endpoint: tokens and slots spent only on the events returned, the refused put off until their token; its expired leases given back first. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION record_endpoint(text, bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'Record the outcomes of claimed events of one endpoint in one call, each as record_deliveries decides it; an id that is not an event of the endpoint is missing. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION distribute_queue() IS
'On a Citus coordinator, after ratebucket.distribute(): distribute the queue by endpoint, co-located with the buckets (the events'' primary key becomes (endpoint, id)), and make claim_endpoint, record_endpoint and explain_endpoint run on the endpoint''s node. Idempotent.';
