-- next_look: when the claims' walk next needs to look for due events of
-- an endpoint with a parking cursor (webhook_parking.look_from): now while
-- one is due; otherwise when its best pending event (in queue order) comes
-- due, and a second from now at the latest.  An event that comes due sooner
-- (one of lower priority, or one enqueued, retried, given back by
-- requeue_expired, deferred by a claim that lost its token, or moved by hand
-- meanwhile) is met once that second has passed and the cursor's turn has
-- come.
CREATE FUNCTION next_look(ep text) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN b.at IS NULL OR b.at > now()
                THEN least(b.at, now() + interval '1 s') ELSE now() END
    FROM (SELECT (SELECT e.next_attempt_at
                  FROM @extschema@.webhook_events e
                  WHERE e.endpoint = ep AND e.status = 'pending'
                  ORDER BY e.priority DESC, e.next_attempt_at
                  LIMIT 1) AS at) b
$$;

-- repace_parked: bring an endpoint's events parked ahead (parked, pending,
-- not due yet) back to when its buckets can send them now, in their order:
-- the k-th (from 0) when its buckets will have k + 1 tokens, at the longest
-- wait and the lowest effective rate among the endpoint and the limits its
-- events were last parked with, never later than it was (an event comes
-- sooner or stays: moved only if by more than a second).  At most
-- max_events of them (NULL: all); only_if_sooner: only if its first parked
-- event could go more than a second sooner than it is due, or the rate rose
-- by more than half since they were parked.  Its cursor in webhook_parking
-- then ends where they do.  The caller holds the endpoint's parking lock
-- (the advisory lock claim_events takes to park it).  Returns how many
-- moved.
--
-- Long: one reading of the endpoint's buckets (the wait, the rate and the
-- tokens read at its start) paces its test, its move and its cursor alike,
-- all under the caller's parking lock; the move is one statement that
-- locks, paces and updates the events, so that only events it locked move.
CREATE FUNCTION repace_parked(ep text, max_events int, only_if_sooner boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys       text[] := ARRAY[ep];
    old_rate   float8;
    wait_now   float8;
    rate_now   float8;
    tokens_now float8;
    first_at   timestamptz;
    r          record;
BEGIN
    SELECT ARRAY[ep] || p.limits, p.rate INTO keys, old_rate
    FROM @extschema@.webhook_parking p WHERE p.endpoint = ep;
    IF NOT FOUND THEN
        keys := ARRAY[ep];
    END IF;
    SELECT max(ratebucket.bucket_wait(k.key)) INTO wait_now FROM unnest(keys) AS k(key);
    SELECT min(i.effective_rate) FILTER (WHERE i.effective_rate > 0) INTO rate_now
    FROM @extschema@.claim_bucket_info(keys) i;
    SELECT greatest(min(s.tokens), 0) INTO tokens_now
    FROM ratebucket.bucket_status s
    WHERE s.endpoint = ANY (keys) AND s.quota IS NULL;
    wait_now := least(coalesce(wait_now, 0), 366 * 86400.0);

    IF only_if_sooner THEN
        SELECT e.next_attempt_at INTO first_at
        FROM @extschema@.webhook_events e
        WHERE e.endpoint = ep AND e.status = 'pending' AND e.parked AND e.next_attempt_at > now()
        ORDER BY e.priority DESC, e.next_attempt_at
        LIMIT 1;
        IF first_at IS NULL
           OR NOT (first_at > now() + make_interval(secs => greatest(wait_now,
                                  coalesce((1 - tokens_now) / rate_now, 0)) + 1)
                   OR coalesce(rate_now > 1.5 * old_rate, false)) THEN
            -- nothing to bring back: look again in a second while events
            -- are parked more than 2 s ahead
            UPDATE @extschema@.webhook_parking p
            SET recheck_at = CASE WHEN first_at IS NOT NULL AND p.parked_until > now() + interval '2 s'
                                  THEN now() + interval '1 s' END,
                look_from = @extschema@.next_look(ep)
            WHERE p.endpoint = ep;
            RETURN 0;
        END IF;
    END IF;

    WITH ahead AS MATERIALIZED (
        SELECT a.id, a.next_attempt_at AS old_at,
               row_number() OVER (ORDER BY a.priority DESC, a.next_attempt_at) - 1 AS k
        FROM (SELECT e.id, e.priority, e.next_attempt_at
              FROM @extschema@.webhook_events e
              WHERE e.endpoint = ep AND e.status = 'pending' AND e.parked
                AND e.next_attempt_at > now()
              ORDER BY e.priority DESC, e.next_attempt_at
              LIMIT max_events
              FOR UPDATE SKIP LOCKED) a
    ), paced AS MATERIALIZED (
        SELECT a.id, a.old_at,
               least(a.old_at, now() + make_interval(secs => least(
                   greatest(wait_now, coalesce((a.k + 1 - tokens_now) / rate_now, 0)),
                   366 * 86400.0))) AS new_at
        FROM ahead a
    ), moved AS (
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = p.new_at
        FROM paced p
        WHERE e.id = p.id AND p.new_at < p.old_at - interval '1 s'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved) AS moved, count(*) AS n,
           min(p.new_at) AS first_at, max(p.new_at) AS last_at
    INTO r
    FROM paced p;

    IF r.moved > 0 THEN
        -- the next chunk a claim parks goes after them
        INSERT INTO @extschema@.webhook_parking AS c (endpoint, parked_from, parked_until, rate, parked,
                                          limits, recheck_at)
        VALUES (ep, r.first_at, r.last_at, rate_now, r.n, keys[2:],
                -- all of them read: more may be parked further ahead
                CASE WHEN r.n >= max_events THEN now()
                     WHEN r.last_at > now() + interval '2 s' THEN now() + interval '1 s' END)
        ON CONFLICT (endpoint) DO UPDATE
        SET parked_from = excluded.parked_from, parked_until = excluded.parked_until,
            rate = excluded.rate, parked = excluded.parked, recheck_at = excluded.recheck_at,
            look_from = now();  -- they come due sooner: looked for at once
    ELSE
        UPDATE @extschema@.webhook_parking p
        SET recheck_at = CASE WHEN p.parked_until > now() + interval '2 s'
                              THEN now() + interval '1 s' END,
            -- unpark: the walk looks at once
            look_from = CASE WHEN only_if_sooner THEN @extschema@.next_look(ep) ELSE now() END
        WHERE p.endpoint = ep;
    END IF;
    RETURN r.moved;
END
$$;

-- recheck_parked: claim_events' step 0.  The endpoints whose cursors are
-- due for a look (recheck_at), soonest first, at most n, each one whose
-- parking lock is free (tried, never waited for: a claim parking it now
-- passes it on to the next): repace_parked, if its buckets can send sooner.
CREATE FUNCTION recheck_parked(n int, max_events int) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ep text;
BEGIN
    FOR ep IN SELECT p.endpoint
              FROM @extschema@.webhook_parking p
              WHERE p.recheck_at <= now()
              ORDER BY p.recheck_at
              LIMIT n LOOP
        IF pg_try_advisory_xact_lock(hashtext('claim_events: parking'), hashtext(ep)) THEN
            PERFORM @extschema@.repace_parked(ep, max_events, true);
        END IF;
    END LOOP;
END
$$;

-- unpark: bring back every event of an endpoint parked ahead, now, at the
-- pace its buckets allow now (repace_parked).  Claims do it by themselves,
-- within a second or so of a change, for events parked more than 2 s ahead;
-- this is for an operator who wants it done at once.  Waits for a claim
-- that is parking the endpoint.  Returns how many events moved.
CREATE FUNCTION unpark(endpoint text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF unpark.endpoint IS NULL THEN
        RAISE EXCEPTION 'endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('claim_events: parking'), hashtext(unpark.endpoint));
    RETURN @extschema@.repace_parked(unpark.endpoint, NULL::int, false);
END
$$;
