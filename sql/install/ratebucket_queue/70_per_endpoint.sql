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
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- (PL/pgSQL: Citus plans no SQL function with parameters)
    RETURN QUERY
    SELECT e.endpoint,
           count(*) FILTER (WHERE e.status = 'pending'),
           count(*) FILTER (WHERE e.status = 'sending'),
           min(e.next_attempt_at) FILTER (WHERE e.status = 'pending')
    FROM @extschema@.webhook_events e
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
--
-- Long: the whole claim of an endpoint is one call, which Citus runs on the
-- endpoint's node (distribute_queue delegates it on its first argument),
-- and its steps hand their results on in variables: the head's limits and
-- cap choose the events of steps 3 to 6, and the events locked in 5 are
-- those its take counts and 6 leases.  On Citus each step must be a
-- statement or two of its own (see 1.), so the steps cannot be one query.
CREATE FUNCTION claim_endpoint(
    for_endpoint text,
    max_events int DEFAULT 10,
    lease interval DEFAULT '30 seconds',
    cap_wait float8 DEFAULT 0.5,
    unclaimable_wait float8 DEFAULT 5)
RETURNS TABLE (id bigint, endpoint text, attempts int, payload jsonb, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
    FROM (SELECT e.id, e.inflight_key, e.slot FROM @extschema@.webhook_events e
          WHERE e.endpoint = ep AND e.status = 'sending' AND e.lease_until < now()
          ORDER BY e.id
          FOR UPDATE SKIP LOCKED) x;
    IF x_ids IS NOT NULL THEN
        PERFORM ratebucket.inflight_release(s.cap, array_agg(s.slot))
        FROM unnest(x_caps, x_slots) AS s(cap, slot)
        WHERE s.slot IS NOT NULL
        GROUP BY s.cap;
        UPDATE @extschema@.webhook_events e
        SET status = 'pending', lease_until = NULL, next_attempt_at = now(), slot = NULL,
            parked = false
        WHERE e.endpoint = ep AND e.id = ANY (x_ids);
    END IF;

    -- 2. the head
    SELECT e.limits, e.inflight_key INTO head
    FROM @extschema@.webhook_events e
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
        m := @extschema@.claim_cap_free(head.inflight_key);
        n := CASE WHEN m IS NULL OR n IS NULL THEN NULL ELSE least(n, m) END;
    END IF;
    IF n IS NULL
       OR ((cardinality(head.limits) > 0 OR head.inflight_key IS NOT NULL)
           AND EXISTS (SELECT 1 FROM @extschema@.claim_bucket_info(ARRAY[ep] || head.limits) i
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
                                  AND @extschema@.claim_cap_free(head.inflight_key) = 0
                             THEN cap_wait ELSE 0 END,
                        0.001)
        INTO wait
        FROM unnest(ARRAY[ep] || head.limits) AS k(key);
        park := true;
    END IF;
    IF wait IS NOT NULL THEN
        -- the head's first max_events due events
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = now() + make_interval(secs => least(wait, 366 * 86400.0)),
            parked = park
        WHERE e.endpoint = ep
          AND e.id IN (SELECT d.id FROM @extschema@.webhook_events d
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
    FROM (SELECT e.id, e.priority, e.next_attempt_at FROM @extschema@.webhook_events e
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
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = now() + make_interval(secs => least(t.wait_seconds, 366 * 86400.0)),
            parked = true
        WHERE e.endpoint = ep AND e.id = ANY (refused);
    END IF;
    IF t.granted > 0 THEN
        granted := ids[1:t.granted];
        slots := t.slots[1:t.granted];
        RETURN QUERY
        UPDATE @extschema@.webhook_events e
        SET status = 'sending', lease_until = now() + lease, slot = g.slot, parked = false
        FROM unnest(granted, slots) AS g(id, slot)
        WHERE e.endpoint = ep AND e.id = g.id
        RETURNING e.id, e.endpoint, e.attempts, e.payload, e.lease_until;
    END IF;
END $$;

-- record_endpoint: what came back for claimed events of one endpoint, in
-- one call, recorded as record_deliveries records a batch (the same
-- arguments, the endpoint first; see "Recording"), each statement naming
-- the endpoint, so that on Citus it runs on the endpoint's node.  An id
-- that is not an event of this endpoint is 'missing'.  Refused, nothing
-- changed, as record_deliveries refuses them, and a NULL endpoint.  A bare
-- SELECT * FROM record_endpoint(...) runs on the endpoint's node.
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
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ep  text := record_endpoint.for_endpoint;
    ev  record;
    d   record;
    at_ timestamptz;
BEGIN
    IF ep IS NULL THEN
        RAISE EXCEPTION 'for_endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@.record_check(event_ids, http_statuses, claimed_leases, retry_afters,
                                     headers, sent, sent_ats, max_attempts);
    -- the events, in id order, as claims and other batches lock them
    PERFORM FROM @extschema@.webhook_events w
    WHERE w.endpoint = ep AND w.id = ANY (event_ids) ORDER BY w.id FOR UPDATE;
    SELECT array_agg(e.endpoint ORDER BY u.o) AS endpoints, array_agg(e.status ORDER BY u.o) AS statuses,
           array_agg(e.lease_until ORDER BY u.o) AS leases, array_agg(e.attempts ORDER BY u.o) AS attempts,
           array_agg(e.slot ORDER BY u.o) AS slots, array_agg(e.inflight_key ORDER BY u.o) AS caps
    INTO ev
    FROM unnest(event_ids) WITH ORDINALITY AS u(id, o)
    LEFT JOIN (SELECT w.* FROM @extschema@.webhook_events w
               WHERE w.endpoint = ep AND w.id = ANY (event_ids)) e ON e.id = u.id;

    SELECT array_agg(x.id ORDER BY x.o) AS id, array_agg(x.outcome ORDER BY x.o) AS outcome,
           array_agg(x.state ORDER BY x.o) AS state, array_agg(x.tries ORDER BY x.o) AS tries,
           array_agg(x.http ORDER BY x.o) AS http, array_agg(x.wait ORDER BY x.o) AS wait,
           array_agg(x.slot ORDER BY x.o) AS slot, array_agg(x.cap ORDER BY x.o) AS cap
    INTO d
    FROM @extschema@.record_decide(event_ids, http_statuses, claimed_leases, retry_afters,
                                   headers, sent, sent_ats, max_attempts, ev.endpoints,
                                   ev.statuses, ev.leases, ev.attempts, ev.slots, ev.caps) x;

    PERFORM ratebucket.inflight_release(x.cap, array_agg(x.slot))
    FROM unnest(d.state, d.slot, d.cap) AS x(state, slot, cap)
    WHERE x.state IS NOT NULL AND x.slot IS NOT NULL
    GROUP BY x.cap;

    -- the clock once, and the times computed here: Citus runs no clock
    -- nor time arithmetic inside a CASE of a distributed UPDATE
    at_ := clock_timestamp();
    UPDATE @extschema@.webhook_events e
    SET status = x.state, attempts = x.tries, last_status = x.http,
        delivered_at = CASE WHEN x.state = 'delivered' THEN at_ ELSE e.delivered_at END,
        next_attempt_at = CASE WHEN x.state = 'pending' THEN x.next ELSE e.next_attempt_at END,
        lease_until = NULL, slot = NULL,
        parked = x.state = 'pending' AND x.outcome <> 'failure'
    FROM unnest(d.id, d.state, d.tries, d.http,
                ARRAY(SELECT at_ + make_interval(secs => coalesce(w.s, 0))
                      FROM unnest(d.wait) WITH ORDINALITY AS w(s, o) ORDER BY w.o),
                d.outcome) AS x(id, state, tries, http, next, outcome)
    WHERE e.endpoint = ep AND e.id = x.id AND x.state IS NOT NULL;

    RETURN QUERY SELECT x.id, x.outcome FROM unnest(d.id, d.outcome) AS x(id, outcome);
END $$;
