-- bench/by_endpoint.sql: an experiment measured by bench/run-claim, NOT the recipe.
--
-- The question it answers: can a claim that reads a row per endpoint (the
-- highest priority and the earliest due time of its pending events, and when
-- its tokens come back) instead of the events reach the issue's first goal, (b) >= 0.8 x a plain
-- SKIP LOCKED claim, where ratebucket_queue's claim_events, which walks the
-- events and parks the throttled ones, does not?  A throttled endpoint costs
-- one write of its row here, none per event; the producers pay instead, by
-- keeping the rows up to date (the triggers below), and bench/run-claim
-- measures that too.
--
-- Loaded after CREATE EXTENSION ratebucket_queue, on the same webhook_events.  What it leaves
-- out, so that none of it is used for real: events with limits or an
-- in-flight cap (never locked here), endpoints without a configuration
-- (bucket_take_batch refuses them, the claim fails), the set-aside step,
-- next_due(), and the order of locks against record_delivery (which would
-- have to update its events, and so their endpoint rows, before it locks
-- buckets).  What it cannot help: producers that insert for several
-- endpoints in several statements of one transaction can deadlock with each
-- other (each statement locks its endpoints in key order, nothing orders
-- them across statements), and the order across endpoints is approximate
-- (an endpoint sorts by its highest priority and its earliest due time,
-- which may belong to different events).
-- What taking it into ratebucket_queue would involve is in bench/README.md
-- ("What would change it", 6).

-- One row per endpoint that has, or had, pending events: priority, the
-- highest of its pending events' priorities, and due, the earliest of their
-- due times, each a bound (never below the highest, never after the
-- earliest; the claim corrects them when it visits); due 'infinity' when it
-- has none.  Kept apart, not as the position of its best event in queue
-- order: a higher-priority event due later (a retry with backoff) would then
-- hide the lower-priority events already due behind it.  ready_at: not
-- before then (the endpoint's tokens come back).
CREATE TABLE webhook_endpoints (
    endpoint text PRIMARY KEY,
    priority int NOT NULL,
    due      timestamptz NOT NULL,
    ready_at timestamptz
);
-- The endpoints in queue order; a throttled one sorts at its ready time, so
-- a claim reads its row again only when its tokens are back.
CREATE INDEX webhook_endpoints_order
    ON webhook_endpoints (priority DESC, greatest(due, ready_at));
-- The claim reads an endpoint's earliest pending event through this one
-- (webhook_events_endpoint leads with the priority).  bench/run-claim builds
-- it for the by-endpoint runs only, and drops it for the others.
CREATE INDEX webhook_events_endpoint_due
    ON webhook_events (endpoint, next_attempt_at) WHERE status = 'pending';

-- A claim holds its endpoints with transaction-level advisory locks (class
-- hashtext('webhook_endpoints'), key hashtext(endpoint)), tried and never
-- waited for: no row lock, so no write, for the hold.  A producer takes the
-- same lock, waiting, before it moves an endpoint's row: it waits for a claim
-- that holds the endpoint (which may move the row forward, by what its
-- snapshot sees) and moves it back up after; claims pass over an endpoint a
-- producer holds until the producer commits.

-- Producers: new pending events move their endpoints' rows up (or create
-- them).  One statement per INSERT statement, whatever its rows, endpoints
-- locked in key order.
CREATE FUNCTION webhook_endpoints_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('webhook_endpoints'), hashtext(d.endpoint))
    FROM (SELECT DISTINCT n.endpoint FROM new_events n
          WHERE n.status = 'pending' ORDER BY n.endpoint) d;
    INSERT INTO webhook_endpoints AS w (endpoint, priority, due)
    SELECT n.endpoint, max(n.priority), min(n.next_attempt_at)
    FROM new_events n
    WHERE n.status = 'pending'
    GROUP BY n.endpoint
    ORDER BY n.endpoint
    ON CONFLICT (endpoint) DO UPDATE
    SET priority = CASE WHEN w.due = 'infinity' THEN excluded.priority
                        ELSE greatest(w.priority, excluded.priority) END,
        due = least(w.due, excluded.due)
    WHERE w.due = 'infinity' OR excluded.priority > w.priority OR excluded.due < w.due;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_endpoints_insert
    AFTER INSERT ON webhook_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_endpoints_insert();

-- An event back to pending, or moved earlier (a retry, a lease given back,
-- a manual requeue): the same, one row.  The claim's own updates (to
-- 'sending') do not fire it.
CREATE FUNCTION webhook_endpoints_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('webhook_endpoints'), hashtext(NEW.endpoint));
    INSERT INTO webhook_endpoints AS w (endpoint, priority, due)
    VALUES (NEW.endpoint, NEW.priority, NEW.next_attempt_at)
    ON CONFLICT (endpoint) DO UPDATE
    SET priority = CASE WHEN w.due = 'infinity' THEN excluded.priority
                        ELSE greatest(w.priority, excluded.priority) END,
        due = least(w.due, excluded.due)
    WHERE w.due = 'infinity' OR excluded.priority > w.priority OR excluded.due < w.due;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_endpoints_update
    AFTER UPDATE OF status, priority, next_attempt_at, endpoint ON webhook_events
    FOR EACH ROW
    WHEN (NEW.status = 'pending'
          AND (OLD.status <> 'pending' OR NEW.endpoint <> OLD.endpoint
               OR NEW.priority > OLD.priority OR NEW.next_attempt_at < OLD.next_attempt_at))
    EXECUTE FUNCTION webhook_endpoints_update();

