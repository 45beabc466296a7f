-- demo/report.sql — what the destinations saw, and whether the limits held.
--
-- Run by demo/scenario after the delivery, on the tables it leaves behind:
-- demo_endpoints (configured and true limits, and when a true limit
-- changes), demo_limits (the limits endpoints share), webhook_events (the
-- queue), demo_run (when the dispatcher and the simulator started),
-- sim_requests (every request the destination simulator received, from its
-- own log: t_us from its start, endpoint name, event id, attempt, status),
-- demo_claims (the dispatcher's claim log: for each request it sent, when
-- the claim that took its tokens was sent, on CLOCK_MONOTONIC),
-- demo_samples (ratebucket.bucket_status every 0.25 s during the delivery)
-- and ratebucket.bucket_status.  Prints the per-endpoint table and the
-- summary, and leaves the checks in demo_checks (the end-to-end test reads
-- them too).  Times are seconds on the simulator's clock (its start is 0,
-- just before the delivery's), the clock of its log and of its limits'
-- changes.

-- Endpoints configured above their true limit (a true rate below the
-- configured rate, or a true burst below the configured capacity, at any
-- time) must learn it, and then use it:
--   settle      seconds they may take to learn it, from their first request;
--   settle_change   and from each change of their limit: a lower limit is
--               found in steps of ratebucket.return_fraction (0.85) of the
--               rate, one per throttle episode, each a cooldown (1 s here)
--               and a return (ratebucket.return_time, 2 s) at least, so a
--               halving takes ceil(ln 0.5 / ln 0.85) = 5 episodes, about
--               15 s; a higher one is found by the climb, within about
--               one ratebucket.recovery_interval (20 s);
--   late_429    at most this fraction of their requests (of that phase's,
--               after a change) answered 429 once settled, or late_429_min
--               429s if that is more (a destination with few requests: a
--               single probe of its limit is more than 1 % of 100);
--   min_share   delivered (2xx arrivals per second) at least this x the true
--               limit, over the second half of their delivery (but
--               settle_change s after a change) and over each settled phase
--               after a change;
--               and their last event
--               delivered within the time their events take at min_share x
--               the true limit (as it changes), + settle;
--   final_lo, final_hi   their effective rate over the second half (median) within these x the
--               true limit of the end;
--   min_window  a settled phase shorter than this (seconds) cannot be
--               measured, and fails the check that needs it.
\set settle 10
\set settle_change 15
\set late_429 0.01
\set late_429_min 2
\set min_share 0.8
\set final_lo 0.8
\set final_hi 1.1
\set min_window 3

CREATE TEMP VIEW seen AS
SELECT d.name, d.url, d.rate, d.capacity, d.true_rate, d.true_burst, r.t_us, r.t_us / 1e6 AS t,
       r.event_id, r.status
FROM sim_requests r JOIN demo_endpoints d ON d.name = r.endpoint;

-- Each endpoint's true limit, phase by phase: phase 0 from the start, then
-- one per change, until the next (t_to NULL: the last, open-ended).
CREATE TEMP TABLE phases AS
SELECT d.name, p.k, p.t_from, lead(p.t_from) OVER (PARTITION BY d.name ORDER BY p.k) AS t_to,
       p.factor, d.true_rate * p.factor AS rate, d.true_burst * p.factor AS burst
FROM demo_endpoints d,
     LATERAL (SELECT 0::bigint AS k, 0::float8 AS t_from, 1::float8 AS factor
              UNION ALL
              SELECT c.k, c.t, c.f
              FROM unnest(d.change_at, d.change_factor) WITH ORDINALITY c(t, f, k)) p;

-- Configured above the true limit, at some time: the endpoints of checks 6-10.
CREATE TEMP VIEW above AS
SELECT d.name FROM demo_endpoints d
WHERE EXISTS (SELECT 1 FROM phases p
              WHERE p.name = d.name AND (p.rate < d.rate OR p.burst < d.capacity));

