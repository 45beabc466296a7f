-- What each object is, for \dd and the catalogs.
COMMENT ON TABLE webhook_events IS
'The delivery queue: one row per event to send to its endpoint (a ratebucket bucket key), with its priority, state (pending, sending, delivered, failed), next attempt time, attempts made, other buckets it takes tokens from (limits) and in-flight cap.';
COMMENT ON TABLE webhook_parking IS
'Per throttled endpoint, where its parked events end and at what pace (claim_events parks the next ones after them).';
COMMENT ON FUNCTION claim_events(int, int, interval, float8, int, float8, float8) IS
'Claim up to batch due events, at most per_endpoint of each endpoint, only those whose endpoint and limits have tokens (and cap a slot): tokens and slots are spent only on the events returned, each leased until lease_until. Events of endpoints without tokens are parked until their tokens come. READ COMMITTED; call it alone in its transaction.';
COMMENT ON FUNCTION record_delivery(bigint, int, text, jsonb, boolean, int, timestamptz, timestamptz) IS
'Record the outcome of one claimed event: record_deliveries for a batch of one. The answer goes to ratebucket.bucket_observe_batch; the event is delivered on 2xx, pending again after the cooldown or a backoff on 429, 503 or a failure (up to max_attempts), failed on other statuses. Returns the outcome, or stale or missing.';
COMMENT ON FUNCTION next_due() IS
'Seconds until a claim could find something (an event falls due, a bucket refills); NULL when nothing is pending.';
COMMENT ON FUNCTION requeue_expired() IS
'Put events whose lease ran out (their worker died) back in the queue, their attempt not counted, and free their slots; forget parking cursors an hour past. Returns the events requeued.';
COMMENT ON FUNCTION events_left(timestamptz) IS
'Events in flight, or pending and due before "before" (NULL: whenever).';
COMMENT ON FUNCTION explain_event(bigint) IS
'Why an event is not being sent: one row per thing that holds it (not configured, paused, breaker open, cooldown, quota spent, no tokens, cap full, not due, leased), with the key it concerns and when it lets go; one row due when nothing does.';
COMMENT ON FUNCTION record_deliveries(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'Record the outcomes of a whole batch in one call, each as record_delivery does, its locks taken in order by itself (the events in id order, then their buckets in endpoint order); returns each event''s outcome, in the order given.';
COMMENT ON FUNCTION explain_endpoint(text) IS
'Why an endpoint''s events are not being sent: what holds its best pending event (its bucket, that event''s limits and cap), then leased, not due, due or no events, with counts and times.';
COMMENT ON FUNCTION unpark(text) IS
'Bring back an endpoint''s events parked ahead at the pace its buckets allow now (claims do it by themselves within about a second). Returns how many moved.';
COMMENT ON VIEW event_waits IS
'explain_event for every event pending or in flight: filter it by endpoint or event_id.';
COMMENT ON FUNCTION due_endpoints(int) IS
'The endpoints with work now (events pending and due, or in flight past their lease), the most urgent first: for a worker that claims endpoint by endpoint (claim_endpoint).';
COMMENT ON FUNCTION claim_endpoint(text, int, interval, float8, float8) IS
'Claim up to max_events due events of one endpoint that its buckets (and cap) grant now, as claim_events claims each endpoint: tokens and slots spent only on the events returned, the refused put off until their token; its expired leases given back first. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION record_endpoint(text, bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'Record the outcomes of claimed events of one endpoint in one call, each as record_deliveries decides it; an id that is not an event of the endpoint is missing. On Citus it runs on the endpoint''s node.';
COMMENT ON FUNCTION distribute_queue() IS
'On a Citus coordinator, after ratebucket.distribute(): distribute the queue by endpoint, co-located with the buckets (the events'' primary key becomes (endpoint, id)), and make claim_endpoint, record_endpoint and explain_endpoint run on the endpoint''s node. Idempotent.';
COMMENT ON VIEW endpoint_status IS
'One row per endpoint with events pending or in flight: pending, due, parked, in_flight, next_due_at, and what configures its bucket (own, template, or none: its events wait until something does) and the template.';
COMMENT ON FUNCTION record_check(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int) IS
'The checks of a batch''s outcomes, before anything is locked (record_deliveries, record_endpoint): raises 22004 or 22023.';
COMMENT ON FUNCTION record_decide(bigint[], int[], timestamptz[], text[], jsonb[], boolean[], timestamptz[], int, text[], text[], timestamptz[], int[], bigint[], text[]) IS
'What a batch''s answers make of its events, locked by the caller: every answer observed in one ratebucket.bucket_observe_batch, then per answer its outcome and, for an event still this claim''s, its new status, attempts and delay (record_deliveries, record_endpoint).';
