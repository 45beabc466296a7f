-- ratebucket_queue 1.3 -> 1.4: every function replaced in place (its grants
-- and comment stay), with the bodies of the current surface:
--
--   - record_deliveries and record_endpoint refuse a NULL lease in
--     claimed_leases (22004), changing nothing: it matched whatever lease
--     the event held, so that an outcome recorded late, after the event was
--     requeued and claimed again by another worker, was taken for that
--     worker's and freed its slot;
--   - every function runs with search_path = pg_catalog, pg_temp (it was
--     pg_catalog, the extension's schema, pg_temp) and names the
--     extension's tables, row type and functions by their schema, and
--     unpark passes repace_parked a typed NULL: a function planted in the
--     extension's schema with a closer signature (an overload of
--     repace_parked taking text for the NULL, or of a built-in such as
--     cardinality(text[])) was called instead of the one meant.
--     distribute_queue names the catalogs and Citus's functions by
--     pg_catalog, and the statement it runs on the workers its functions
--     and operators too.

\echo Use "ALTER EXTENSION ratebucket_queue UPDATE TO '1.4'" to load this file. \quit

-- Sleeping workers wake up when events arrive (LISTEN webhook_events).
CREATE OR REPLACE FUNCTION webhook_events_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NOTIFY webhook_events;
    RETURN NULL;
END $$;

-- What claim_events needs of ratebucket's views, in functions of their own:
-- a view's plan written into the claim's statement would be set up at
-- every claim, used or not (about a twentieth of a claim's time in one
-- session).  claim_bucket_info: for each key with a bucket, its effective
-- rate now (0 for a calendar quota, which has no rate) and whether it is
-- striped.
CREATE OR REPLACE FUNCTION claim_bucket_info(keys text[])
RETURNS TABLE (key text, effective_rate float8, striped boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(keys) > 0 THEN
        RETURN QUERY
        SELECT b.endpoint, b.effective_rate, b.stripes > 1
        FROM ratebucket.bucket_status b
        WHERE b.endpoint = ANY (keys);
    END IF;
END
$$;

-- claim_cap_free: the free slots of an in-flight cap now (NULL if it has
-- no configuration).
-- (PL/pgSQL, whose plans last the session: a SQL function would be planned
-- again at every claim.)
CREATE OR REPLACE FUNCTION claim_cap_free(cap_key text) RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT greatest(s.cap - s.in_flight, 0)::int
            FROM ratebucket.inflight_status s
            WHERE s.key = cap_key);
END
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
CREATE OR REPLACE FUNCTION repace_parked(ep text, max_events int, only_if_sooner boolean)
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
                                  THEN now() + interval '1 s' END
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
            rate = excluded.rate, parked = excluded.parked, recheck_at = excluded.recheck_at;
    ELSE
        UPDATE @extschema@.webhook_parking p
        SET recheck_at = CASE WHEN p.parked_until > now() + interval '2 s'
                              THEN now() + interval '1 s' END
        WHERE p.endpoint = ep;
    END IF;
    RETURN r.moved;
END
$$;

-- recheck_parked: claim_events' step 0.  The endpoints whose cursors are
-- due for a look (recheck_at), soonest first, at most n, each one whose
-- parking lock is free (tried, never waited for: a claim parking it now
-- passes it on to the next): repace_parked, if its buckets can send sooner.
CREATE OR REPLACE FUNCTION recheck_parked(n int, max_events int) RETURNS void
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
CREATE OR REPLACE FUNCTION unpark(endpoint text) RETURNS bigint
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

