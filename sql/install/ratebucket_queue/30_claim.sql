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
--    busy endpoint appears once: the next endpoints get their turn.  Of the
--    endpoints with tokens, it keeps only as many as fill the batch, and
--    only those that no other claim is taking tokens from: a claim takes a
--    transaction-level advisory lock on each (tried, never waited for) and
--    passes over one another open claim holds, to the endpoints behind it,
--    instead of waiting for its bucket.  So one claim at a time takes an
--    endpoint's tokens: an endpoint gets at most per_endpoint events a
--    claim, one claim after the other.  Likewise it passes over an endpoint
--    without tokens that another claim is parking (the parking lock of 6,
--    tried here), so that claims park different endpoints at once.
--    The walk stops after 2 x batch / per_endpoint endpoints (at least 8),
--    those passed over for another claim not counted, once their tokens
--    fill the batch, or after 20 x batch events.  (It keeps as many without
--    tokens as it looks for endpoints.)  Then it looks at as many endpoints
--    again of those it parked events of (webhook_parking), the parking
--    cursors whose look has come (look_from), the earliest first: parked
--    behind a backlog of older events, they would otherwise wait until the
--    head of the queue reached them (1a).  Those with due events join the walk, the best
--    first due event first.  After the claim (9a), each cursor looked at is
--    looked at again after every other one due (its look_from is now), or,
--    if its endpoint has nothing due, when its best pending event comes due,
--    a second from now at the latest (next_look).  So every claim probes a
--    few cursors, not all of them, and the cursors with due events take
--    turns.
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
--
-- Long: steps 2 to 9 are one statement, so that they read one snapshot,
-- take their locks in order and run on one plan: tokens are asked for (7)
-- only for the events the same statement locked (4), once its parking (6)
-- is done, and each step reads the rows of the steps before it as the
-- statement made them.
-- That statement is most of its length; the checks of its arguments, the
-- recheck (0), the cursors' read (1a) and the walk (1, a loop, so that it
-- stops taking endpoints' locks once it has enough) before it, the
-- cursors' move (9a) and the set-aside (10) after it are short.
CREATE FUNCTION claim_events(
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
    looks text[];           -- the parking cursors it looks at (1a)
    walk_rows @extschema@.claim_walk[] := '{}';  -- the walk (1), in its order
    walked text[] := '{}';  -- its endpoints met at the head
    filled bigint := 0;     -- the tokens of its endpoints that have some
    met int := 0;           -- the endpoints it met there
    kept_tokens int := 0;   -- those it kept with tokens
    kept_idle int := 0;     -- and without
    nulls bigint := 0;      -- the rows read that were no endpoint's first
    passed_rows bigint := 0;  -- those before the last endpoint met
    chunk bigint;           -- how many due events of an endpoint to park
    r record;
    claimed boolean;        -- whether it returned any event
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

    -- 1a. the parking cursors whose look has come, the earliest first, as
    -- many as the walk looks for (moved on after the claim: 9a)
    looks := ARRAY(SELECT p.endpoint
                   FROM @extschema@.webhook_parking p
                   WHERE p.look_from <= now()
                   ORDER BY p.look_from
                   LIMIT walk_endpoints);

    -- 1. walk: the head of the queue, in queue order
    FOR r IN
        SELECT e.endpoint, e.limits, e.inflight_key,
               -- a parked event: how long since it came due
               CASE WHEN e.parked THEN extract(epoch FROM now() - e.next_attempt_at)::float8
               END AS overdue,
               ratebucket.bucket_claimable(e.endpoint, per_endpoint,
                                           configured_only => true) AS n
        FROM @extschema@.webhook_events e
        WHERE e.status = 'pending' AND e.next_attempt_at <= now()
          -- an endpoint parked 2 s ahead already: met below, not in the
          -- way of the endpoints behind it.  (In a CASE, a test of each row
          -- read in queue order: as an anti-join, estimated to leave almost
          -- nothing, it made the plan sort every due event.)
          AND CASE WHEN EXISTS (SELECT FROM @extschema@.webhook_parking c
                                WHERE c.endpoint = e.endpoint
                                  AND c.parked_until > now() + interval '2 s')
                   THEN false ELSE true END
        ORDER BY e.priority DESC, e.next_attempt_at
        LIMIT 20 * batch
    LOOP
        nulls := nulls + (r.n IS NULL)::int;
        CONTINUE WHEN r.n IS NULL;
        -- an endpoint that another claim is taking tokens from, or, without
        -- tokens, parking: passed over (not met), to the endpoints behind it
        CONTINUE WHEN CASE WHEN r.n > 0
                           THEN filled < batch
                                AND NOT pg_try_advisory_xact_lock(hashtext('claim_events: claiming'),
                                                                  hashtext(r.endpoint))
                           ELSE kept_idle < walk_endpoints
                                AND NOT pg_try_advisory_xact_lock(hashtext('claim_events: parking'),
                                                                  hashtext(r.endpoint)) END;
        met := met + 1;
        passed_rows := nulls;
        walked := walked || r.endpoint;
        -- kept: one with tokens while the batch is not full, and as many
        -- without tokens (to park) as the walk looks for endpoints, each
        -- under the lock taken above
        IF (r.n > 0 AND filled < batch) OR (r.n = 0 AND kept_idle < walk_endpoints) THEN
            filled := filled + r.n;
            kept_idle := kept_idle + (r.n = 0)::int;
            kept_tokens := kept_tokens + (r.n > 0)::int;
            walk_rows := walk_rows || ROW(r.endpoint, r.limits, r.inflight_key, r.overdue,
                                          r.n)::@extschema@.claim_walk;
        END IF;
        -- (it goes on past the endpoints other claims hold until the batch
        -- is full)
        EXIT WHEN met >= walk_endpoints AND filled >= batch;
    END LOOP;
    -- how many due events of an endpoint to park (6): per_endpoint times
    -- the endpoints kept over those of them with tokens, or as many rows as
    -- the walk passed over (later events of the endpoints it met), if more;
    -- park_max if it met fewer endpoints than it looks for (it read all it
    -- could)
    chunk := CASE WHEN met < walk_endpoints THEN park_max
                  ELSE greatest(per_endpoint * (kept_tokens + kept_idle) / greatest(kept_tokens, 1),
                                passed_rows) END;

    -- then the cursors looked at (1a) that the head did not meet and whose
    -- endpoints have due events, the best first due event first: parked
    -- behind a backlog, the head may not reach them
    FOR r IN
        SELECT p.endpoint, y.limits, y.inflight_key, y.overdue,
               ratebucket.bucket_claimable(p.endpoint, per_endpoint,
                                           configured_only => true) AS n
        FROM unnest(looks) AS p(endpoint)
        CROSS JOIN LATERAL (
            SELECT e.limits, e.inflight_key,
                   CASE WHEN e.parked
                        THEN extract(epoch FROM now() - e.next_attempt_at)::float8
                   END AS overdue,
                   e.priority, e.next_attempt_at
            FROM @extschema@.webhook_events e
            WHERE e.endpoint = p.endpoint
              AND e.status = 'pending' AND e.next_attempt_at <= now()
            ORDER BY e.priority DESC, e.next_attempt_at
            LIMIT 1) y
        WHERE p.endpoint <> ALL (walked)
        ORDER BY y.priority DESC, y.next_attempt_at
    LOOP
        CONTINUE WHEN r.n IS NULL;
        CONTINUE WHEN CASE WHEN r.n > 0           -- as at the head
                           THEN filled >= batch
                                OR NOT pg_try_advisory_xact_lock(hashtext('claim_events: claiming'),
                                                                 hashtext(r.endpoint))
                           ELSE NOT pg_try_advisory_xact_lock(hashtext('claim_events: parking'),
                                                              hashtext(r.endpoint)) END;
        filled := filled + r.n;
        walk_rows := walk_rows || ROW(r.endpoint, r.limits, r.inflight_key, r.overdue,
                                      r.n)::@extschema@.claim_walk;
    END LOOP;

    RETURN QUERY
    WITH walk AS MATERIALIZED (
        SELECT w.endpoint, w.limits, w.inflight_key, w.overdue, w.n, w.pos
        FROM unnest(walk_rows) WITH ORDINALITY
             AS w(endpoint, limits, inflight_key, overdue, n, pos)
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
                      chunk))
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
            recheck_at = coalesce(c.recheck_at, excluded.recheck_at),
            look_from = now()   -- looked at again after the others due
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
    claimed := FOUND;

    -- 9a. each cursor looked at goes after the others due (now), or, if its
    -- endpoint has nothing due any more, rests until its next event comes
    -- due (next_look).  Those another claim holds are left to it (tried,
    -- never waited for: a statement of its own after the claim's, whose
    -- bucket locks are held to the commit).
    IF cardinality(looks) > 0 THEN
        UPDATE @extschema@.webhook_parking c
        SET look_from = @extschema@.next_look(c.endpoint)
        WHERE c.endpoint IN (SELECT p.endpoint
                             FROM @extschema@.webhook_parking p
                             WHERE p.endpoint = ANY (looks)
                             FOR UPDATE SKIP LOCKED);
    END IF;

    -- 10. set aside what blocks the walk: only if the walk, run again, meets
    -- an endpoint without a configuration, or one whose first event has
    -- limits or a cap (its events may be left alone).  Otherwise nothing
    -- left alone is in its way, and this step would read 20 x batch rows
    -- and peek every endpoint among them for nothing.  (Two peeks per
    -- endpoint: the first answers NULL for an endpoint without a
    -- configuration, the second, without configured_only, does not.)
    IF NOT claimed AND (
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