-- claim_by_endpoint: claim up to batch events, at most per_endpoint of any one
-- endpoint (events without limits or a cap only).  READ COMMITTED only.
--
-- 1. Hold the first batch / per_endpoint endpoints whose rows are due and
--    ready, in queue order, passing over endpoints other claims or producers
--    hold (the advisory lock above, tried on the rows in queue order, up to
--    the LIMIT: the condition cannot be pushed below the ordering into a
--    MATERIALIZED CTE, where a sort would try it on every due row): each
--    claim gets endpoints of its own, so claims never wait for each other's
--    buckets.
-- 2. In a second statement, whose snapshot is taken after those locks (so
--    it sees every event whose producer moved the row before; hence READ
--    COMMITTED, where each statement takes a new snapshot), lock up to
--    per_endpoint due events of each endpoint, best first, take tokens for
--    them in one bucket_take_batch, claim as many as were granted, and move
--    each row to the events not claimed (by this snapshot; a producer that
--    inserts meanwhile waits for the endpoint and moves the row back after):
--    their highest priority, their earliest due time, and its ready_at to
--    when the next token comes, if it ran out.  An endpoint that got no
--    token has its row written once, and is not read again until then; its
--    events are not touched.
CREATE FUNCTION claim_by_endpoint(batch int, per_endpoint int,
                                  lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, endpoint text, attempts int, payload jsonb, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    held text[];            -- the endpoints this claim holds
BEGIN
    IF batch IS NULL OR batch < 1 OR per_endpoint IS NULL OR per_endpoint < 1 THEN
        RAISE EXCEPTION 'batch and per_endpoint must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'claim_by_endpoint runs only under READ COMMITTED'
            USING ERRCODE = 'feature_not_supported';
    END IF;

    WITH o AS MATERIALIZED (    -- read lazily, as far as the LIMIT asks
        SELECT w.endpoint
        FROM webhook_endpoints w
        WHERE greatest(w.due, w.ready_at) <= now()
        ORDER BY w.priority DESC, greatest(w.due, w.ready_at)
    )
    SELECT array_agg(h.endpoint) INTO held
    FROM (SELECT o.endpoint
          FROM o
          WHERE pg_try_advisory_xact_lock(hashtext('webhook_endpoints'), hashtext(o.endpoint))
          LIMIT ceil(batch::float8 / per_endpoint)::int) h;
    IF held IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH locked AS MATERIALIZED (
        SELECT x.id, u.endpoint, x.k
        FROM unnest(held) AS u(endpoint)
        CROSS JOIN LATERAL (
            SELECT y.id, row_number() OVER (ORDER BY y.priority DESC, y.next_attempt_at, y.id) AS k
            FROM (SELECT e.id, e.priority, e.next_attempt_at
                  FROM webhook_events e
                  WHERE e.endpoint = u.endpoint
                    AND e.status = 'pending' AND e.next_attempt_at <= now()
                    AND CASE WHEN e.limits = '{}' AND e.inflight_key IS NULL
                             THEN true ELSE false END
                  ORDER BY e.priority DESC, e.next_attempt_at
                  LIMIT per_endpoint
                  FOR UPDATE SKIP LOCKED) y) x
    ), requests AS MATERIALIZED (
        SELECT l.endpoint, count(*)::int AS n, row_number() OVER (ORDER BY l.endpoint) AS req
        FROM locked l
        GROUP BY l.endpoint
    ), taken AS MATERIALIZED (
        SELECT r.endpoint, t.granted, t.wait_seconds
        FROM ratebucket.bucket_take_batch((
                 SELECT array_agg(ROW(ARRAY[r2.endpoint], r2.n, NULL)::ratebucket.batch_request
                                  ORDER BY r2.req)
                 FROM requests r2)) t
        JOIN requests r ON r.req = t.request
    ), claimed AS MATERIALIZED (
        SELECT l.id, l.endpoint
        FROM locked l
        JOIN taken t ON t.endpoint = l.endpoint
        WHERE l.k <= t.granted
    ), moved AS (
        UPDATE webhook_endpoints w
        SET priority = coalesce(top.priority, w.priority),
            due = coalesce(first.next_attempt_at, 'infinity'),
            ready_at = CASE WHEN t.wait_seconds > 0 THEN
                           now() + make_interval(secs => least(t.wait_seconds, 366 * 86400.0))
                       END
        FROM unnest(held) AS u(endpoint)
        LEFT JOIN taken t ON t.endpoint = u.endpoint
        CROSS JOIN LATERAL (       -- what this claim leaves pending
            SELECT coalesce(array_agg(c.id), '{}') AS ids
            FROM claimed c WHERE c.endpoint = u.endpoint) c
        LEFT JOIN LATERAL (
            SELECT e.priority
            FROM webhook_events e
            WHERE e.endpoint = u.endpoint AND e.status = 'pending' AND e.id <> ALL (c.ids)
            ORDER BY e.priority DESC, e.next_attempt_at
            LIMIT 1) top ON true
        LEFT JOIN LATERAL (
            SELECT e.next_attempt_at
            FROM webhook_events e
            WHERE e.endpoint = u.endpoint AND e.status = 'pending' AND e.id <> ALL (c.ids)
            ORDER BY e.next_attempt_at
            LIMIT 1) first ON true
        WHERE w.endpoint = u.endpoint
    )
    UPDATE webhook_events e
    SET status = 'sending', lease_until = now() + lease
    FROM claimed c
    WHERE e.id = c.id
    RETURNING e.id, e.endpoint, e.attempts, e.payload, e.lease_until;
END
$$;