-- The true limit integrated over [a, b]: the requests it allows then
-- (bursts aside).
CREATE FUNCTION pg_temp.allowed(ep text, a float8, b float8) RETURNS float8
LANGUAGE sql STABLE AS $$
SELECT coalesce(sum(p.rate * greatest(0, least(b, coalesce(p.t_to, 'Infinity')) - greatest(a, p.t_from))), 0)
FROM phases p WHERE p.name = ep
$$;

-- When n requests are through, starting at t0 at share x the true limit as
-- it changes.
CREATE FUNCTION pg_temp.done_at(ep text, t0 float8, n float8, share float8) RETURNS float8
LANGUAGE sql STABLE AS $$
WITH p AS (
    SELECT greatest(p.t_from, t0) AS a, coalesce(p.t_to, 'Infinity') AS b, share * p.rate AS r
    FROM phases p
    WHERE p.name = ep AND coalesce(p.t_to, 'Infinity') > t0),
c AS (
    SELECT a, r, r * (b - a) AS here,
           coalesce(sum(r * (b - a)) OVER (ORDER BY a ROWS BETWEEN UNBOUNDED PRECEDING
                                                         AND 1 PRECEDING), 0) AS before
    FROM p)
SELECT min(a + (n - before) / r) FROM c WHERE before + here >= n
$$;

-- 2xx arrivals in [a, b] per second.
CREATE FUNCTION pg_temp.delivered_rate(ep text, a float8, b float8) RETURNS float8
LANGUAGE sql STABLE AS $$
SELECT CASE WHEN b > a THEN count(*) / (b - a) END
FROM seen s WHERE s.name = ep AND s.status BETWEEN 200 AND 299 AND s.t BETWEEN a AND b
$$;

-- ratebucket's samples on the simulator's clock.
CREATE TEMP VIEW samples AS
SELECT d.name, extract(epoch FROM s.t - r.sim_started)::float8 AS t, s.effective_rate,
       s.cooldown_seconds, s.breaker, s.breaker_seconds
FROM demo_samples s JOIN demo_endpoints d ON d.url = s.endpoint, demo_run r;

-- Gaps: the time between two consecutive requests at a destination while
-- it still had events to deliver (up to its last 2xx), and from the
-- dispatcher's start to its first request.  held_until: the end of the
-- latest cooldown or open breaker ratebucket showed for it from just before
-- the gap to its end (samples every 0.25 s), so that what is left of the
-- gap after it is what no cooldown or breaker explains.
CREATE TEMP TABLE gaps AS
WITH ends AS (
    SELECT name, max(t) FILTER (WHERE status BETWEEN 200 AND 299) AS last_ok FROM seen GROUP BY name),
g AS (
    SELECT s.name, lag(s.t) OVER (PARTITION BY s.name ORDER BY s.t_us) AS a, s.t AS b
    FROM seen s JOIN ends e ON e.name = s.name
    WHERE s.t <= e.last_ok
    UNION ALL
    SELECT s.name, extract(epoch FROM r.started - r.sim_started)::float8, min(s.t)
    FROM seen s, demo_run r GROUP BY s.name, r.started, r.sim_started)
SELECT g.name, g.a, g.b, g.b - g.a AS len,
       (SELECT max(m.t + greatest(m.cooldown_seconds,
                                  CASE WHEN m.breaker = 'open' THEN m.breaker_seconds ELSE 0 END))
        FROM samples m
        WHERE m.name = g.name AND m.t BETWEEN g.a - 0.3 AND g.b
          AND (m.cooldown_seconds > 0 OR m.breaker = 'open')) AS held_until
FROM g WHERE g.a IS NOT NULL AND g.b > g.a;

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

