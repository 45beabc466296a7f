/* ratebucket_queue--1.4--1.5.sql */

-- ratebucket_queue 1.4 -> 1.5:
--
--   - recording: one way, for one event, a batch or one endpoint's batch
--     (record_delivery calls record_deliveries; record_endpoint shares their
--     argument check, record_check, and their decisions, record_decide),
--     every answer of a batch observed with one
--     ratebucket.bucket_observe_batch (ratebucket 1.10): one lock and one
--     row write per endpoint, not per event.  record_delivery now refuses
--     max_attempts below 1 or NULL (22023), as record_deliveries does.
--   - the claims' walk looks at a few parking cursors per claim, not at
--     every one: those whose look has come (webhook_parking.look_from), the
--     earliest first; each one looked at goes after the others, and one
--     whose endpoint has nothing due rests until its best pending event
--     comes due, or a second at most (next_look).
--   - one claim at a time takes an endpoint's tokens: a claim passes over
--     an endpoint another open claim is taking from, to the endpoints
--     behind it, instead of waiting for its bucket; the walk is a loop
--     before the claim's statement (claim_walk), which stops taking
--     endpoints once they fill the batch.

\echo Use "ALTER EXTENSION ratebucket_queue UPDATE TO '1.5'" to load this file. \quit

-- ratebucket 1.10 or later: the recording observes a batch with
-- ratebucket.bucket_observe_batch.
DO $$
BEGIN
    IF (SELECT string_to_array(extversion, '.')::int[] < ARRAY[1, 10]
        FROM pg_catalog.pg_extension WHERE extname = 'ratebucket') THEN
        RAISE EXCEPTION 'ratebucket_queue 1.5 needs ratebucket 1.10 or later'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run ALTER EXTENSION ratebucket UPDATE first.';
    END IF;
END $$;

-- webhook_parking.look_from: when the claims' walk next looks for the due
-- events of a parked endpoint (every cursor kept: now).
ALTER TABLE webhook_parking ADD COLUMN look_from timestamptz NOT NULL DEFAULT now();
CREATE INDEX webhook_parking_look ON webhook_parking (look_from);

-- claim_walk: a row of claim_events' walk (step 1), gathered before its
-- statement: an endpoint met, the limits and cap of its first due event, how
-- long since that event came due if it was parked (overdue), and how many of
-- its events the claim may lock (n: its whole tokens, at most per_endpoint).
CREATE TYPE claim_walk AS (
    endpoint     text,
    limits       text[],
    inflight_key text,
    overdue      float8,
    n            int
);

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

-- record_check: the arguments of a batch, refused before anything is
-- locked (22004, 22023): a NULL or repeated event id, arrays of other
-- lengths, max_attempts below 1, a NULL lease (it would match whatever
-- lease the event holds: an outcome recorded late, after the event was
-- requeued and claimed again, would be taken for the new claim's and free
-- its slot).
CREATE FUNCTION record_check(
    event_ids bigint[],
    http_statuses int[],
    claimed_leases timestamptz[],
    retry_afters text[],
    headers jsonb[],
    sent boolean[],
    sent_ats timestamptz[],
    max_attempts int)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n int := coalesce(cardinality(event_ids), 0);
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
    IF array_position(claimed_leases, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'claimed_leases must not hold a NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = format('The lease of event %s is NULL.',
                                  event_ids[array_position(claimed_leases, NULL)]),
                  HINT = 'Pass each event''s lease_until as the claim returned it.';
    END IF;
END $$;

-- record_decide: the answers of a batch (checked by record_check), given
-- with the events they are for as the caller locked them (found: their
-- endpoint, status, lease, attempts, slot and cap, in the answers' order;
-- endpoint NULL for an event not found).  Observes every answer of a found
-- event, in one ratebucket.bucket_observe_batch (each endpoint's answers in
-- id order), and returns for each answer, in the order given, its outcome
-- and, for an event still this claim's, its new status, attempts and delay
-- (state NULL: not written), with the slot it frees.
CREATE FUNCTION record_decide(
    event_ids bigint[],
    http_statuses int[],
    claimed_leases timestamptz[],
    retry_afters text[],
    headers jsonb[],
    sent boolean[],
    sent_ats timestamptz[],
    max_attempts int,
    endpoints text[],
    statuses text[],
    leases timestamptz[],
    attempts int[],
    slots bigint[],
    caps text[])
