-- ratebucket_queue 1.1 -> 1.2: endpoints configured by ratebucket's
-- templates.  An endpoint that a template matches is no longer 'not
-- configured' in the explanations (its first claim configures it), and
-- endpoint_status shows what configures each endpoint with events, and which
-- have nothing that does.  Needs ratebucket 1.6, which has the templates.

\echo Use "ALTER EXTENSION ratebucket_queue UPDATE TO '1.2'" to load this file. \quit

DO $$
BEGIN
    IF to_regprocedure('ratebucket.bucket_template_for(text)') IS NULL THEN
        RAISE EXCEPTION 'ratebucket_queue 1.2 needs ratebucket 1.6 or later'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run ALTER EXTENSION ratebucket UPDATE first.';
    END IF;
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
SET search_path = pg_catalog, @extschema@, pg_temp
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
                format('%s tokens now, refilling at %s/s', round(b.tokens::numeric, 3),
                       round(b.effective_rate::numeric, 3));
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
      FROM webhook_events e
      WHERE e.status IN ('pending', 'sending')
      GROUP BY e.endpoint) q
LEFT JOIN ratebucket.buckets b ON b.endpoint = q.endpoint;

COMMENT ON VIEW endpoint_status IS
'One row per endpoint with events pending or in flight: pending, due, parked, in_flight, next_due_at, and what configures its bucket (own, template, or none: its events wait until something does) and the template.';