-- How long after its grant each request can have arrived.  The claim took
-- the request's tokens after the dispatcher sent it (demo_claims), and the
-- request arrived after the claim returned, so its grant lies between the
-- two: arrival - claim sent bounds the time from grant to arrival.  The
-- arrivals of a window T then come from grants of a window T + d at most,
-- d the longest such time among them: the limiter's rate*T + capacity
-- allows rate*(T + d) + capacity arrivals, which checks 5 and 12 hold them
-- to (d over every request of the endpoint, or of the shared limit).  A
-- request logged by the simulator but not by the dispatcher has no bound
-- (NULL), and fails them.  (An event claimed again with the same attempt,
-- its request never having left or its lease having expired, is paired
-- with its latest claim sent before the arrival.)
CREATE TEMP TABLE delays AS
WITH c AS (
    SELECT c.event_id, c.attempt, c.claim_mono_us - r.sim_mono_us AS claim_us
    FROM demo_claims c, demo_run r)
SELECT s.endpoint AS name, s.t_us,
       (s.t_us - max(c.claim_us) FILTER (WHERE c.claim_us <= s.t_us)) / 1e6 AS delay
FROM sim_requests s
LEFT JOIN c ON c.event_id = s.event_id AND c.attempt = s.attempt
GROUP BY s.endpoint, s.t_us, s.event_id, s.attempt;

CREATE TEMP TABLE max_delay AS
SELECT name, max(delay) AS d, count(*) FILTER (WHERE delay IS NULL) AS unpaired
FROM delays GROUP BY name;

CREATE TEMP TABLE per_endpoint AS
SELECT d.name, d.rate, d.capacity, d.true_rate, d.note, d.events,
       count(s.*) AS requests,
       count(s.*) FILTER (WHERE s.status BETWEEN 200 AND 299) AS ok,
       count(s.*) FILTER (WHERE s.status = 429) AS throttled,
       count(s.*) FILTER (WHERE s.status >= 500) AS errors,
       (max(s.t_us) FILTER (WHERE s.status BETWEEN 200 AND 299) -
        min(s.t_us) FILTER (WHERE s.status BETWEEN 200 AND 299)) / 1e6 AS span,
       min(s.t) AS first_t,
       max(s.t) FILTER (WHERE s.status BETWEEN 200 AND 299) AS last_ok_t,
       b.cooldowns, b.breaker_opens, b.effective_rate,
       coalesce(x.excess, 0) AS excess, md.d AS delay, md.unpaired,
       lg.len AS gap, lg.a AS gap_at, lf.len AS free_gap, lf.a AS free_gap_at
FROM demo_endpoints d
LEFT JOIN seen s ON s.name = d.name
LEFT JOIN ratebucket.bucket_status b ON b.endpoint = d.url
LEFT JOIN excess x ON x.name = d.name
LEFT JOIN max_delay md ON md.name = d.name
LEFT JOIN (SELECT DISTINCT ON (name) name, len, a FROM gaps ORDER BY name, len DESC) lg
       ON lg.name = d.name
LEFT JOIN (SELECT DISTINCT ON (name) name, b - greatest(a, held_until) AS len,
                  greatest(a, held_until) AS a
           FROM (SELECT name, a, b, coalesce(held_until, a) AS held_until FROM gaps) g
           ORDER BY name, b - greatest(a, held_until) DESC) lf
       ON lf.name = d.name
GROUP BY d.name, d.rate, d.capacity, d.true_rate, d.note, d.events,
         b.cooldowns, b.breaker_opens, b.effective_rate, x.excess, md.d, md.unpaired,
         lg.len, lg.a, lf.len, lf.a;

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
       format('%s s at %s', round(gap::numeric, 2), round(gap_at::numeric, 1)) AS "longest gap",
       CASE WHEN cooldowns > 0 OR breaker_opens > 0 THEN
           format('%s s at %s', round(free_gap::numeric, 2), round(free_gap_at::numeric, 1))
       END AS "outside cooldowns",
       note
FROM per_endpoint ORDER BY rate DESC, name;

