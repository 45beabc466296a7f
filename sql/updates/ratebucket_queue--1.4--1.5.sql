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