RETURNS TABLE (o bigint, id bigint, outcome text, state text, tries int, http int,
               wait float8, slot bigint, cap text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n int := cardinality(event_ids);
BEGIN
    RETURN QUERY
    WITH u AS MATERIALIZED (
        SELECT u.*,
               -- its place among the answers observed (found events only)
               CASE WHEN u.endpoint IS NOT NULL THEN
                   row_number() OVER (PARTITION BY u.endpoint IS NULL
                                      ORDER BY u.endpoint COLLATE "C", u.id) END AS k
        FROM unnest(event_ids, http_statuses, claimed_leases,
                    coalesce(retry_afters, array_fill(NULL::text, ARRAY[n])),
                    coalesce(headers, array_fill(NULL::jsonb, ARRAY[n])),
                    coalesce(sent, array_fill(NULL::boolean, ARRAY[n])),
                    coalesce(sent_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                    endpoints, statuses, leases, attempts, slots, caps)
             WITH ORDINALITY AS u(id, http, lease, ra, hd, snt, sa,
                                  endpoint, was, lease_until, attempts, slot, cap, o)
    ), fb AS MATERIALIZED (
        SELECT f.ord, f.outcome, f.cooldown_seconds
        FROM ratebucket.bucket_observe_batch(
                 coalesce((SELECT array_agg(u.endpoint ORDER BY u.k) FROM u WHERE u.k IS NOT NULL), '{}'),
                 coalesce((SELECT array_agg(u.http ORDER BY u.k) FROM u WHERE u.k IS NOT NULL), '{}'),
                 (SELECT array_agg(u.ra ORDER BY u.k) FROM u WHERE u.k IS NOT NULL),
                 (SELECT array_agg(u.hd ORDER BY u.k) FROM u WHERE u.k IS NOT NULL),
                 (SELECT array_agg(u.sa ORDER BY u.k) FROM u WHERE u.k IS NOT NULL)) f
    ), d AS (
        SELECT u.o, u.id, u.http, u.slot, u.cap, fb.outcome, fb.cooldown_seconds,
               u.endpoint IS NULL AS missing,
               u.was <> 'sending' OR u.lease_until IS DISTINCT FROM u.lease AS stale,
               u.attempts + CASE WHEN coalesce(u.snt, true) THEN 1 ELSE 0 END AS tries
        FROM u LEFT JOIN fb ON fb.ord = u.k
    )
    SELECT d.o, d.id,
           CASE WHEN d.missing THEN 'missing' WHEN d.stale THEN 'stale' ELSE d.outcome END,
           CASE WHEN d.missing OR d.stale THEN NULL
                WHEN d.outcome = 'success' THEN 'delivered'
                WHEN d.outcome = 'neutral' OR d.tries >= max_attempts THEN 'failed'
                ELSE 'pending' END,
           d.tries, d.http,
           greatest(coalesce(d.cooldown_seconds, 0),
                    CASE WHEN d.outcome = 'failure' THEN @extschema@.retry_backoff(d.tries)
                         ELSE 0 END),
           d.slot, d.cap
    FROM d
    ORDER BY d.o;
END $$;

-- record_deliveries: what came back for a whole batch, in one call
-- (event_ids[i] answered http_statuses[i], and so on; the optional arrays
-- NULL, or as long, their elements NULL where there is nothing to say;
-- sent NULL: true).  http_status NULL means no response (timeout, reset,
-- refused); sent false means the request never left (could not connect):
-- then the attempt does not count.  Pass claimed_leases, the lease_until
-- claim_events returned with each event, and sent_ats, when each request
-- left (on the database's clock): a 429 then lowers the endpoint's rate
-- only if the request was sent after its last throttle episode, however
-- late its answer is recorded.  Call it once the requests are over, in a
-- transaction of its own: it takes its locks in the claim's order by
-- itself.  Returns each event's outcome, in the order given.  Errors
-- (record_check) change nothing.
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
    ev record;
    d  record;
BEGIN
    PERFORM @extschema@.record_check(event_ids, http_statuses, claimed_leases, retry_afters,
                                     headers, sent, sent_ats, max_attempts);
    -- the batch's events, in id order, as claims and other batches lock them
    PERFORM FROM @extschema@.webhook_events w WHERE w.id = ANY (event_ids) ORDER BY w.id FOR UPDATE;
    SELECT array_agg(e.endpoint ORDER BY u.o) AS endpoints, array_agg(e.status ORDER BY u.o) AS statuses,
           array_agg(e.lease_until ORDER BY u.o) AS leases, array_agg(e.attempts ORDER BY u.o) AS attempts,
           array_agg(e.slot ORDER BY u.o) AS slots, array_agg(e.inflight_key ORDER BY u.o) AS caps
    INTO ev
    FROM unnest(event_ids) WITH ORDINALITY AS u(id, o)
    LEFT JOIN @extschema@.webhook_events e ON e.id = u.id;

    SELECT array_agg(x.id ORDER BY x.o) AS id, array_agg(x.outcome ORDER BY x.o) AS outcome,
           array_agg(x.state ORDER BY x.o) AS state, array_agg(x.tries ORDER BY x.o) AS tries,
           array_agg(x.http ORDER BY x.o) AS http, array_agg(x.wait ORDER BY x.o) AS wait,
           array_agg(x.slot ORDER BY x.o) AS slot, array_agg(x.cap ORDER BY x.o) AS cap
    INTO d
    FROM @extschema@.record_decide(event_ids, http_statuses, claimed_leases, retry_afters,
                                   headers, sent, sent_ats, max_attempts, ev.endpoints,
                                   ev.statuses, ev.leases, ev.attempts, ev.slots, ev.caps) x;

    -- the requests are over: their slots are free
    PERFORM ratebucket.inflight_release(x.cap, array_agg(x.slot))
    FROM unnest(d.state, d.slot, d.cap) AS x(state, slot, cap)
    WHERE x.state IS NOT NULL AND x.slot IS NOT NULL
    GROUP BY x.cap;

    UPDATE @extschema@.webhook_events e
    SET status = x.state, attempts = x.tries, last_status = x.http,
        delivered_at = CASE WHEN x.state = 'delivered' THEN clock_timestamp() ELSE e.delivered_at END,
        next_attempt_at = CASE WHEN x.state = 'pending'
                               THEN clock_timestamp() + make_interval(secs => x.wait)
                               ELSE e.next_attempt_at END,
        lease_until = NULL, slot = NULL,
        -- a cooldown is its bucket's (unpark brings it back early); a
        -- backoff is its own
        parked = x.state = 'pending' AND x.outcome <> 'failure'
    FROM unnest(d.id, d.state, d.tries, d.http, d.wait, d.outcome) AS x(id, state, tries, http, wait, outcome)
    WHERE e.id = x.id AND x.state IS NOT NULL;

    RETURN QUERY SELECT x.id, x.outcome FROM unnest(d.id, d.outcome) AS x(id, outcome);
END $$;

-- record_delivery: record_deliveries for one event.  claimed_lease NULL
-- (not recommended) stands for the lease the event holds when it is read
-- here; sent NULL, as false, does not count the attempt.
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
BEGIN
    IF claimed_lease IS NULL THEN
        claimed_lease := coalesce((SELECT e.lease_until FROM @extschema@.webhook_events e
                                   WHERE e.id = event_id), '-infinity');
    END IF;
    RETURN (SELECT r.outcome
            FROM @extschema@.record_deliveries(ARRAY[event_id], ARRAY[http_status],
                                               ARRAY[claimed_lease], ARRAY[retry_after],
                                               ARRAY[headers], ARRAY[coalesce(sent, false)],
                                               ARRAY[sent_at], max_attempts) r);
END $$;

-- record_endpoint: what came back for claimed events of one endpoint, in
-- one call, recorded as record_deliveries records a batch (the same
-- arguments, the endpoint first; see "Recording"), each statement naming
-- the endpoint, so that on Citus it runs on the endpoint's node.  An id
-- that is not an event of this endpoint is 'missing'.  Refused, nothing
-- changed, as record_deliveries refuses them, and a NULL endpoint.  A bare
-- SELECT * FROM record_endpoint(...) runs on the endpoint's node.
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

COMMENT ON FUNCTION record_delivery(bigint, int, text, jsonb, boolean, int, timestamptz, timestamptz) IS
'Record the outcome of one claimed event: record_deliveries for a batch of one. The answer goes to ratebucket.bucket_observe_batch; the event is delivered on 2xx, pending again after the cooldown or a backoff on 429, 503 or a failure (up to max_attempts), failed on other statuses. Returns the outcome, or stale or missing.';
COMMENT ON FUNCTION record_check(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'The checks of a batch''s outcomes, before anything is locked (record_deliveries, record_endpoint): raises 22004 or 22023.';
COMMENT ON FUNCTION record_decide(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int, text[], text[], timestamptz[], int[], bigint[], text[]) IS
'What a batch''s answers make of its events, locked by the caller: every answer observed in one ratebucket.bucket_observe_batch, then per answer its outcome and, for an event still this claim''s, its new status, attempts and delay (record_deliveries, record_endpoint).';
