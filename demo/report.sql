-- demo/report.sql — what the destinations saw, and whether the limits held.
--
-- Run by demo/scenario after the delivery, on the tables it leaves behind:
-- demo_endpoints (configured and true limits), demo_limits (the limits
-- endpoints share), webhook_events (the queue),
-- sim_requests (every request the destination simulator received, from its
-- own log: t_us from its start, endpoint name, event id, attempt, status)
-- and ratebucket.bucket_status.  Prints the per-endpoint table and the
-- summary, and leaves the checks in demo_checks (the end-to-end test reads
-- them too).

-- Jitter allowed between a grant and the request's arrival: the dispatcher
-- sends a claimed batch concurrently right after the claim, so arrivals of
-- one bucket's grants can bunch up by the spread of that sending.  Arrivals
-- over any window T may then exceed rate*T + capacity by at most rate*J.
\set jitter 0.25
-- Endpoints configured above their true limit must stop drawing 429s this
-- long after their first request.
\set converge 20

CREATE TEMP VIEW seen AS
SELECT d.name, d.url, d.rate, d.capacity, d.true_rate, d.true_burst, r.t_us, r.event_id, r.status
FROM sim_requests r JOIN demo_endpoints d ON d.name = r.endpoint;

-- Per endpoint: the worst excess of arrivals over rate*T, over every window
-- between two arrivals: max over i < j of (j - i) - rate*(t_j - t_i).
CREATE TEMP TABLE excess AS
WITH n AS (
    SELECT name, rate, t_us / 1e6 AS t,
           row_number() OVER (PARTITION BY name ORDER BY t_us) AS k
    FROM seen),
