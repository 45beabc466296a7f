-- The delay before retrying after a failure: 0.5 s doubling per attempt, at
-- most 30 s.  (A 429's cooldown comes from the destination instead.)
CREATE FUNCTION retry_backoff(attempts int) RETURNS float8
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT least(30.0, 0.5 * 2 ^ least(greatest(attempts - 1, 0), 10)) $$;

-- record_delivery: what came back for one claimed event.  Call it for every
-- event of a batch in one transaction, after the requests, never during,
-- and take that transaction's locks in the claim's order: first lock all the
-- batch's events (SELECT ... WHERE id = ANY (...) ORDER BY id FOR UPDATE),
-- then call record_delivery in endpoint order.  record_delivery locks its
-- event, then its bucket; called one after the other without that first
-- lock, a batch would hold bucket A while waiting for an event that a
-- concurrent claim holds while it waits for bucket A (a claim's FOR UPDATE
-- SKIP LOCKED keeps the lock on a row that another worker claimed since its
-- snapshot): a deadlock, found only after deadlock_timeout.
--
-- http_status NULL means no response (timeout, reset, refused); sent false
-- means the request never left (could not connect): then the attempt does
-- not count.  The destination's answer always goes to bucket_observe (its
-- cooldowns, rate and breaker); the event is then
--   2xx                 delivered;
--   429, 503 + Retry-After, failures (5xx, timeouts): pending again, due
--                       after the cooldown or a backoff, up to max_attempts;
--   other statuses      (4xx: the request's own fault) failed at once.
-- Returns the outcome; 'stale' if the event is no longer this worker's
-- (its lease expired and it went back to the queue: the destination's answer
-- is still observed), or 'missing' if it was deleted meanwhile (nothing is
-- recorded: its endpoint is no longer known).  Pass claimed_lease, the
-- lease_until claim_events returned with the event: without it, an outcome
-- recorded after the event was requeued and claimed again by another worker
-- would be taken for that worker's (and free its in-flight slot).  Pass
-- sent_at, when the request left (on the database's clock): a 429 then
-- lowers the endpoint's rate only if the request was sent after its last
-- throttle episode, however late its answer is recorded.
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
CREATE FUNCTION record_deliveries(
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
    PERFORM 1 FROM @extschema@.webhook_events w WHERE w.id = ANY (event_ids) ORDER BY w.id FOR UPDATE;

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
        LEFT JOIN @extschema@.webhook_events e ON e.id = u.id
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
                                      THEN @extschema@.retry_backoff(tries) ELSE 0 END);
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

    UPDATE @extschema@.webhook_events e
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

-- record_delivery itself, for one event (record_deliveries makes the same
-- decisions for a batch).
CREATE FUNCTION record_delivery(
    event_id bigint,
    http_status int,
    retry_after text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    sent boolean DEFAULT true,
    max_attempts int DEFAULT 25,
    claimed_lease timestamptz DEFAULT NULL,
    sent_at timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ev       @extschema@.webhook_events;
    fb       record;
    tries    int;
    delay    float8;
BEGIN
    SELECT * INTO ev FROM @extschema@.webhook_events WHERE id = event_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;

    -- what the destination said is true whatever became of the lease
    SELECT * INTO fb
    FROM ratebucket.bucket_observe(ev.endpoint, http_status, retry_after, headers, sent_at);

    -- Not this worker's claim any more: the lease ran out, the event went
    -- back to the queue, and maybe another worker holds it now, with a
    -- slot of its own that this outcome must not free.
    IF ev.status <> 'sending' OR ev.lease_until IS DISTINCT FROM
                                 coalesce(claimed_lease, ev.lease_until) THEN
        RETURN 'stale';
    END IF;

    -- the request is over: its in-flight slot is free
    IF ev.slot IS NOT NULL THEN
        PERFORM ratebucket.inflight_release(ev.inflight_key, ARRAY[ev.slot]);
    END IF;

    tries := ev.attempts + CASE WHEN sent THEN 1 ELSE 0 END;

    IF fb.outcome = 'success' THEN
        UPDATE @extschema@.webhook_events
        SET status = 'delivered', attempts = tries, last_status = http_status,
            delivered_at = clock_timestamp(), lease_until = NULL, slot = NULL, parked = false
        WHERE id = event_id;
    ELSIF fb.outcome = 'neutral' OR tries >= max_attempts THEN
        UPDATE @extschema@.webhook_events
        SET status = 'failed', attempts = tries, last_status = http_status,
            lease_until = NULL, slot = NULL, parked = false
        WHERE id = event_id;
    ELSE
        delay := greatest(coalesce(fb.cooldown_seconds, 0),
                          CASE WHEN fb.outcome = 'failure'
                               THEN @extschema@.retry_backoff(tries) ELSE 0 END);
        UPDATE @extschema@.webhook_events
        SET status = 'pending', attempts = tries, last_status = http_status,
            next_attempt_at = clock_timestamp() + make_interval(secs => delay),
            lease_until = NULL, slot = NULL,
            -- a cooldown is its bucket's (unpark brings it back early); a
            -- backoff is its own
            parked = fb.outcome <> 'failure'
        WHERE id = event_id;
    END IF;
    RETURN fb.outcome;
END $$;