\echo '    delivered/s: 2xx from the first to the last; longest gap: the longest time without a request'
\echo '    while events were left (from the start of the delivery to the last 2xx), and when it began'
\echo '    (seconds since the simulator started); outside cooldowns: what was left of a gap after the'
\echo '    cooldowns and open breakers ratebucket showed (sampled every 0.25 s), for endpoints that had any'

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
       (SELECT max(md.d) FROM max_delay md WHERE md.name = ANY (l.endpoints)) AS delay,
       (SELECT sum(md.unpaired) FROM max_delay md WHERE md.name = ANY (l.endpoints)) AS unpaired,
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
FROM per_endpoint p
WHERE p.name NOT IN (SELECT name FROM above);

INSERT INTO demo_checks
SELECT 5, 'arrivals within rate*(T + d) + capacity, d the longest from a claim sent to its request''s arrival',
       bool_and(CASE WHEN requests = 0 THEN true
                     ELSE unpaired = 0 AND excess <= capacity + rate * delay END),
       string_agg(format($$%s %s/%s (d %s s)%s$$, name, round(excess::numeric, 1),
                         round((capacity + rate * delay)::numeric, 1), round(delay::numeric, 3),
                         CASE WHEN unpaired > 0 THEN format(', %s requests without a claim', unpaired) ELSE '' END),
                  ', ' ORDER BY name)
FROM per_endpoint;

-- Checks 6-10: the endpoints configured above their true limit.  Their
-- figures, one row each: t0 their first request, t_end their last 2xx.
-- (A figure missing, for an endpoint that got no request or no 2xx, fails
-- its check: IS TRUE below.)
CREATE TEMP TABLE throttled AS
SELECT p.name, p.events, p.requests, p.ok, p.first_t AS t0, p.last_ok_t AS t_end,
       (p.first_t + p.last_ok_t) / 2 AS mid,
       -- where the loop settled: the median of the samples over the second
       -- half of its delivery, from settle s after its last change of limit
       -- if that is later (the status at the end of the run, if there is
       -- none): the level it holds between the probes of its climb
       coalesce((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.effective_rate)
                 FROM samples s
                 WHERE s.name = p.name AND s.t <= p.last_ok_t
                   AND s.t >= greatest((p.first_t + p.last_ok_t) / 2,
                                       (SELECT f.t_from + :settle_change FROM phases f
                                        WHERE f.name = p.name AND f.t_to IS NULL AND f.k > 0))),
                p.effective_rate) AS effective_rate,
       (SELECT f.rate FROM phases f WHERE f.name = p.name AND f.t_to IS NULL) AS final_rate,
       (SELECT count(*) FROM phases f WHERE f.name = p.name) > 1 AS changes,
       -- 429s once settled: after t0 + settle and outside settle_change s after each change
       (SELECT count(*) FROM seen s
        WHERE s.name = p.name AND s.status = 429 AND s.t > p.first_t + :settle
          AND NOT EXISTS (SELECT 1 FROM phases f
                          WHERE f.name = p.name AND f.k > 0
                            AND s.t BETWEEN f.t_from AND f.t_from + :settle_change)) AS late_429
FROM per_endpoint p WHERE p.name IN (SELECT name FROM above);

-- (a) the second half of the delivery, against the mean true limit then.
-- For an endpoint whose limit changes, the settle s after each change are
-- left out (check 10 judges them): the pieces of the second half, phase by
-- phase, from settle s after the phase's change.
CREATE TEMP TABLE second_half AS
SELECT t.name, f.k, h.a, h.b, f.rate,
       pg_temp.delivered_rate(t.name, h.a, h.b) * (h.b - h.a) AS delivered
FROM throttled t JOIN phases f ON f.name = t.name,
     LATERAL (SELECT greatest(t.mid, f.t_from + CASE WHEN f.k > 0 THEN :settle_change ELSE 0 END) AS a,
                     least(t.t_end, coalesce(f.t_to, 'Infinity')) AS b) h