d AS (
    SELECT name, k - rate * t AS hi,
           max(rate * t - k) OVER (PARTITION BY name ORDER BY t, k
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lo
    FROM n)
SELECT name, coalesce(max(hi + lo), 0) + 1 AS excess   -- +1: count both ends of the window
FROM d GROUP BY name;

CREATE TEMP TABLE per_endpoint AS
SELECT d.name, d.rate, d.capacity, d.true_rate, d.note, d.events,
       count(s.*) AS requests,
       count(s.*) FILTER (WHERE s.status BETWEEN 200 AND 299) AS ok,
       count(s.*) FILTER (WHERE s.status = 429) AS throttled,
       count(s.*) FILTER (WHERE s.status >= 500) AS errors,
       (max(s.t_us) FILTER (WHERE s.status BETWEEN 200 AND 299) -
        min(s.t_us) FILTER (WHERE s.status BETWEEN 200 AND 299)) / 1e6 AS span,
       (max(s.t_us) FILTER (WHERE s.status = 429) - min(s.t_us)) / 1e6 AS last_429_after,
       b.cooldowns, b.breaker_opens, b.effective_rate,
       coalesce(x.excess, 0) AS excess
FROM demo_endpoints d
LEFT JOIN seen s ON s.name = d.name
LEFT JOIN ratebucket.bucket_status b ON b.endpoint = d.url
LEFT JOIN excess x ON x.name = d.name
GROUP BY d.name, d.rate, d.capacity, d.true_rate, d.note, d.events,
         b.cooldowns, b.breaker_opens, b.effective_rate, x.excess;

\echo
\echo '==> What each destination saw (from the simulator''s own log)'
SELECT name AS endpoint,
       rate AS "configured/s",
       true_rate AS "true limit/s",
       CASE WHEN span > 0 THEN round((ok - 1) / span, 1) END AS "delivered/s",
       requests,
       throttled AS "429s",
       errors AS "5xx",
       cooldowns,
       breaker_opens AS "breaker trips",
       round(effective_rate::numeric, 1) AS "effective rate now",
       note
FROM per_endpoint ORDER BY rate DESC;

-- The shared limits: what the destinations behind each saw together.  Each
-- request took one token from every limit of its endpoint.
CREATE TEMP VIEW seen_by_limit AS
SELECT l.key, l.rate, l.capacity, l.quota, s.t_us, s.status
FROM demo_limits l JOIN seen s ON s.name = ANY (l.endpoints);

CREATE TEMP TABLE limit_excess AS
WITH n AS (
    SELECT key, rate, t_us / 1e6 AS t,
           row_number() OVER (PARTITION BY key ORDER BY t_us) AS k
    FROM seen_by_limit WHERE rate IS NOT NULL),
d AS (
    SELECT key, k - rate * t AS hi,
           max(rate * t - k) OVER (PARTITION BY key ORDER BY t, k
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lo
    FROM n)
SELECT key, coalesce(max(hi + lo), 0) + 1 AS excess
FROM d GROUP BY key;

-- Events a spent quota holds back: pending, due at (or after) its reset.
CREATE TEMP VIEW held AS
SELECT l.key, e.id
FROM demo_limits l
JOIN ratebucket.bucket_status b ON b.endpoint = l.key
JOIN webhook_events e ON e.limits @> ARRAY[l.key]
WHERE l.quota IS NOT NULL AND e.status = 'pending'
  AND e.next_attempt_at >= b.quota_resets_at - interval '1 second';

CREATE TEMP TABLE per_limit AS
SELECT l.key, l.rate, l.capacity, l.quota, l.endpoints, l.note,
       (SELECT count(*) FROM seen_by_limit s WHERE s.key = l.key) AS requests,
       (SELECT count(*) FROM seen_by_limit s
        WHERE s.key = l.key AND s.status BETWEEN 200 AND 299) AS ok,
       (SELECT (max(s.t_us) - min(s.t_us)) / 1e6 FROM seen_by_limit s
        WHERE s.key = l.key AND s.status BETWEEN 200 AND 299) AS span,
       (SELECT count(*) FROM held h WHERE h.key = l.key) AS held,
       coalesce(x.excess, 0) AS excess,
       b.quota_used, b.quota_resets_at,
       -- the quota windows (UTC days) the run touched: 2 if it crossed midnight
       (SELECT count(DISTINCT date_trunc('day', t, 'UTC'))
        FROM demo_run r, LATERAL (VALUES (r.started), (r.finished)) v(t)) AS windows
FROM demo_limits l
LEFT JOIN limit_excess x ON x.key = l.key
LEFT JOIN ratebucket.bucket_status b ON b.endpoint = l.key;

\echo
\echo '==> What the endpoints behind each shared limit saw together'
SELECT key AS "shared limit",
       coalesce(rate || '/s', quota || ' a day') AS "limit",
       array_to_string(endpoints, ', ') AS endpoints,
       CASE WHEN span > 0 THEN round((ok - 1) / span, 1) END AS "delivered/s",
       requests,
       held AS "held for tomorrow",
       note
FROM per_limit ORDER BY key DESC;

-- The checks.  Each row: what must hold, whether it did, and the figures.
CREATE TABLE demo_checks (n int, name text, ok boolean, detail text);

INSERT INTO demo_checks
SELECT 1, 'every event delivered, but those a spent quota holds for tomorrow',
       count(*) FILTER (WHERE status = 'delivered') + (SELECT count(*) FROM held) = count(*),
       format('enqueued %s, delivered %s, held by the quota %s, failed %s, left %s', count(*),
              count(*) FILTER (WHERE status = 'delivered'),
              (SELECT count(*) FROM held),
              count(*) FILTER (WHERE status = 'failed'),
              count(*) FILTER (WHERE status IN ('pending', 'sending')) - (SELECT count(*) FROM held))
FROM webhook_events;

INSERT INTO demo_checks
SELECT 2, 'no event delivered twice', count(*) = 0,
       format('%s events got more than one 2xx', count(*))
FROM (SELECT event_id FROM sim_requests WHERE status BETWEEN 200 AND 299
      GROUP BY event_id HAVING count(*) > 1) dup;

INSERT INTO demo_checks
SELECT 3, 'attempts = requests the destinations received',
       (SELECT sum(attempts) FROM webhook_events) = count(*),
       format('attempts %s, requests received %s (a refusal by a bucket is never an attempt)',
              (SELECT sum(attempts) FROM webhook_events), count(*))
FROM sim_requests WHERE event_id IS NOT NULL;

INSERT INTO demo_checks
SELECT 4, 'no 429 where the true limit is at or above the configured one',
       coalesce(sum(p.throttled), 0) = 0,
       format('%s 429s at %s such endpoints', coalesce(sum(p.throttled), 0), count(*))
FROM per_endpoint p JOIN demo_endpoints d USING (name)
WHERE d.true_rate >= d.rate AND d.true_burst >= d.capacity;

INSERT INTO demo_checks
SELECT 5, 'arrivals within rate*T + capacity (+ rate*' || :jitter || ' s of sending jitter)',
       bool_and(excess <= capacity + rate * :jitter),
       string_agg(format($$%s %s/%s$$, name, round(excess::numeric, 1), round((capacity + rate * :jitter)::numeric, 1)), ', ' ORDER BY name)
FROM per_endpoint;

INSERT INTO demo_checks
SELECT 6, 'configured above their limit: 429s stop within ' || :converge || ' s, rate ends at or below it',
       bool_and(coalesce(last_429_after, 0) <= :converge AND effective_rate <= true_rate),
       string_agg(format('%s: last 429 at %s s, %s/s (limit %s)', name,
                         coalesce(round(last_429_after::numeric, 1), 0),
                         round(effective_rate::numeric, 1), true_rate), '; ' ORDER BY name)
FROM per_endpoint WHERE true_rate < rate;

INSERT INTO demo_checks
SELECT 7, 'the unreachable endpoint tripped its breaker and then delivered everything',
       breaker_opens >= 1 AND ok = events,
       format('breaker trips %s, delivered %s of %s', breaker_opens, ok, events)
FROM per_endpoint WHERE name = 'down';

INSERT INTO demo_checks
SELECT 8, 'shared account: its endpoints together within rate*T + capacity (+ jitter)',
       bool_and(excess <= capacity + rate * :jitter),
       string_agg(format('%s %s/%s over %s', key, round(excess::numeric, 1),
                         round((capacity + rate * :jitter)::numeric, 1),
                         array_to_string(endpoints, '+')), ', ' ORDER BY key)
FROM per_limit WHERE rate IS NOT NULL;

INSERT INTO demo_checks
SELECT 9, 'daily quota: never more requests than it allows, and it ran out',
       bool_and(requests <= quota * windows AND (held > 0 OR windows > 1)),
       string_agg(format('%s: %s requests for a quota of %s, %s events held for its reset at %s',
                         key, requests, quota, held,
                         to_char(quota_resets_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"')),
                  '; ' ORDER BY key)
FROM per_limit WHERE quota IS NOT NULL;

\echo
SELECT format('enqueued %s = delivered %s + held by the quota %s · duplicates %s · attempts spent on refusals %s · 429s %s · %s s',
              (SELECT count(*) FROM webhook_events),
              (SELECT count(*) FROM webhook_events WHERE status = 'delivered'),
              (SELECT count(*) FROM held),
              (SELECT count(*) FROM (SELECT event_id FROM sim_requests
                                     WHERE status BETWEEN 200 AND 299
                                     GROUP BY event_id HAVING count(*) > 1) x),
              (SELECT sum(attempts) FROM webhook_events) -
                (SELECT count(*) FROM sim_requests WHERE event_id IS NOT NULL),
              (SELECT count(*) FROM sim_requests WHERE status = 429),
              (SELECT round(extract(epoch FROM finished - started)::numeric, 1) FROM demo_run))
       AS summary \gset
\echo :summary

\echo
\echo '==> Checks'
SELECT CASE WHEN ok THEN 'ok  ' ELSE 'FAIL' END AS " ", name AS check, detail
FROM demo_checks ORDER BY n;