-- claim_events: claim up to "batch" events, at most per_endpoint of any one
-- endpoint, in one short transaction (call it on its own, in autocommit).
--
-- 0. recheck (a statement of its own, before the rest): endpoints with
--    events parked more than 2 s ahead are looked at again about every
--    second (recheck_parked, as many as the walk looks for, the longest
--    unchecked first): one whose buckets could send its first parked event
--    more than a second sooner, or whose rate rose by more than half since,
--    gets them back at its pace now (repace_parked).  So a resume, a reset,
--    a raised limit or a closed breaker brings them back without anyone
--    touching the queue.
-- 1. walk: walk the due events in queue order (priority, then due time)
--    without locking, and keep the first event of each endpoint:
--    bucket_claimable answers, at an endpoint's first event, how many of its
--    events to lock (its whole tokens, at most per_endpoint; 0 in a cooldown,
--    a pause or an open breaker), and NULL at its later events, and at every
--    event of an endpoint without a configuration (configured_only).  One
--    busy endpoint appears once: the next endpoints get their turn.
--    The walk stops after 2 x batch / per_endpoint endpoints (at least 8), or
--    20 x batch events.  Then it looks at as many endpoints again of those
--    it parked events of (webhook_parking) that have due events, the best
--    first due event first (one probe of webhook_events_endpoint for each
--    row of webhook_parking): parked behind a backlog of older events, they
--    would otherwise wait until the head of the queue reached them.
-- 2. sized: what the event's other limits allow too: the whole tokens each
--    bucket of its "limits" holds (bucket_grantable, which answers for a
--    bucket every time: endpoints share their account) and the free slots
--    of its in-flight cap.  An account out of tokens makes 0 of every one of
--    its endpoints, exactly as an endpoint without tokens.
-- 3. heads: the configured endpoints that can send, in walk order, until
--    their counts fill the batch (the last one takes what is left of it).
--    Endpoints without a token, or whose account has none, are filtered
--    here, before anything is locked.  Events of an endpoint (or a limit, or
--    a cap) that has no configuration (never configured, or dropped), and
--    events with limits or a cap on a striped endpoint or naming a striped
--    limit (a striped bucket is taken alone), are left alone: they wait,
--    visible, for it, instead of failing every claim (and are set aside when
--    they block the walk: 10).  (A limit repeated, or naming the endpoint
--    itself, counts once.)
-- 4. locked: for each head, lock up to that many of its due events, best
--    first, skipping events other workers hold: only events with the same
--    limits and cap as its first one, the limits step 2 sized it by.  (An
--    endpoint's events with other limits wait until one of them is its
--    first due event: never locked on another event's answer, so never
--    locked without a token, nor on a bucket that is not configured.)
-- 5. batches: one request per endpoint, numbered in walk order: where
--    its buckets are shared (an account, a quota, a cap) and hold less than
--    the heads asked, the endpoints of the best due events get them first.
-- 6. parked: endpoints the walk met without a token, or whose limits have
--    none (for at least park_after seconds: by default any): their next due
--    events with the limits and cap of the first one (as in 4) move to the
--    times their tokens will come, one token apart at the lowest effective
--    rate among them (a calendar quota, which has no rate, gets all of them
--    back at its reset).  The first goes when the next token does
--    (bucket_wait of the endpoint and of each limit, the longest: a
--    cooldown, an open breaker, a pause, or the refill), or, if the
--    endpoint has events parked already, one token after the last of them
--    (webhook_parking keeps where they end and at what rate; those still
--    ahead count at the rate in force now, so that a rate that rose since
--    they were parked is followed at once; one that rose by more than half
--    starts from the next token).  So the next
--    claims do not walk over them again, lower-priority events of endpoints
--    that have tokens go meanwhile, and each parked event comes back due
--    about when it can be sent, in its order (at most a year ahead).  One
--    that comes due and finds no token for it (the rate lowered by feedback
--    since it was parked, a token taken by a newer event, a worker late by
--    more than the bucket's capacity) is parked again like any due event:
--    after the endpoint's last parked one, or at its next token once that
--    one has come due (it may be the event itself: a take late by a few
--    milliseconds puts the next token off by as much, and a bucket of one
--    would otherwise lose a whole token for each).  If it came due less than
--    a token ago and that token is less than a token's time (and a second)
--    away, the takes before it were late: it is left due for the claim that
--    comes with its token (parked after the others, each of them as early,
--    every other token would find no event).
--    Attempts do not change; the events are marked parked (and so are
--    those 8 defers), and a cursor more than 2 s ahead is rechecked (0).
--    (Locked with SKIP LOCKED, never waited for, never claimed.)
--    How many, per endpoint: per_endpoint times the walk's endpoints over
--    those of them with tokens (2 x per_endpoint when half have some: the
--    parking keeps up with the claims, which take per_endpoint events of an
--    endpoint each), or as many rows as the walk passed over (events of
--    endpoints it had met already), if more; park_max when the walk met
--    fewer endpoints than it looks for (it read all it could); never more
--    than park_max.  So a claim parks about what it walked, not a whole
--    backlog at once.  One claim at a time parks an endpoint (a
--    transaction-level advisory lock, tried, never waited for): another
--    passes over it, so that two claims never start from the same last
--    parked event.
--    An endpoint held back by a full in-flight cap is parked for at least
--    cap_wait seconds (0.5 by default): no one knows when a slot frees, and
--    left due, its events would fill the walk and hide every endpoint
--    queued behind them until one did.
--    Done before the grants: the buckets stay locked from the grants to the
--    commit, and other claims of the same endpoints wait for them meanwhile.
-- 7. grants: one ratebucket.bucket_take_batch for the whole batch, called
--    once every lock on events is taken: it locks every bucket the batch
--    names once, in byte order of the keys (the order bucket_take_all locks
--    in too, so takers cannot deadlock), grants each request as many tokens
--    as its endpoint and every one of its limits hold (one row update per
--    bucket for the whole batch), and as many slots of its cap.
-- 8. deferred: locked events that got no token (or no slot) go back to the
--    queue at the time the next token comes; their attempts do not change.
-- 9. the rest are claimed: status 'sending', leased until now() + lease,
--    each holding its slot.  Each is returned with its lease_until: pass it
--    back to record_delivery (claimed_lease).
-- 10. set aside, only when the claim found nothing: events the claim leaves
--    alone (step 3: no configuration for their endpoint, a limit or their
--    cap; limits on a striped bucket) among the 20 x batch best due events
--    move unclaimable_wait seconds ahead (5 by default), in their order,
--    attempts unchanged.  Left due, enough of them at the head of the queue
--    fill the walk, and every claim would come back empty while events
--    behind them could go.  A few of them among events that can go are not
--    touched: claims that find something never run this step, nor those
--    whose walk, run again, meets only configured endpoints whose first
--    events have no limits and no cap (nothing left alone is in its way).
--    Once configured, they are claimed when they come due again.
--
-- Tokens and slots are spent only on events returned here: locked rows
-- skipped by another worker were never counted, and a rollback gives the
-- tokens and the slots back.
CREATE OR REPLACE FUNCTION claim_events(
    batch int DEFAULT 80,
    per_endpoint int DEFAULT 10,
    lease interval DEFAULT '30 seconds',
    park_after float8 DEFAULT 0,
    park_max int DEFAULT 1000,
    cap_wait float8 DEFAULT 0.5,
    unclaimable_wait float8 DEFAULT 5)
RETURNS TABLE (id bigint, endpoint text, attempts int, payload jsonb, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for any LIMIT, the statement's cost estimate is huge although it
-- runs in milliseconds: never let JIT compile it.
SET jit = off
-- One plan for every call.  Left to choose, the plan cache keeps planning
-- the statement afresh at each call (the generic plan's estimate never
-- looks cheaper than a custom one), which cost two thirds of a claim; the
-- generic plan is the same plan.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    walk_endpoints int;     -- how many endpoints the walk looks for
BEGIN
    IF batch IS NULL OR batch < 1 OR per_endpoint IS NULL OR per_endpoint < 1 THEN
        RAISE EXCEPTION 'batch and per_endpoint must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF park_max IS NULL OR park_max < 0 THEN
        RAISE EXCEPTION 'park_max must not be negative' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- (NaN is above every number here, so it fails each of these too)
    IF park_after IS NULL OR NOT (park_after >= 0 AND park_after <= 'Infinity')
       OR cap_wait IS NULL OR NOT (cap_wait >= 0 AND cap_wait <= 366 * 86400.0)
       OR unclaimable_wait IS NULL
       OR NOT (unclaimable_wait >= 0 AND unclaimable_wait <= 366 * 86400.0) THEN
        RAISE EXCEPTION 'park_after must be zero or more, cap_wait and unclaimable_wait between 0 and a year of seconds'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    walk_endpoints := greatest(8, 2 * ceil(batch::float8 / per_endpoint)::int);

    -- 0. recheck: endpoints whose events are parked more than 2 s ahead,
    -- the longest unchecked first (as many as the walk looks for): whose
    -- buckets can send sooner now (resumed, reset, a higher rate, a breaker
    -- closed) get them back at their pace now (unpark)
    IF park_max > 0 THEN
        PERFORM @extschema@.recheck_parked(walk_endpoints, park_max);
    END IF;

    RETURN QUERY
    WITH head AS MATERIALIZED (
        SELECT f.endpoint, f.limits, f.inflight_key, f.overdue, f.n, f.place
        FROM (SELECT q.*, row_number() OVER () AS place    -- its row in the walk
              FROM (SELECT e.endpoint, e.limits, e.inflight_key,
                           -- a parked event: how long since it came due
                           CASE WHEN e.parked THEN extract(epoch FROM now() - e.next_attempt_at)::float8
                           END AS overdue,
                           ratebucket.bucket_claimable(e.endpoint, per_endpoint,
                                                       configured_only => true) AS n
                    FROM @extschema@.webhook_events e
                    WHERE e.status = 'pending' AND e.next_attempt_at <= now()
                      -- an endpoint parked 2 s ahead already: met below,
                      -- not in the way of the endpoints behind it
                      AND NOT EXISTS (SELECT FROM @extschema@.webhook_parking c
                                      WHERE c.endpoint = e.endpoint
                                        AND c.parked_until > now() + interval '2 s')
                    ORDER BY e.priority DESC, e.next_attempt_at
                    LIMIT 20 * batch) q) f
        WHERE f.n IS NOT NULL
        LIMIT walk_endpoints
    ), walk AS MATERIALIZED (
        -- the head, then endpoints whose parked events are due, oldest
        -- parking first: parked behind a backlog, the head may not reach them
        SELECT h.endpoint, h.limits, h.inflight_key, h.overdue, h.n, h.place,
               row_number() OVER () AS pos
        FROM (SELECT hd.endpoint, hd.limits, hd.inflight_key, hd.overdue, hd.n, hd.place
              FROM head hd
              UNION ALL
              SELECT b.endpoint, b.limits, b.inflight_key, b.overdue, b.n, NULL
              FROM (SELECT x.endpoint, x.limits, x.inflight_key, x.overdue,
                           ratebucket.bucket_claimable(x.endpoint, per_endpoint,
                                                       configured_only => true) AS n
                    FROM (SELECT y.endpoint, y.limits, y.inflight_key, y.overdue
                          FROM @extschema@.webhook_parking p
                          CROSS JOIN LATERAL (
                              SELECT e.endpoint, e.limits, e.inflight_key,
                                     CASE WHEN e.parked
                                          THEN extract(epoch FROM now() - e.next_attempt_at)::float8
                                     END AS overdue,
                                     e.priority, e.next_attempt_at
                              FROM @extschema@.webhook_events e
                              WHERE e.endpoint = p.endpoint
                                AND e.status = 'pending' AND e.next_attempt_at <= now()
                              ORDER BY e.priority DESC, e.next_attempt_at
                              LIMIT 1) y
                          WHERE p.endpoint NOT IN (SELECT hd2.endpoint FROM head hd2)
                          ORDER BY y.priority DESC, y.next_attempt_at
                          LIMIT walk_endpoints) x) b
              WHERE b.n IS NOT NULL) h
    ), sized AS MATERIALIZED (
        SELECT v.endpoint, v.limits, v.inflight_key, v.pos, v.overdue,
               -- least ignores NULL: no limits, no cap
               least(v.n, v.limits_n, v.free) AS n,
               -- every limit and the cap are configured (the endpoint is:
               -- the walk passed over endpoints that are not)
               NOT v.limits_unconfigured
                   AND (v.inflight_key IS NULL OR v.free IS NOT NULL)
                   -- a striped bucket is taken alone, never with limits
                   AND NOT v.striped_with_limits AS configured,
               v.free = 0 AS cap_full
        FROM (SELECT w.endpoint, w.limits, w.inflight_key, w.pos, w.overdue, w.n,
                     l.n AS limits_n, l.unconfigured AS limits_unconfigured,
                     CASE WHEN w.inflight_key IS NOT NULL THEN
                         @extschema@.claim_cap_free(w.inflight_key) END AS free,
                     CASE WHEN cardinality(w.limits) > 0 OR w.inflight_key IS NOT NULL THEN
                         (SELECT coalesce(bool_or(i.striped), false)
                          FROM @extschema@.claim_bucket_info(ARRAY[w.endpoint] || w.limits) i)
                         ELSE false END AS striped_with_limits
              FROM walk w
              CROSS JOIN LATERAL (
                  SELECT min(g.n) AS n, coalesce(bool_or(g.n IS NULL), false) AS unconfigured
                  FROM unnest(w.limits) AS k(key)
                  CROSS JOIN LATERAL (SELECT ratebucket.bucket_grantable(k.key, per_endpoint) AS n) g) l
             ) v
    ), heads AS (
        SELECT r.endpoint, r.limits, r.inflight_key, r.pos, least(r.n, batch - r.before) AS n
        FROM (SELECT z.endpoint, z.limits, z.inflight_key, z.pos, z.n,
                     sum(z.n) OVER (ORDER BY z.pos) - z.n AS before
              FROM sized z
              WHERE z.n > 0 AND z.configured) r
        WHERE r.before < batch
    ), locked AS (
        SELECT x.id, x.endpoint, x.limits, x.inflight_key, x.priority, x.next_attempt_at, hd.pos
        FROM heads hd
        CROSS JOIN LATERAL (
            SELECT e.id, e.endpoint, e.limits, e.inflight_key, e.priority, e.next_attempt_at
            FROM @extschema@.webhook_events e
            WHERE e.endpoint = hd.endpoint
              -- the head's limits and cap, in a CASE: the planner cannot
              -- estimate it and counts half the rows.  (Estimated as plain
              -- conditions, at a fraction of a percent, they made it sort
              -- every due event of the endpoint instead of reading the
              -- index in order up to the LIMIT.)
              AND CASE WHEN e.limits = hd.limits
                            AND e.inflight_key IS NOT DISTINCT FROM hd.inflight_key
                       THEN true ELSE false END
              AND e.status = 'pending' AND e.next_attempt_at <= now()
            ORDER BY e.priority DESC, e.next_attempt_at
            LIMIT hd.n
            FOR UPDATE SKIP LOCKED) x
    ), batches AS MATERIALIZED (
        SELECT l.endpoint, l.limits, l.inflight_key,
               array_agg(l.id ORDER BY l.priority DESC, l.next_attempt_at, l.id) AS ids,
               row_number() OVER (ORDER BY l.pos) AS req
        FROM locked l
        GROUP BY l.endpoint, l.limits, l.inflight_key, l.pos
    ), to_park AS MATERIALIZED (
        -- one claim at a time parks an endpoint: another one passes over it
        SELECT p.endpoint, p.limits, p.inflight_key, p.wait, p.rate
        FROM (SELECT z.endpoint, z.limits, z.inflight_key, max(z.overdue) AS overdue,
                     greatest(max(ratebucket.bucket_wait(k.key)),
                              CASE WHEN bool_or(z.cap_full) THEN cap_wait ELSE 0 END) AS wait,
                     min(i.effective_rate) FILTER (WHERE i.effective_rate > 0) AS rate
              FROM sized z
              CROSS JOIN LATERAL unnest(ARRAY[z.endpoint] || z.limits) AS k(key)
              -- the rates of every bucket to park, in one call
              LEFT JOIN @extschema@.claim_bucket_info((
                  SELECT array_agg(DISTINCT k2.key)
                  FROM sized z2
                  CROSS JOIN LATERAL unnest(ARRAY[z2.endpoint] || z2.limits) AS k2(key)
                  WHERE z2.n = 0 AND z2.configured)) i ON i.key = k.key
              WHERE z.n = 0 AND z.configured
              GROUP BY z.endpoint, z.limits, z.inflight_key) p
        -- (one condition: the lock is tried only for endpoints to park)
        WHERE CASE WHEN p.wait > 0 AND p.wait >= park_after
                        -- its first due event was parked, came due less than
                        -- a token ago and its token is less than a second
                        -- away (the takes before it were late): left due,
                        -- for the claim that comes with the token (parked
                        -- again, it would go after the endpoint's other
                        -- parked events, each of them as early, and every
                        -- other token would find none)
                        AND NOT coalesce(p.overdue < 1 / p.rate
                                         AND p.wait < least(1 / p.rate, 1.0), false)
                        -- paced at more than a token a second, its next
                        -- token within a minute: not when its parked events
                        -- reach 2 s past its next token already (they would
                        -- keep a pace the rate may leave)
                        AND NOT (p.rate > 1 AND p.wait < 60 AND EXISTS (
                            SELECT FROM @extschema@.webhook_parking c
                            WHERE c.endpoint = p.endpoint
                              AND c.parked_until > now() + make_interval(secs =>
                                      least(p.wait, 366 * 86400.0) + 2)))
                   THEN pg_try_advisory_xact_lock(hashtext('claim_events: parking'),
                                                  hashtext(p.endpoint))
                   ELSE false END
    ), park_rows AS MATERIALIZED (
        SELECT p.endpoint, x.id, x.k, count(*) OVER (PARTITION BY p.endpoint) AS c
        FROM to_park p
        CROSS JOIN LATERAL (
            SELECT y.id, row_number() OVER () AS k
            FROM (SELECT e2.id
                  FROM @extschema@.webhook_events e2
                  WHERE e2.endpoint = p.endpoint
                    AND CASE WHEN e2.limits = p.limits      -- as in locked
                                  AND e2.inflight_key IS NOT DISTINCT FROM p.inflight_key
                             THEN true ELSE false END
                    AND e2.status = 'pending' AND e2.next_attempt_at <= now()
                  ORDER BY e2.priority DESC, e2.next_attempt_at
                  -- the chunk: see 6 above; paced at more than a token a second,
                  -- its next token within a minute, at most 2 s of its tokens (at
                  -- least per_endpoint), so that the next chunk follows the rate as
                  -- feedback moves it
                  LIMIT least(park_max,
                              CASE WHEN p.rate > 1 AND p.wait < 60
                                   THEN greatest(per_endpoint, ceil(least(p.rate, 1e9) * 2))::int END, (
                      SELECT CASE WHEN count(*) < walk_endpoints
                                  THEN park_max
                                  ELSE greatest(per_endpoint * count(*)
                                                    / greatest(count(*) FILTER (WHERE w.n > 0), 1),
                                                max(w.place) - count(*)) END
                      FROM walk w WHERE w.place IS NOT NULL))
                  FOR UPDATE SKIP LOCKED) y) x
    ), cursors AS (                 -- where each endpoint's parked events go
        INSERT INTO @extschema@.webhook_parking AS c (endpoint, parked_from, parked_until, rate, parked,
                                          limits, recheck_at)
        SELECT p.endpoint, now() + make_interval(secs => least(p.wait, 366 * 86400.0)),
               now() + make_interval(secs => least(
                   p.wait + CASE WHEN p.rate > 0 THEN (r.c - 1) / p.rate ELSE 0 END,
                   366 * 86400.0)),
               p.rate, r.c, p.limits,
               -- parked more than 2 s ahead: looked at again in a second (0.)
               CASE WHEN p.wait + CASE WHEN p.rate > 0 THEN (r.c - 1) / p.rate ELSE 0 END > 2
                    THEN now() + interval '1 s' END
        FROM to_park p
        JOIN (SELECT pr.endpoint, max(pr.c) AS c FROM park_rows pr GROUP BY pr.endpoint) r
          ON r.endpoint = p.endpoint
        ON CONFLICT (endpoint) DO UPDATE
        -- After the events parked before, one token after the last (or from
        -- the next token, if later; from the next token once the last has come
        -- due: it may be the very event parked again, refused the token that a
        -- late take before it put off), the events still parked ahead counted
        -- at the rate in force now: when the rate rose since they were parked
        -- (a recovery from feedback), the new ones follow at the new pace, not
        -- behind events spaced at the old one.  A rate more than half as fast
        -- again (a reconfiguration) starts from the next token.
        SET parked_from = CASE
                WHEN excluded.rate > 0 AND excluded.rate <= 1.5 * c.rate THEN
                    least(greatest(excluded.parked_from,
                                   now() + make_interval(secs => least(
                                       (greatest(extract(epoch FROM c.parked_until - now()), 0) * c.rate
                                        + CASE WHEN c.parked_until > now() THEN 1 ELSE 0 END) / excluded.rate,
                                       366 * 86400.0))),
                          now() + interval '366 days')
                ELSE excluded.parked_from END,
            parked_until = CASE
                WHEN excluded.rate > 0 AND excluded.rate <= 1.5 * c.rate THEN
                    least(greatest(excluded.parked_until,
                                   now() + make_interval(secs => least(
                                       (greatest(extract(epoch FROM c.parked_until - now()), 0) * c.rate
                                        + CASE WHEN c.parked_until > now() THEN 1 ELSE 0 END
                                        + excluded.parked - 1) / excluded.rate,
                                       366 * 86400.0))),
                          now() + interval '366 days')
                ELSE excluded.parked_until END,
            rate = excluded.rate, parked = excluded.parked, limits = excluded.limits,
            recheck_at = coalesce(c.recheck_at, excluded.recheck_at)
        RETURNING c.endpoint, c.parked_from, c.rate
    ), parked AS (
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = least(
                cu.parked_from + make_interval(secs =>
                    CASE WHEN cu.rate > 0 THEN least((pr.k - 1) / cu.rate, 366 * 86400.0)
                         ELSE 0 END),
                now() + interval '366 days'),
            parked = true
        FROM park_rows pr
        JOIN cursors cu ON cu.endpoint = pr.endpoint
        WHERE e.id = pr.id
        RETURNING 1
    ), taken AS MATERIALIZED (        -- the one call, whatever the join below
        SELECT t.request, t.granted, t.wait_seconds, t.slots
        FROM ratebucket.bucket_take_batch((
                 SELECT array_agg(ROW(ARRAY(SELECT DISTINCT k       -- each bucket once
                                            FROM unnest(ARRAY[b.endpoint] || b.limits) AS k),
                                      cardinality(b.ids),
                                      b.inflight_key)::ratebucket.batch_request
                                  ORDER BY b.req)
                 FROM batches b
                 -- after the parking: the buckets stay locked from here to
                 -- the commit, and other claims wait for them meanwhile
                 WHERE (SELECT count(*) FROM parked) >= 0)) t
    ), grants AS MATERIALIZED (
        SELECT b.endpoint, b.ids, t.granted, t.wait_seconds, t.slots
        FROM taken t JOIN batches b ON b.req = t.request
    ), deferred AS (
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = now() + make_interval(secs => g.wait_seconds), parked = true
        FROM grants g
        WHERE e.id = ANY (g.ids[g.granted + 1:])
    )
    UPDATE @extschema@.webhook_events e
    SET status = 'sending', lease_until = now() + lease,
        slot = g.slots[array_position(g.ids, e.id)], parked = false
    FROM grants g
    WHERE e.id = ANY (g.ids[1:g.granted])
    RETURNING e.id, e.endpoint, e.attempts, e.payload, e.lease_until;

    -- 10. set aside what blocks the walk: only if the walk, run again, meets
    -- an endpoint without a configuration, or one whose first event has
    -- limits or a cap (its events may be left alone).  Otherwise nothing
    -- left alone is in its way, and this step would read 20 x batch rows
    -- and peek every endpoint among them for nothing.  (Two peeks per
    -- endpoint: the first answers NULL for an endpoint without a
    -- configuration, the second, without configured_only, does not.)
    IF NOT FOUND AND (
        SELECT bool_or(w.unconfigured OR cardinality(w.limits) > 0 OR w.inflight_key IS NOT NULL)
        FROM (SELECT f.limits, f.inflight_key, f.n IS NULL AS unconfigured
              FROM (SELECT e.limits, e.inflight_key,
                           ratebucket.bucket_claimable(e.endpoint, 1,
                                                       configured_only => true) AS n,
                           ratebucket.bucket_claimable(e.endpoint, 1) AS first
                    FROM @extschema@.webhook_events e
                    WHERE e.status = 'pending' AND e.next_attempt_at <= now()
                    ORDER BY e.priority DESC, e.next_attempt_at
                    LIMIT 20 * batch) f
              WHERE f.first IS NOT NULL
              LIMIT walk_endpoints) w) THEN
        WITH head AS MATERIALIZED (
            SELECT e.id, e.endpoint, e.limits, e.inflight_key
            FROM @extschema@.webhook_events e
            WHERE e.status = 'pending' AND e.next_attempt_at <= now()
            ORDER BY e.priority DESC, e.next_attempt_at
            LIMIT 20 * batch
        ), unclaimable AS (         -- what step 3 leaves alone, once a kind
            SELECT g.endpoint, g.limits, g.inflight_key
            FROM (SELECT DISTINCT h.endpoint, h.limits, h.inflight_key FROM head h) g
            WHERE ratebucket.bucket_grantable(g.endpoint, 1) IS NULL
               OR EXISTS (SELECT 1 FROM unnest(g.limits) AS k(key)
                          WHERE ratebucket.bucket_grantable(k.key, 1) IS NULL)
               OR (g.inflight_key IS NOT NULL AND @extschema@.claim_cap_free(g.inflight_key) IS NULL)
               OR ((cardinality(g.limits) > 0 OR g.inflight_key IS NOT NULL)
                   AND EXISTS (SELECT 1
                               FROM @extschema@.claim_bucket_info(ARRAY[g.endpoint] || g.limits) i
                               WHERE i.striped))
        ), aside AS (
            SELECT y.id, row_number() OVER (ORDER BY y.priority DESC, y.next_attempt_at, y.id) AS k
            FROM (SELECT e.id, e.priority, e.next_attempt_at
                  FROM @extschema@.webhook_events e
                  WHERE e.id IN (SELECT h.id
                                 FROM head h
                                 JOIN unclaimable u
                                   ON u.endpoint = h.endpoint AND u.limits = h.limits
                                  AND u.inflight_key IS NOT DISTINCT FROM h.inflight_key)
                    AND e.status = 'pending' AND e.next_attempt_at <= now()
                  FOR UPDATE SKIP LOCKED) y
        )
        UPDATE @extschema@.webhook_events e
        SET next_attempt_at = now() + make_interval(secs => unclaimable_wait + a.k * 1e-6),
            parked = false
        FROM aside a
        WHERE e.id = a.id;
    END IF;
END
$$;

-- The delay before retrying after a failure: 0.5 s doubling per attempt, at
-- most 30 s.  (A 429's cooldown comes from the destination instead.)
CREATE OR REPLACE FUNCTION retry_backoff(attempts int) RETURNS float8
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT least(30.0, 0.5 * 2 ^ least(greatest(attempts - 1, 0), 10)) $$;

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
CREATE OR REPLACE FUNCTION record_delivery(
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

-- next_due: seconds until a claim could find something (0: now; NULL:
-- nothing pending).  For each endpoint (and set of limits) with pending
-- events, the latest of its first due event, its bucket's next token and
-- each of its limits' (ratebucket.bucket_wait, lock-free): a worker with
-- nothing to claim sleeps that long, or until NOTIFY webhook_events says
-- events arrived.  (A full in-flight cap has no such time: its slots free
-- when outcomes are recorded.)
CREATE OR REPLACE FUNCTION next_due() RETURNS float8
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT greatest(0.0, min(greatest(
           extract(epoch FROM p.due - clock_timestamp())::float8,
           ratebucket.bucket_wait(p.endpoint),
           (SELECT max(ratebucket.bucket_wait(k)) FROM unnest(p.limits) AS k))))
FROM (SELECT e.endpoint, e.limits, min(e.next_attempt_at) AS due
      FROM @extschema@.webhook_events e
      WHERE e.status = 'pending'
      GROUP BY e.endpoint, e.limits) p
HAVING count(*) > 0
$$;

-- requeue_expired: events whose lease ran out (their worker died or hung)
-- go back to the queue, and their in-flight slots are freed.  Whether the
-- request left is unknown: the attempt is not counted, and the event may be
-- delivered twice (at least once).
CREATE OR REPLACE FUNCTION requeue_expired() RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
WITH expired AS MATERIALIZED (   -- in id order, as a batch's record locks them
    SELECT id, inflight_key, slot FROM @extschema@.webhook_events
    WHERE status = 'sending' AND lease_until < now()
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), freed AS (
    SELECT ratebucket.inflight_release(x.inflight_key, array_agg(x.slot)) AS n
    FROM expired x
    WHERE x.slot IS NOT NULL
    GROUP BY x.inflight_key
), r AS (
    UPDATE @extschema@.webhook_events e
    SET status = 'pending', lease_until = NULL, next_attempt_at = now(), slot = NULL,
        parked = false
    FROM expired x
    WHERE e.id = x.id
    RETURNING 1
), forgotten AS (   -- parking cursors no claim needs any more (claim_events, 6)
    DELETE FROM @extschema@.webhook_parking p
    WHERE p.endpoint IN (SELECT c.endpoint FROM @extschema@.webhook_parking c
                         WHERE c.parked_until < now() - interval '1 hour'
                         FOR UPDATE SKIP LOCKED))
SELECT count(*) FROM r WHERE (SELECT count(*) FROM freed) >= 0
$$;

-- events_left: events not yet delivered or failed: in flight, or pending
-- and due before "before" (NULL: whenever).  A run that must end by a
-- deadline passes it: events a spent daily quota holds until its reset are
-- not left for that run.
CREATE OR REPLACE FUNCTION events_left(before timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- (PL/pgSQL: Citus plans no SQL function with parameters)
    RETURN (SELECT count(*) FROM @extschema@.webhook_events
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
SET search_path = pg_catalog, pg_temp
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

-- explain_event: why an event is not being sent, one row per thing that
-- holds it (explain_keys: its endpoint, its limits, its cap), then its own
-- time ('not due': parked until its token comes, or waiting out a retry's
-- backoff); one row 'due' when nothing holds it.  An event in flight is
-- 'leased' (until its lease ends), a finished one 'delivered' or 'failed'.
CREATE OR REPLACE FUNCTION explain_event(event_id bigint)
RETURNS TABLE (reason text, key text, until timestamptz, detail text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e @extschema@.webhook_events;
    now_ timestamptz := clock_timestamp();
    held boolean;
BEGIN
    IF event_id IS NULL THEN
        RAISE EXCEPTION 'event_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO e FROM @extschema@.webhook_events w WHERE w.id = event_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no event % in webhook_events', event_id USING ERRCODE = 'no_data_found';
    END IF;
    IF e.status IN ('delivered', 'failed') THEN
        RETURN QUERY SELECT e.status, NULL::text, NULL::timestamptz,
            format('finished after %s attempt(s), last status %s', e.attempts,
                   coalesce(e.last_status::text, 'none'));
        RETURN;
    END IF;
    IF e.status = 'sending' THEN
        RETURN QUERY SELECT 'leased'::text, NULL::text, e.lease_until,
            'claimed by a worker: in flight until it records the outcome, or back in the queue '
            'once the lease ends (requeue_expired)'::text;
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM @extschema@.explain_keys(ARRAY[e.endpoint] || e.limits, e.inflight_key, now_);
    held := FOUND;
    IF e.next_attempt_at > now_ THEN
        held := true;
        RETURN QUERY SELECT 'not due'::text, NULL::text, e.next_attempt_at,
            CASE WHEN e.parked
                 THEN 'parked until its buckets have a token for it (sooner if they get one '
                      'sooner: a claim brings it back)'
                 WHEN e.attempts > 0
                 THEN format('waiting out the backoff after attempt %s', e.attempts)
                 ELSE 'enqueued for then' END;
    END IF;
    IF NOT held THEN
        RETURN QUERY SELECT 'due'::text, NULL::text, now_,
            'nothing holds it: the next claim that reaches it sends it'::text;
    END IF;
END $$;

-- explain_endpoint: why an endpoint's events are not being sent: what
-- holds its best pending event (in queue order: its bucket, that event's
-- limits and cap; with none pending, its bucket alone), then one row on
-- its events: 'leased' (in flight, until the earliest lease ends), 'not
-- due' (pending, none due yet: until the first comes due), 'due' (some due
-- and nothing holds them), or 'no events'.
CREATE OR REPLACE FUNCTION explain_endpoint(endpoint text)
RETURNS TABLE (reason text, key text, until timestamptz, detail text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ep text := explain_endpoint.endpoint;
    now_ timestamptz := clock_timestamp();
    head @extschema@.webhook_events;
    n record;
    held boolean;
BEGIN
    IF ep IS NULL THEN
        RAISE EXCEPTION 'endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT count(*) FILTER (WHERE e.status = 'pending') AS pending,
           count(*) FILTER (WHERE e.status = 'pending' AND e.next_attempt_at <= now_) AS due,
           count(*) FILTER (WHERE e.status = 'pending' AND e.parked
                                  AND e.next_attempt_at > now_) AS parked,
           count(*) FILTER (WHERE e.status = 'sending') AS sending,
           min(e.next_attempt_at) FILTER (WHERE e.status = 'pending') AS next_at,
           min(e.lease_until) FILTER (WHERE e.status = 'sending') AS lease_at
    INTO n
    FROM @extschema@.webhook_events e
    WHERE e.endpoint = ep AND e.status IN ('pending', 'sending');
    SELECT * INTO head
    FROM @extschema@.webhook_events e
    WHERE e.endpoint = ep AND e.status = 'pending'
    ORDER BY e.priority DESC, e.next_attempt_at
    LIMIT 1;

    RETURN QUERY SELECT * FROM @extschema@.explain_keys(ARRAY[ep] || coalesce(head.limits, '{}'),
                                            head.inflight_key, now_);
    held := FOUND;
    IF n.sending > 0 THEN
        RETURN QUERY SELECT 'leased'::text, NULL::text, n.lease_at,
            format('%s in flight: each back in the queue at the latest when its lease ends',
                   n.sending);
    END IF;
    IF n.pending = 0 THEN
        IF n.sending = 0 THEN
            RETURN QUERY SELECT 'no events'::text, NULL::text, NULL::timestamptz,
                'nothing pending or in flight'::text;
        END IF;
    ELSIF n.due = 0 THEN
        RETURN QUERY SELECT 'not due'::text, NULL::text, n.next_at,
            format('%s pending, none due yet (%s parked until their buckets have tokens)',
                   n.pending, n.parked);
    ELSIF NOT held THEN
        RETURN QUERY SELECT 'due'::text, NULL::text, now_,
            format('%s of %s pending due, nothing holds them: the next claim that reaches them '
                   'sends them', n.due, n.pending);
    END IF;
END $$;

-- due_endpoints: the endpoints with work now: events pending and due, or
-- in flight with their lease run out (claim_endpoint gives those back).
-- The most urgent first: the highest priority due, then the longest due.
-- No bucket is read: an endpoint without tokens is listed, and its claim
-- puts its events off until its next token.
CREATE OR REPLACE FUNCTION due_endpoints(max_endpoints int DEFAULT 100)
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
CREATE OR REPLACE FUNCTION claim_endpoint(
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

-- distribute_queue: on a Citus coordinator where ratebucket.distribute()
-- has run, distribute the queue by endpoint, co-located with the buckets
-- (each endpoint's events on the node of its bucket), and make the
-- per-endpoint functions (claim_endpoint, record_endpoint,
-- explain_endpoint) run on the endpoint's node.  The events' primary key
-- becomes (endpoint, id), on every node: Citus needs the distribution
-- column in it.  Idempotent.  See doc/citus.md.
CREATE OR REPLACE FUNCTION distribute_queue()
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