WHERE h.b > h.a;

CREATE TEMP VIEW second_half_rate AS
SELECT t.name, t.changes,
       sum(h.delivered) / sum(h.b - h.a) AS delivered_rate,
       sum(h.rate * (h.b - h.a)) / sum(h.b - h.a) AS mean_limit,
       string_agg(format('%s-%s', round(h.a::numeric, 1), round(h.b::numeric, 1)), ', ' ORDER BY h.a) AS spans
FROM throttled t LEFT JOIN second_half h ON h.name = t.name
GROUP BY t.name, t.changes;

INSERT INTO demo_checks
SELECT 6, format('above their limit: delivered/s over the second half of the delivery (but %s s after a change) >= %s x the true limit',
                 :settle_change, :min_share),
       coalesce(bool_and((delivered_rate >= :min_share * mean_limit) IS TRUE), false),
       string_agg(CASE WHEN delivered_rate IS NOT NULL THEN
                      format('%s %s/s over %s s (>= %s%s)', name,
                             round(delivered_rate::numeric, 1), spans,
                             round((:min_share * mean_limit)::numeric, 1),
                             CASE WHEN changes THEN format(', of a mean limit of %s', round(mean_limit::numeric, 1))
                                  ELSE '' END)
                  ELSE format('%s: no delivery to measure', name) END, '; ' ORDER BY name)
FROM second_half_rate;

-- (b) 429s once settled
INSERT INTO demo_checks
SELECT 7, format('above their limit: 429s later than %s s after the first request (and %s s after a change of limit) <= %s %% of the requests (or %s)',
                 :settle, :settle_change, trim_scale(100 * :late_429), :late_429_min),
       coalesce(bool_and((late_429 <= greatest(:late_429 * requests, :late_429_min)) IS TRUE), false),
       string_agg(format('%s %s of %s (%s %%)', name, late_429, requests,
                         round((100.0 * late_429 / greatest(requests, 1))::numeric, 1)), ', ' ORDER BY name)
FROM throttled;

-- (c) the effective rate it settled at.  A window destination (window=,
-- true_burst per 10 s) takes any burst its window has room for and refuses
-- the rest of it, so the rate that delivers its mean may run above the
-- mean while cooldowns take the window's end: it is judged on what it
-- delivered over the second half (N per window), within the same bounds.
CREATE TEMP VIEW settled AS
SELECT t.name, t.final_rate, d.sim LIKE '%window=%' AS is_window,
       CASE WHEN d.sim LIKE '%window=%' THEN h.delivered_rate ELSE t.effective_rate END AS rate
FROM throttled t JOIN demo_endpoints d ON d.name = t.name
LEFT JOIN second_half_rate h ON h.name = t.name;

INSERT INTO demo_checks
SELECT 8, format('above their limit: effective rate over the second half of its delivery (median) within %s-%s x the true limit (the last one; a window''s delivered rate)',
                 :final_lo, :final_hi),
       coalesce(bool_and((rate BETWEEN :final_lo * final_rate AND :final_hi * final_rate) IS TRUE), false),
       string_agg(format('%s %s/s of %s (%s x%s)', name, round(rate::numeric, 1), final_rate,
                         round((rate / final_rate)::numeric, 2),
                         CASE WHEN is_window THEN ', delivered' ELSE '' END), ', ' ORDER BY name)
FROM settled;

-- (d) the time the whole delivery took
INSERT INTO demo_checks
SELECT 9, format('above their limit: last event delivered within the time the events take at %s x the true limit, + %s s',
                 :min_share, :settle),
       coalesce(bool_and((ok >= events AND
                          t_end - t0 <= pg_temp.done_at(name, t0, events, :min_share) - t0 + :settle) IS TRUE), false),
       string_agg(format('%s %s of %s events in %s s (allowed %s s)', name, ok, events,
                         round((t_end - t0)::numeric, 1),
                         round((pg_temp.done_at(name, t0, events, :min_share) - t0 + :settle)::numeric, 1)),
                  ', ' ORDER BY name)
