-- ratebucket_queue 1.3 -> 1.4: record_deliveries and record_endpoint refuse
-- a NULL lease in claimed_leases (22004), changing nothing: it matched
-- whatever lease the event held, so that an outcome recorded late, after
-- the event was requeued and claimed again by another worker, was taken for
-- that worker's and freed its slot.  (Replaced in place: their grants and
-- comments stay.)

\echo Use "ALTER EXTENSION ratebucket_queue UPDATE TO '1.4'" to load this file. \quit

-- record_deliveries: what came back for a whole batch, in one call, each
-- event as record_delivery records it (event_ids[i] answered
-- http_statuses[i], and so on; the optional arrays NULL, or as long, their
-- elements NULL where there is nothing to say; sent NULL: true).  It takes
-- its locks in the claim's order by itself: the batch's events in id order
-- first, then their buckets (bucket_observe), in byte order of their
-- endpoints; then it writes the events, one statement for the batch, and
-- frees their slots.  Call it once the requests are over, in a transaction
-- of its own.  Returns each event's outcome, in the order given.  Errors
-- (22004, 22023) change nothing: a NULL or repeated event id, arrays of
-- other lengths, max_attempts below 1, a NULL lease (it would match any
-- claim's lease).
CREATE OR REPLACE FUNCTION record_deliveries(
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
    n      int := coalesce(cardinality(event_ids), 0);
    r      record;
    fb     record;
    tries  int;
    wait   float8;
    -- per event, in the order observed: what becomes of it
    d_ord  bigint[] := '{}';     -- its place in event_ids
    d_id   bigint[] := '{}';
    d_out  text[] := '{}';       -- the outcome returned
    d_state text[] := '{}';      -- its new status (NULL: not touched)
    d_try  int[] := '{}';
    d_http int[] := '{}';
    d_wait float8[] := '{}';
    d_slot bigint[] := '{}';
    d_cap  text[] := '{}';
BEGIN
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

    -- the batch's events, in id order, as claims and other batches lock them
    PERFORM 1 FROM webhook_events w WHERE w.id = ANY (event_ids) ORDER BY w.id FOR UPDATE;

    -- each answer to its bucket, in byte order of the endpoints (the order
    -- bucket_take_batch locks buckets in), and what it makes of the event
    FOR r IN
        SELECT u.o, u.id, u.status, u.lease, u.ra, u.hd, coalesce(u.snt, true) AS snt, u.sa,
               e.endpoint, e.status AS was, e.lease_until, e.attempts, e.slot, e.inflight_key
        FROM unnest(event_ids, http_statuses, claimed_leases,
                    coalesce(retry_afters, array_fill(NULL::text, ARRAY[n])),
                    coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])),
                    coalesce(sent, array_fill(NULL::boolean, ARRAY[n])),
                    coalesce(sent_ats, array_fill(NULL::timestamptz, ARRAY[n])))
             WITH ORDINALITY AS u(id, status, lease, ra, hd, snt, sa, o)
        LEFT JOIN webhook_events e ON e.id = u.id
        ORDER BY e.endpoint COLLATE "C", u.id
    LOOP
        d_ord := d_ord || r.o;
        d_id := d_id || r.id;
        IF r.endpoint IS NULL THEN
            -- deleted meanwhile: nothing is recorded, its endpoint is unknown
            d_out := d_out || 'missing'::text;
            d_state := d_state || NULL::text;
        ELSE
            -- what the destination said is true whatever became of the lease
            SELECT * INTO fb
            FROM ratebucket.bucket_observe(r.endpoint, r.status, r.ra, r.hd, r.sa);
            IF r.was <> 'sending'
               OR r.lease_until IS DISTINCT FROM coalesce(r.lease, r.lease_until) THEN
                -- no longer this claim's: another worker may hold it, and its slot
                d_out := d_out || 'stale'::text;
                d_state := d_state || NULL::text;
            ELSE
                tries := r.attempts + CASE WHEN r.snt THEN 1 ELSE 0 END;
                wait := greatest(coalesce(fb.cooldown_seconds, 0),
                                 CASE WHEN fb.outcome = 'failure'
                                      THEN retry_backoff(tries) ELSE 0 END);
                d_out := d_out || fb.outcome::text;
                d_state := d_state || CASE WHEN fb.outcome = 'success' THEN 'delivered'
                                           WHEN fb.outcome = 'neutral' OR tries >= max_attempts
                                           THEN 'failed'
                                           ELSE 'pending' END;
            END IF;
        END IF;
        d_try := d_try || tries;
        d_http := d_http || r.status;
        d_wait := d_wait || wait;
        d_slot := d_slot || r.slot;
        d_cap := d_cap || r.inflight_key;
        tries := NULL;
        wait := NULL;
    END LOOP;

    -- the requests are over: their slots are free
    PERFORM ratebucket.inflight_release(x.cap, array_agg(x.slot))
    FROM unnest(d_state, d_slot, d_cap) AS x(state, slot, cap)
    WHERE x.state IS NOT NULL AND x.slot IS NOT NULL
    GROUP BY x.cap;

    UPDATE webhook_events e
    SET status = d.state, attempts = d.tries, last_status = d.http,
        delivered_at = CASE WHEN d.state = 'delivered' THEN clock_timestamp() ELSE e.delivered_at END,
        next_attempt_at = CASE WHEN d.state = 'pending'
                               THEN clock_timestamp() + make_interval(secs => d.wait)
                               ELSE e.next_attempt_at END,
        lease_until = NULL, slot = NULL,
        -- a cooldown is its bucket's (unpark brings it back early); a
        -- backoff is its own
        parked = d.state = 'pending' AND d.outcome <> 'failure'
    FROM unnest(d_id, d_state, d_try, d_http, d_wait, d_out) AS d(id, state, tries, http, wait, outcome)
    WHERE e.id = d.id AND d.state IS NOT NULL;

    RETURN QUERY
    SELECT d.id, d.outcome
    FROM unnest(d_ord, d_id, d_out) AS d(o, id, outcome)
    ORDER BY d.o;
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
CREATE OR REPLACE FUNCTION record_endpoint(
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
