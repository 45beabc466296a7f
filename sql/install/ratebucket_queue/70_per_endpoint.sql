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
-- one call, each event decided as record_deliveries decides it (the same
-- arguments, the endpoint first).  It locks the events in id order, then
-- observes each answer on the endpoint's bucket in id order, writes the
-- events in one statement and frees their slots.  An id that is not an
-- event of this endpoint is 'missing'.  Refused, nothing changed, as
-- record_deliveries refuses them: a NULL endpoint, a NULL lease.  One
-- endpoint per call: on Citus, a bare SELECT * FROM record_endpoint(...)
-- runs on the endpoint's node.
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
    -- a NULL lease would match whatever lease the event holds: an outcome
    -- recorded late, after the event was requeued and claimed again, would
    -- be taken for the new claim's and free its slot
    IF array_position(claimed_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'claimed_leases must not hold a NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = format('The lease of event %s is NULL.',
                                  event_ids[array_position(claimed_leases, NULL)]),
                  HINT = 'Pass each event''s lease_until as the claim returned it.';
    END IF;

    -- the events, in id order, as claims and other batches lock them
    SELECT array_agg(w.id) INTO found_
    FROM (SELECT e.id FROM @extschema@.webhook_events e
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
            FROM @extschema@.webhook_events e WHERE e.endpoint = ep AND e.id = r.id;
            IF t.was <> 'sending' OR t.lease_until IS DISTINCT FROM coalesce(r.lease, t.lease_until) THEN
                d_out := d_out || 'stale'::text;
                d_state := d_state || NULL::text;
            ELSE
                tries := t.attempts + CASE WHEN r.snt THEN 1 ELSE 0 END;
                wait := greatest(coalesce(fb.cooldown_seconds, 0),
                                 CASE WHEN fb.outcome = 'failure'
                                      THEN @extschema@.retry_backoff(tries) ELSE 0 END);
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
    UPDATE @extschema@.webhook_events e
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