FROM throttled;

-- (e) after each change of limit: the requests of that phase (from the
-- change to the next one, or the end of the delivery), and what was
-- delivered once settled (from the change + settle to the next change, or
-- the end), if that is long enough to measure.
CREATE TEMP TABLE after_change AS
SELECT f.name, f.k, f.t_from, f.factor, f.rate,
       least(coalesce(f.t_to, 'Infinity'), t.t_end) AS t_to,
       least(coalesce(f.t_to, 'Infinity'), t.t_end) - (f.t_from + :settle_change) AS settled_len,
       (SELECT count(*) FROM seen s
        WHERE s.name = f.name AND s.t >= f.t_from AND s.t < coalesce(f.t_to, 'Infinity')) AS requests,
       (SELECT count(*) FROM seen s
        WHERE s.name = f.name AND s.status = 429
          AND s.t > f.t_from + :settle_change AND s.t < coalesce(f.t_to, 'Infinity')) AS late_429
FROM phases f JOIN throttled t ON t.name = f.name
WHERE f.k > 0;

INSERT INTO demo_checks
SELECT 10, format('after each change of limit: 429s later than %s s after it <= %s %% of the phase''s requests, then delivered/s >= %s x its limit',
                  :settle_change, trim_scale(100 * :late_429), :min_share),
       coalesce(bool_and((late_429 <= greatest(:late_429 * requests, :late_429_min) AND settled_len >= :min_window AND
                          pg_temp.delivered_rate(name, t_from + :settle_change, t_to) >= :min_share * rate) IS TRUE), false),
       coalesce(string_agg(
           format('%s x%s at %s s: 429s %s of %s (%s %%), ', name, factor, round(t_from::numeric, 1),
                  late_429, requests, round((100.0 * late_429 / greatest(requests, 1))::numeric, 1)) ||
           CASE WHEN settled_len >= :min_window THEN
               format('%s/s from %s to %s s (>= %s)',
                      round(pg_temp.delivered_rate(name, t_from + :settle_change, t_to)::numeric, 1),
                      round((t_from + :settle_change)::numeric, 1), round(t_to::numeric, 1),
                      round((:min_share * rate)::numeric, 1))
           ELSE format('not measured: %s s from %s s (settled) to %s s, under %s s',
                       round(greatest(settled_len, 0)::numeric, 1), round((t_from + :settle_change)::numeric, 1),
                       round(t_to::numeric, 1), :min_window) END,
           '; ' ORDER BY name, k), 'no endpoint configured above its limit changed it')
FROM after_change;

INSERT INTO demo_checks
SELECT 11, 'the unreachable endpoint tripped its breaker and then delivered everything',
       breaker_opens >= 1 AND ok = events,
       format('breaker trips %s, delivered %s of %s', breaker_opens, ok, events)
FROM per_endpoint WHERE name = 'down';

INSERT INTO demo_checks
SELECT 12, 'shared account: its endpoints together within rate*(T + d) + capacity (d as in 5)',
       bool_and(CASE WHEN requests = 0 THEN true
                     ELSE unpaired = 0 AND excess <= capacity + rate * delay END),
       string_agg(format('%s %s/%s (d %s s) over %s%s', key, round(excess::numeric, 1),
                         round((capacity + rate * delay)::numeric, 1), round(delay::numeric, 3),
                         array_to_string(endpoints, '+'),
                         CASE WHEN unpaired > 0 THEN format(', %s requests without a claim', unpaired) ELSE '' END),
                  ', ' ORDER BY key)
FROM per_limit WHERE rate IS NOT NULL;

INSERT INTO demo_checks
SELECT 13, 'daily quota: never more requests than it allows, and it ran out',
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
