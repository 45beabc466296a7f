-- ratebucket_queue: a delivery queue and its rate-limited claim, on
-- ratebucket.  The current surface: the install script of the current
-- version is a copy of this file (Makefile).  CREATE EXTENSION
-- ratebucket_queue [SCHEMA s] creates, in the schema chosen then:
--
--   webhook_events          the queue: one row per event to deliver
--   webhook_parking         where each throttled endpoint's parked events end
--   claim_events(...)       claim a batch: only events whose endpoint (and
--                           every other limit of theirs) has a token, tokens
--                           and slots spent only on events locked here
--   record_delivery(...)    the outcome of one request: the event's status,
--                           its next attempt, bucket_observe, its slot freed
--   record_deliveries(...)  the same for a whole batch, its locks in order
--   next_due()              seconds until a claim could find something
--   requeue_expired()       give back the events of workers that died (and
--                           forget old parking cursors)
--   events_left(...)        events pending or in flight
--   explain_event(id)       why an event waits, and until when
--   explain_endpoint(ep)    the same for an endpoint's events
--   event_waits             explain_event for every event pending or in flight
--   endpoint_status         per endpoint with events: counts, and what
--                           configures it (none: its events wait)
--   unpark(ep)              bring an endpoint's parked events back at its pace
--                           now (claims do it by themselves within a second)
--
-- Every function runs with search_path = pg_catalog, pg_temp, whatever the
-- caller's, and names every object of this extension (@extschema@.) and of
-- ratebucket (ratebucket.) by its schema: a function or an operator that
-- anyone planted in the extension's schema, or anywhere else, is never
-- taken for the one meant, even where it would match a call's arguments
-- better (an overload with exact types over a built-in's polymorphic or
-- implicitly cast ones).  Each endpoint is configured with
-- ratebucket.bucket_configure, or by a template (ratebucket.bucket_template)
-- that matches it, before its events are claimed (and so is each bucket an
-- event names in "limits"; its in-flight cap by inflight_configure).  Here
-- the endpoint is the destination's URL; key it however your buckets are
-- keyed.
--
-- The life of an event:
--
--   pending --claim--> sending --2xx--> delivered
--      ^                  |
--      +---- retry -------+---- permanent failure, or too many attempts --> failed
--
-- "attempts" counts requests that actually left.  A claim refused a token
-- does not touch it; a request that never connected does not count.

\echo Use "CREATE EXTENSION ratebucket_queue" to load this file. \quit

-- ratebucket 1.10 or later: the recording observes a batch with
-- ratebucket.bucket_observe_batch.
DO $$
BEGIN
    IF (SELECT string_to_array(extversion, '.')::int[] < ARRAY[1, 10]
        FROM pg_catalog.pg_extension WHERE extname = 'ratebucket') THEN
        RAISE EXCEPTION 'ratebucket_queue needs ratebucket 1.10 or later'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run ALTER EXTENSION ratebucket UPDATE first.';
    END IF;
END $$;

CREATE TABLE webhook_events (
    id              bigserial PRIMARY KEY,
    endpoint        text NOT NULL
                    CHECK (octet_length(endpoint) BETWEEN 1 AND 1024),   -- a bucket key
    priority        int NOT NULL DEFAULT 0,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sending', 'delivered', 'failed')),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        int NOT NULL DEFAULT 0,
    lease_until     timestamptz,        -- while sending: when the claim expires
    last_status     int,                -- the last HTTP status (NULL: no response)
    delivered_at    timestamptz,
    payload         jsonb NOT NULL DEFAULT '{}',
    -- The limits a send of this event answers to besides its endpoint's:
    limits          text[] NOT NULL DEFAULT '{}',   -- other buckets every send takes
                    -- a token from (its account's rate, a lane, a daily quota),
                    -- each configured, none the endpoint itself
    inflight_key    text,               -- an in-flight cap (inflight_configure)
                    -- a send holds a slot of, from its claim to its outcome
    slot            bigint,             -- while sending: the slot it holds
    parked          boolean NOT NULL DEFAULT false
                    -- pending, due when its buckets said they would have a
                    -- token (claim_events parked it, or a 429 or a 503 put it
                    -- off by its cooldown): brought back early if they have
                    -- one sooner (unpark), unlike a retry's backoff
);

-- The queue order, to find the best due events.  Partial: only pending
-- events, so the index stays as small as the backlog.
CREATE INDEX webhook_events_queue
    ON webhook_events (priority DESC, next_attempt_at) WHERE status = 'pending';
-- One endpoint's due events in the same order, for the per-endpoint lock.
CREATE INDEX webhook_events_endpoint
    ON webhook_events (endpoint, priority DESC, next_attempt_at) WHERE status = 'pending';
-- Leases to reclaim.
CREATE INDEX webhook_events_leases
    ON webhook_events (lease_until) WHERE status = 'sending';

-- Where the parked events of each endpoint end (claim_events, step 6): a
-- claim parks a few of a throttled endpoint's events at a time, and each
-- chunk goes after the previous one instead of starting again at the next
-- token.  One row per endpoint ever parked; requeue_expired deletes the rows
-- of endpoints whose parked events all came due more than an hour ago.
CREATE TABLE webhook_parking (
    endpoint     text PRIMARY KEY,
    parked_from  timestamptz NOT NULL,  -- the due time of the last chunk's first
    parked_until timestamptz NOT NULL,  -- and of its last: where the next one goes
    rate         float8,                -- the pace they were parked at (NULL: none)
    parked       bigint NOT NULL,       -- how many the last chunk held
    limits       text[] NOT NULL DEFAULT '{}',  -- the limits of the last chunk's events
    recheck_at   timestamptz,           -- events parked more than 2 s ahead: when
                                        -- a claim next asks whether their buckets
                                        -- could send them sooner (unpark)
    look_from    timestamptz NOT NULL DEFAULT now()
                                        -- when the claims' walk next looks for
                                        -- the endpoint's due events here: the
                                        -- cursors whose time has come, the
                                        -- earliest first, a few per claim
                                        -- (claim_events, step 1)
);
-- The cursors to look at again, soonest first.
CREATE INDEX webhook_parking_recheck
    ON webhook_parking (recheck_at) WHERE recheck_at IS NOT NULL;
-- The cursors the walk looks at, in turn.
CREATE INDEX webhook_parking_look ON webhook_parking (look_from);

-- The queue's rows are the user's data: pg_dump dumps them (and the id
-- sequence's position) with the extension's objects.
SELECT pg_catalog.pg_extension_config_dump('webhook_events', '');
SELECT pg_catalog.pg_extension_config_dump('webhook_events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('webhook_parking', '');

-- Sleeping workers wake up when events arrive (LISTEN webhook_events).
CREATE FUNCTION webhook_events_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NOTIFY webhook_events;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_events_notify
    AFTER INSERT ON webhook_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_notify();
