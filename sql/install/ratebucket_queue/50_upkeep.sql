-- next_due: seconds until a claim could find something (0: now; NULL:
-- nothing pending).  For each endpoint (and set of limits) with pending
-- events, the latest of its first due event, its bucket's next token and
-- each of its limits' (ratebucket.bucket_wait, lock-free): a worker with
-- nothing to claim sleeps that long, or until NOTIFY webhook_events says
-- events arrived.  (A full in-flight cap has no such time: its slots free
-- when outcomes are recorded.)
CREATE FUNCTION next_due() RETURNS float8
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
CREATE FUNCTION requeue_expired() RETURNS bigint
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
CREATE FUNCTION events_left(before timestamptz DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- (PL/pgSQL: Citus plans no SQL function with parameters)
    RETURN (SELECT count(*) FROM @extschema@.webhook_events
            WHERE status = 'sending'
               OR (status = 'pending' AND (before IS NULL OR next_attempt_at < before)));
END $$;
