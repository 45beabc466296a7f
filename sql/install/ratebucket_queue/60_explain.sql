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
CREATE FUNCTION explain_keys(keys text[], cap_key text, now_ timestamptz)
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
CREATE FUNCTION explain_event(event_id bigint)
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
CREATE FUNCTION explain_endpoint(endpoint text)
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

-- event_waits: explain_event for every event pending or in flight.  Filter
-- it (WHERE endpoint = ..., or event_id = ...): over a whole backlog it
-- calls explain_event once per event.
CREATE VIEW event_waits AS
SELECT e.id AS event_id, e.endpoint, x.reason, x.key, x.until, x.detail
FROM @extschema@.webhook_events e
CROSS JOIN LATERAL @extschema@.explain_event(e.id) x
WHERE e.status IN ('pending', 'sending');

-- endpoint_status: one row per endpoint with events pending or in flight:
-- how many, how many due now, parked, in flight, when its next pending
-- event comes due, and what configures its bucket: 'own' (bucket_configure
-- or bucket_configure_quota), 'template' (it follows a template, or one
-- matches it and configures it at its first claim), or 'none': nothing
-- does, and its events wait until something does.  The view to open first
-- when events wait; explain_endpoint says why in detail.
CREATE VIEW endpoint_status AS
SELECT q.endpoint, q.pending, q.due, q.parked, q.in_flight, q.next_due_at,
       CASE WHEN b.conf_rate IS NOT NULL AND b.template IS NULL THEN 'own'
            WHEN b.template IS NOT NULL
                 OR ratebucket.bucket_template_for(q.endpoint) IS NOT NULL THEN 'template'
            ELSE 'none' END AS configuration,
       CASE WHEN b.template IS NOT NULL THEN b.template
            WHEN b.conf_rate IS NULL THEN ratebucket.bucket_template_for(q.endpoint) END
           AS template
FROM (SELECT e.endpoint,
             count(*) FILTER (WHERE e.status = 'pending') AS pending,
             count(*) FILTER (WHERE e.status = 'pending'
                                    AND e.next_attempt_at <= clock_timestamp()) AS due,
             count(*) FILTER (WHERE e.status = 'pending' AND e.parked
                                    AND e.next_attempt_at > clock_timestamp()) AS parked,
             count(*) FILTER (WHERE e.status = 'sending') AS in_flight,
             min(e.next_attempt_at) FILTER (WHERE e.status = 'pending') AS next_due_at
      FROM @extschema@.webhook_events e
      WHERE e.status IN ('pending', 'sending')
      GROUP BY e.endpoint) q
LEFT JOIN ratebucket.buckets b ON b.endpoint = q.endpoint;
