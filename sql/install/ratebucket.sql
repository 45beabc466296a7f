/*
 * ratebucket.sql: transactional token buckets.  The current SQL surface of
 * the extension, whole, as one install script: the file to read, and to
 * change when the surface changes.
 *
 * The build copies it to ratebucket--<version>.sql, <version> being
 * default_version in ratebucket.control; CREATE EXTENSION ratebucket runs
 * that copy.  The released scripts are never edited: install/ keeps
 * ratebucket--1.0.sql, the first release's install script (a database may
 * still start there), and updates/ one script per release after it,
 * ratebucket--<from>--<to>.sql, which ALTER EXTENSION ratebucket UPDATE runs
 * in turn.  Each release adds its updates/ script, raises default_version,
 * and changes this file to match: installing it must give exactly what 1.0
 * and every update give (the regression test upgrade.sql compares the two
 * object by object).  Where an update replaced a function (1.3 replaced
 * inflight_acquire, 1.4 the in-flight functions' PL/pgSQL by C), this file
 * has only the replacement.
 */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION ratebucket" to load this file. \quit

--
-- Tables
--

--
-- The bucket table: one row per endpoint (and per stripe of a striped
-- endpoint, see bucket_stripe).
--
-- A take changes only tokens, refilled_at, last_granted_at and the counters,
-- none of which is indexed, so every take is a HOT update; the fillfactor
-- leaves room on each page for the new row versions, and autovacuum is told
-- to visit this small, hot table often.  Nothing here is read through the
-- caller's search_path: the C code names ratebucket.buckets explicitly.
--
CREATE TABLE ratebucket.buckets (
	endpoint		text NOT NULL,
	rate			float8 NOT NULL,
	capacity		float8 NOT NULL,
	tokens			float8 NOT NULL,
	refilled_at		timestamptz NOT NULL,
	conf_rate		float8,
	conf_capacity	float8,
	conf_floor_rate	float8,
	conf_throttle_factor float8,
	conf_recovery_factor float8,
	conf_breaker_failures int,
	configured_at	timestamptz,
	created_at		timestamptz NOT NULL,
	last_granted_at	timestamptz,
	takes_granted	bigint NOT NULL DEFAULT 0,
	tokens_granted	float8 NOT NULL DEFAULT 0,
	rate_factor		float8 NOT NULL DEFAULT 1,
	factor_at		timestamptz,
	cooldown_until	timestamptz,
	at_floor_since	timestamptz,
	paused_until	timestamptz,
	failure_run		int NOT NULL DEFAULT 0,
	breaker_trips	int NOT NULL DEFAULT 0,
	breaker_open_until timestamptz,
	probe_at		timestamptz,
	successes		bigint NOT NULL DEFAULT 0,
	failures		bigint NOT NULL DEFAULT 0,
	throttles		bigint NOT NULL DEFAULT 0,
	cooldowns		bigint NOT NULL DEFAULT 0,
	breaker_opens	bigint NOT NULL DEFAULT 0,
	malformed_headers bigint NOT NULL DEFAULT 0,
	last_status		int,
	last_observed_at timestamptz,
	-- A calendar quota (bucket_configure_quota) is a row of this table with
	-- conf_rate 0 and conf_capacity the quota.  These two columns came with
	-- 1.2 and stay last, where its update added them.
	quota_period	text,
	quota_time_zone	text,
	-- The throttle episode's return level and a limit the destination
	-- published came with 1.5, after them.
	target_factor	float8,
	burst_factor	float8,
	limit_factor	float8,
	limit_burst_factor float8,
	-- The template that configured the endpoint came with 1.6.
	template		text,
	-- The token reserve's batch came with 1.8.
	reserve			int,
	-- When the cooldown began and how long a lock-out lasted came with
	-- 1.11, last.
	cooldown_from	timestamptz,
	lockout_seconds	float8,
	CONSTRAINT buckets_pkey PRIMARY KEY (endpoint)
	-- No CHECK constraints, on purpose: the executor re-reads every CHECK
	-- expression from its stored text at the start of each statement, and
	-- each take runs its UPDATE as a statement of its own.  Five of them
	-- cost a third of a take's CPU (20.7k against 31.1k takes/s, 8 clients,
	-- synchronous_commit off).  Only the functions write this table, and
	-- they validate every input; the tests check every row's invariants.
) WITH (
	fillfactor = 50,
	autovacuum_vacuum_scale_factor = 0.0,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_cost_delay = 0,
	autovacuum_analyze_scale_factor = 0.05
);

COMMENT ON TABLE ratebucket.buckets IS
'One token bucket per endpoint. Change it only through the ratebucket functions.';
COMMENT ON COLUMN ratebucket.buckets.endpoint IS
'The key the bucket limits: a destination URL, host, or any name (1 to 1024 bytes).';
COMMENT ON COLUMN ratebucket.buckets.rate IS
'Tokens per second in force: the rate of the last take, or the configured rate.';
COMMENT ON COLUMN ratebucket.buckets.capacity IS
'Largest number of tokens the bucket holds (the burst), as of the last take or configuration.';
COMMENT ON COLUMN ratebucket.buckets.tokens IS
'Tokens held at refilled_at; the tokens now are in bucket_status (see bucket_now).';
COMMENT ON COLUMN ratebucket.buckets.refilled_at IS
'Clock of the last refill; it never moves backwards.';
COMMENT ON COLUMN ratebucket.buckets.conf_rate IS
'Rate stored by bucket_configure, used by bucket_take(endpoint, tokens); NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.conf_capacity IS
'Capacity stored by bucket_configure; NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.configured_at IS
'When bucket_configure last changed this endpoint; NULL when not configured.';
COMMENT ON COLUMN ratebucket.buckets.created_at IS
'When the row was created (first take or configuration).';
COMMENT ON COLUMN ratebucket.buckets.last_granted_at IS
'Clock of the last granted take; NULL if none yet.';
COMMENT ON COLUMN ratebucket.buckets.takes_granted IS
'Number of granted takes since the row was created.';
COMMENT ON COLUMN ratebucket.buckets.tokens_granted IS
'Sum of the tokens granted since the row was created.';
COMMENT ON COLUMN ratebucket.buckets.conf_floor_rate IS
'Configured floor of the effective rate (tokens/s); NULL: ratebucket.floor_fraction of the rate.';
COMMENT ON COLUMN ratebucket.buckets.conf_throttle_factor IS
'Configured multiplier on a 429; NULL: ratebucket.throttle_factor.';
COMMENT ON COLUMN ratebucket.buckets.conf_recovery_factor IS
'Configured recovery growth per interval; NULL: ratebucket.recovery_factor.';
COMMENT ON COLUMN ratebucket.buckets.conf_breaker_failures IS
'Configured consecutive failures that open the breaker; NULL: ratebucket.breaker_failures.';
COMMENT ON COLUMN ratebucket.buckets.rate_factor IS
'Multiplier on the rate set by the last throttle episode, in force until factor_at; it then returns to target_factor and climbs above it (see bucket_status.effective_rate).';
COMMENT ON COLUMN ratebucket.buckets.factor_at IS
'When the effective rate starts its return: the end of the last throttle episode''s cooldown.';
COMMENT ON COLUMN ratebucket.buckets.target_factor IS
'Multiplier on the rate that the effective rate returns to after the last throttle episode; NULL: rate_factor.';
COMMENT ON COLUMN ratebucket.buckets.burst_factor IS
'Multiplier on the capacity set by the last throttle episode, as of factor_at; it grows back with time. NULL: 1.';
COMMENT ON COLUMN ratebucket.buckets.limit_factor IS
'The rate the destination published (RateLimit-Policy, X-RateLimit-Limit with a window), over the rate; the effective rate never exceeds it. NULL: none published.';
COMMENT ON COLUMN ratebucket.buckets.limit_burst_factor IS
'The burst the destination published, over the capacity; the capacity in force never exceeds it. NULL: none published.';
COMMENT ON COLUMN ratebucket.buckets.cooldown_until IS
'Takes are refused until then (Retry-After, a reset, or the default cooldown).';
COMMENT ON COLUMN ratebucket.buckets.at_floor_since IS
'When the effective rate last fell to its floor.';
COMMENT ON COLUMN ratebucket.buckets.paused_until IS
'Paused by bucket_pause until then (infinity: until bucket_resume).';
COMMENT ON COLUMN ratebucket.buckets.failure_run IS
'Consecutive failures observed.';
COMMENT ON COLUMN ratebucket.buckets.breaker_trips IS
'Times the breaker opened since it was last closed; each doubles the open period.';
COMMENT ON COLUMN ratebucket.buckets.breaker_open_until IS
'The circuit breaker is open until then, half-open after, closed when NULL.';
COMMENT ON COLUMN ratebucket.buckets.probe_at IS
'When the half-open breaker let its probe through.';
COMMENT ON COLUMN ratebucket.buckets.successes IS 'Successes observed (2xx).';
COMMENT ON COLUMN ratebucket.buckets.failures IS 'Failures observed (5xx, 408, no response).';
COMMENT ON COLUMN ratebucket.buckets.throttles IS 'Throttles observed (429).';
COMMENT ON COLUMN ratebucket.buckets.cooldowns IS 'Cooldowns started by feedback.';
COMMENT ON COLUMN ratebucket.buckets.breaker_opens IS 'Times the circuit breaker opened.';
COMMENT ON COLUMN ratebucket.buckets.malformed_headers IS
'Header values from the destination that could not be parsed.';
COMMENT ON COLUMN ratebucket.buckets.last_status IS 'Status of the last observed outcome (0: no response).';
COMMENT ON COLUMN ratebucket.buckets.last_observed_at IS 'When the last outcome was observed.';
COMMENT ON COLUMN ratebucket.buckets.quota_period IS
'For a calendar quota (bucket_configure_quota): hour, day, week or month; NULL for a rate bucket.';
COMMENT ON COLUMN ratebucket.buckets.quota_time_zone IS
'For a calendar quota: the time zone whose calendar its windows follow; NULL for a rate bucket.';
COMMENT ON COLUMN ratebucket.buckets.template IS
'The pattern of the template (bucket_template) that configured the endpoint, which it follows; NULL when configured by bucket_configure, or not configured.';
COMMENT ON COLUMN ratebucket.buckets.reserve IS
'Tokens a refill of the endpoint''s reserve in shared memory moves at most (bucket_reserve); NULL when it has none.';
COMMENT ON COLUMN ratebucket.buckets.cooldown_from IS
'When the cooldown ending at cooldown_until began: a 429 that locks the sender out right after it doubles its length.';
COMMENT ON COLUMN ratebucket.buckets.lockout_seconds IS
'How long the last lock-out kept the destination closed, in seconds (its cooldowns since the episode began); a rate must hold that long and 10 s more before it counts as one that held. NULL: no lock-out seen.';

--
-- In-flight caps: at most cap deliveries in flight per key (an account, say).
-- A slot is acquired when a delivery is claimed and released when its
-- outcome is recorded; a slot whose lease ran out (its worker died) is
-- reclaimed by the next acquire, so none leaks.
--
CREATE TABLE ratebucket.inflight_caps (
	key text PRIMARY KEY,
	cap int NOT NULL,
	lease interval NOT NULL,
	configured_at timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.inflight_caps IS
'One row per key with an in-flight cap: at most cap slots held at once, each for at most lease unless renewed. Written only by inflight_configure and inflight_drop.';

CREATE TABLE ratebucket.inflight_slots (
	key text NOT NULL,
	slot bigint GENERATED ALWAYS AS IDENTITY,
	acquired_at timestamptz NOT NULL,
	lease_until timestamptz NOT NULL,
	PRIMARY KEY (key, slot)
);

COMMENT ON TABLE ratebucket.inflight_slots IS
'The slots held now: one row per delivery in flight, until inflight_release, or until lease_until when the next inflight_acquire of its key reclaims it.';

--
-- Striped (hot) buckets: one endpoint's bucket split over k rows of
-- ratebucket.buckets (its stripes), each with rate/k and capacity/k, so that
-- takes of one hot endpoint lock different rows instead of queueing on one.
-- The endpoint's own row keeps the configuration and the feedback state,
-- holds no tokens, and has the refill time infinity; stripe i of k is the
-- row keyed ratebucket.stripe_key(endpoint, i, k), longer than any endpoint
-- may be.
--
CREATE TABLE ratebucket.bucket_stripes (
	endpoint	text PRIMARY KEY,
	stripes		int NOT NULL,
	striped_at	timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.bucket_stripes IS
'The endpoints whose bucket is striped, and over how many rows. Written only by bucket_stripe and bucket_drop.';
COMMENT ON COLUMN ratebucket.bucket_stripes.endpoint IS
'A configured endpoint of ratebucket.buckets.';
COMMENT ON COLUMN ratebucket.bucket_stripes.stripes IS
'Number of stripes (2 to 64); each holds rate/stripes and capacity/stripes.';
COMMENT ON COLUMN ratebucket.bucket_stripes.striped_at IS
'When bucket_stripe last changed the stripe count.';

--
-- Templates: the configuration of endpoints nobody configured, by key
-- pattern.  The first configured take, claim or bucket_stripe (with no
-- row yet, bucket_observe or bucket_pause) of an endpoint without a
-- configuration configures it from the most specific template that matches
-- it (the longest prefix), in its own transaction; the endpoint then
-- follows that template (buckets.template) until it is configured by hand.
-- The statement trigger tells every backend to read the templates again,
-- however they changed.
--
CREATE TABLE ratebucket.bucket_templates (
	pattern			text PRIMARY KEY,
	rate			float8 NOT NULL,
	capacity		float8 NOT NULL,
	floor_rate		float8,
	throttle_factor	float8,
	recovery_factor	float8,
	breaker_failures int,
	configured_at	timestamptz NOT NULL
);

COMMENT ON TABLE ratebucket.bucket_templates IS
'The configuration of endpoints nobody configured, by key pattern (a prefix and a final *). Written only by bucket_template and bucket_template_drop.';
COMMENT ON COLUMN ratebucket.bucket_templates.pattern IS
'A prefix followed by *: ''acct:*'' matches every key that starts with acct:, ''*'' every key. Of those that match a key, the longest prefix configures it.';
COMMENT ON COLUMN ratebucket.bucket_templates.configured_at IS
'When bucket_template last changed the template.';

CREATE FUNCTION ratebucket.bucket_templates_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'ratebucket_templates_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_templates_changed() IS
'Trigger of bucket_templates: tells every session to read the templates again.';

CREATE TRIGGER bucket_templates_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ratebucket.bucket_templates
	FOR EACH STATEMENT EXECUTE FUNCTION ratebucket.bucket_templates_changed();

-- What pg_dump keeps.  Configured endpoints are user data (their runtime
-- state included); buckets made only by explicit takes are not.  Caps are
-- configuration; slots are runtime state, not dumped.  Striping and
-- templates are configuration, like the configured rows (the stripes are
-- configured rows themselves).
SELECT pg_catalog.pg_extension_config_dump('ratebucket.buckets',
										   'WHERE conf_rate IS NOT NULL');
SELECT pg_catalog.pg_extension_config_dump('ratebucket.inflight_caps', '');
SELECT pg_catalog.pg_extension_config_dump('ratebucket.bucket_stripes', '');
SELECT pg_catalog.pg_extension_config_dump('ratebucket.bucket_templates', '');

--
-- Types
--

CREATE TYPE ratebucket.batch_request AS (
	buckets text[],
	tokens int,
	inflight_key text
);

COMMENT ON TYPE ratebucket.batch_request IS
'One request of a bucket_take_batch: up to tokens tokens from every one of buckets (configured, not striped), and with inflight_key (optional) as many slots of that in-flight cap.';

-- What the takes return.  Named row types, not OUT parameters: a call in
-- FROM gets a named type's row from the type cache, where OUT parameters
-- have the row type built again from pg_proc at every execution.
CREATE TYPE ratebucket.take_result AS (
	allowed boolean,
	remaining float8,
	wait_seconds float8
);

COMMENT ON TYPE ratebucket.take_result IS
'What bucket_take returns: allowed, the tokens remaining, and the seconds to wait before tokens would be available (0 when allowed).';

CREATE TYPE ratebucket.take_upto_result AS (
	granted int,
	remaining float8,
	wait_seconds float8
);

COMMENT ON TYPE ratebucket.take_upto_result IS
'What bucket_take_upto returns: the tokens granted (0 when refused), the tokens remaining, and the seconds until the next token could be granted (0 when all were).';

--
-- Taking tokens.  Each call runs SQL of its own: the COST tells the planner
-- to evaluate a query's cheaper conditions (status = 'pending', say) first.
--

CREATE FUNCTION ratebucket.bucket_take(
	endpoint text,
	rate float8,
	capacity float8,
	tokens float8 DEFAULT 1)
RETURNS ratebucket.take_result
AS 'MODULE_PATHNAME', 'ratebucket_take'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take(text, float8, float8, float8) IS
'Refill the endpoint''s bucket at rate tokens/s up to capacity, then take tokens if it holds them, under the row lock; a new endpoint starts full. Returns allowed, the tokens remaining, and the seconds to wait before tokens would be available (0 when allowed).';

CREATE FUNCTION ratebucket.bucket_take(
	endpoint text,
	tokens float8 DEFAULT 1)
RETURNS ratebucket.take_result
AS 'MODULE_PATHNAME', 'ratebucket_take_configured'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take(text, float8) IS
'bucket_take with the rate and capacity stored by bucket_configure; an endpoint that was never configured is an error.';

-- Takes of a batch: as many whole tokens as the bucket holds, up to a
-- maximum, in one row update.
CREATE FUNCTION ratebucket.bucket_take_upto(
	endpoint text,
	rate float8,
	capacity float8,
	max_tokens int)
RETURNS ratebucket.take_upto_result
AS 'MODULE_PATHNAME', 'ratebucket_take_upto'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take_upto(text, float8, float8, int) IS
'Like bucket_take, but takes as many whole tokens as the bucket holds, from 1 up to max_tokens (one while a half-open breaker waits for its probe), in one row update. Returns granted (0 when refused), the tokens remaining, and the seconds until the next token could be granted (0 when all max_tokens were).';

CREATE FUNCTION ratebucket.bucket_take_upto(
	endpoint text,
	max_tokens int)
RETURNS ratebucket.take_upto_result
AS 'MODULE_PATHNAME', 'ratebucket_take_upto_configured'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_take_upto(text, int) IS
'bucket_take_upto with the rate and capacity stored by bucket_configure; an endpoint that was never configured is an error.';

-- Several limits at once: all or nothing.
CREATE FUNCTION ratebucket.bucket_take_all(
	endpoints text[],
	tokens float8[] DEFAULT NULL,
	OUT allowed boolean,
	OUT wait_seconds float8,
	OUT remaining float8[])
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_take_all'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 200;

COMMENT ON FUNCTION ratebucket.bucket_take_all(text[], float8[]) IS
'Take tokens (default 1 each) from several configured buckets at once, all or nothing: every row is locked first, in byte order of the endpoints whatever order they are named in (so two such takes cannot deadlock), then each decides as bucket_take would; either all grant and all are written, or none is. Returns allowed, wait_seconds (until all of them could grant; 0 when allowed) and each bucket''s remaining tokens, in the order given.';

--
-- A claim that honours every limit of its events.  An event may answer to
-- more than its endpoint: its account's rate, a lane, a daily quota, an
-- in-flight cap.  A claim filters, before locking, on a peek of each of
-- those buckets (bucket_grantable: unlike bucket_claimable it answers every
-- time, since endpoints share their account), and grants its whole batch in
-- one bucket_take_batch: every bucket of the batch locked once in byte
-- order, every request granted as many tokens as all of its buckets hold,
-- and slots of its cap, in the same transaction.
--
CREATE FUNCTION ratebucket.bucket_take_batch(
	requests ratebucket.batch_request[])
RETURNS TABLE (
	request int,
	granted int,
	wait_seconds float8,
	slots bigint[])
AS 'MODULE_PATHNAME', 'ratebucket_take_batch'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE COST 500 ROWS 10;

COMMENT ON FUNCTION ratebucket.bucket_take_batch(ratebucket.batch_request[]) IS
'Grant a batch of requests at once, as a claim does for its events: every bucket named is locked first, once, in byte order of its key (as bucket_take_all locks, so they cannot deadlock); then, with one clock, each request in the order given is granted as many whole tokens as every one of its buckets still holds, up to its tokens, and takes them from each; a request with an in-flight cap keeps only as many as inflight_acquire gives it slots. One row per request: its position, granted, wait_seconds (until all its buckets could grant one more; 0 if they can now) and the slots it holds. One row update per bucket; a rollback gives back every token and slot.';

--
-- Peeks: judged from the last committed state, without locking or writing.
--

CREATE FUNCTION ratebucket.bucket_ready(
	endpoint text,
	tokens float8 DEFAULT 1)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_ready'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_ready(text, float8) IS
'True if a take of tokens would be granted now, judged from the last committed state. Never consumes, never writes, never waits for a lock; an unknown endpoint is ready.';

-- How long until a take would be granted: the peek behind a worker's sleep.
CREATE FUNCTION ratebucket.bucket_wait(
	endpoint text,
	tokens float8 DEFAULT 1)
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_wait'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_wait(text, float8) IS
'Seconds until a take of tokens would be granted (0: now), judged like bucket_ready from the last committed state: never consumes, never writes, never waits for a lock; an unknown endpoint is ready.';

-- The lock-free filter of a claim.  VOLATILE: it remembers, for one
-- execution of the statement, which endpoints it has answered for.  A high
-- cost, so that the planner evaluates every cheaper condition first.
CREATE FUNCTION ratebucket.bucket_claimable(
	endpoint text,
	per_endpoint int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_claimable'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 50;

COMMENT ON FUNCTION ratebucket.bucket_claimable(text, int) IS
'For a claim query: how many events of this endpoint it may lock. The first call for an endpoint in one execution of a statement answers the whole tokens its bucket holds now, at most per_endpoint (from the last committed state, without locking; 0 in a cooldown, a pause or an open breaker, 1 while half-open); later calls for it in the same execution answer NULL.';

-- The claim's filter, telling in the same peek an endpoint without a
-- configuration (NULL, like one already seen) from one without tokens (0).
CREATE FUNCTION ratebucket.bucket_claimable(
	endpoint text,
	per_endpoint int,
	configured_only boolean)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_claimable'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 50;

COMMENT ON FUNCTION ratebucket.bucket_claimable(text, int, boolean) IS
'bucket_claimable(endpoint, per_endpoint), where with configured_only an endpoint that has no configuration (no row, or a row only explicit takes made) answers NULL, as an endpoint already seen does, instead of per_endpoint: a claim passes over its events without counting it.';

CREATE FUNCTION ratebucket.bucket_grantable(
	endpoint text,
	max_tokens int DEFAULT 1)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_grantable'
LANGUAGE C VOLATILE PARALLEL RESTRICTED COST 50;

COMMENT ON FUNCTION ratebucket.bucket_grantable(text, int) IS
'How many whole tokens, up to max_tokens, a take of this configured bucket would be granted now, judged from the last committed state without locking or writing (0 in a cooldown, a pause or an open breaker); NULL if the endpoint is not configured. For a claim''s filter on the buckets its events share (an account, a quota).';

--
-- Configuration
--

CREATE FUNCTION ratebucket.bucket_configure(
	endpoint text,
	rate float8,
	capacity float8,
	floor_rate float8 DEFAULT NULL,
	throttle_factor float8 DEFAULT NULL,
	recovery_factor float8 DEFAULT NULL,
	breaker_failures int DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_configure(text, float8, float8, float8, float8, float8, int) IS
'Store the endpoint''s rate (tokens/s) and capacity, used by bucket_take(endpoint, tokens), and optionally its feedback policy: the floor of its effective rate (tokens/s), the multiplier on a 429, the recovery growth per ratebucket.recovery_interval, the failures that open its breaker (NULL: the ratebucket.* setting). Tokens already earned are kept (cut to the new capacity); a new endpoint starts full.';

CREATE FUNCTION ratebucket.bucket_template(
	pattern text,
	rate float8,
	capacity float8,
	floor_rate float8 DEFAULT NULL,
	throttle_factor float8 DEFAULT NULL,
	recovery_factor float8 DEFAULT NULL,
	breaker_failures int DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'ratebucket_template'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_template(text, float8, float8, float8, float8, float8, int) IS
'Create or replace the template of a pattern (a prefix and a final *, such as acct:* or *), with bucket_configure''s arguments: endpoints nobody configured that it matches are configured from it at their first use. Endpoints that follow it, and those it matches that follow a less specific template, are configured from it now; returns how many.';

CREATE FUNCTION ratebucket.bucket_template_drop(pattern text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_template_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_template_drop(text) IS
'Drop a template: the endpoints that followed it follow the next template that matches them, or keep their configuration as their own. False if there was no such template.';

CREATE FUNCTION ratebucket.bucket_template_for(endpoint text)
RETURNS text
AS 'MODULE_PATHNAME', 'ratebucket_template_for'
LANGUAGE C STABLE PARALLEL RESTRICTED;

COMMENT ON FUNCTION ratebucket.bucket_template_for(text) IS
'The pattern of the template that configures the endpoint when it has no configuration of its own; NULL if none matches.';

--
-- Feedback from destinations
--

CREATE FUNCTION ratebucket.bucket_observe(
	endpoint text,
	status int,
	retry_after text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_observe(text, int, text, jsonb) IS
'Report what the destination answered: its HTTP status (0 or NULL: no response), its Retry-After, and its response headers as a jsonb object (rate-limit fields are read from it). Returns the outcome (success, throttled, unavailable, failure, neutral), the cooldown it started, the effective rate now and the breaker state. An endpoint without a bucket changes nothing (outcome is still reported).';

-- The same, with the request's send time (all five arguments: a form with
-- defaults would make a call of two to four arguments ambiguous).
CREATE FUNCTION ratebucket.bucket_observe(
	endpoint text,
	status int,
	retry_after text,
	headers jsonb,
	sent_at timestamptz,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_observe'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100;

COMMENT ON FUNCTION ratebucket.bucket_observe(text, int, text, jsonb, timestamptz) IS
'bucket_observe with the time the request was sent (NULL: not known): a 429 to a request sent before the last throttle episode''s cooldown ended lowers the effective rate no further, however late it is recorded.';

-- A batch's answers: each endpoint's bucket locked once (in byte order of
-- the endpoints, as every batch locks), its answers applied in the order
-- given, its row written once.
CREATE FUNCTION ratebucket.bucket_observe_batch(
	endpoints text[],
	statuses int[],
	retry_afters text[] DEFAULT NULL,
	headers jsonb[] DEFAULT NULL,
	sent_ats timestamptz[] DEFAULT NULL,
	OUT ord int,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'ratebucket_observe_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100 ROWS 50;

COMMENT ON FUNCTION ratebucket.bucket_observe_batch(text[], int[], text[], jsonb[], timestamptz[]) IS
'bucket_observe for a batch: element i of each array is one answer (statuses[i] from endpoints[i]; the optional arrays NULL or as long, NULL where there is nothing to say). Each endpoint''s bucket is locked once, in byte order of the endpoints, its answers applied in the order given and its row written once. Every element is checked before anything is locked. One row per element, in the order given (ord from 1), as bucket_observe would report it.';

-- The header parsers bucket_observe uses, for users and tests to call.
CREATE FUNCTION ratebucket.parse_retry_after(
	value text,
	at timestamptz DEFAULT clock_timestamp())
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_parse_retry_after'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.parse_retry_after(text, timestamptz) IS
'Seconds from at until the retry time a Retry-After value names (RFC 9110): the delay-seconds (saturated at 1e9), or the HTTP-date minus at, negative for a date in the past. NULL when the value is NULL, blank or malformed.';

CREATE FUNCTION ratebucket.parse_rate_limit(
	headers jsonb,
	at timestamptz DEFAULT clock_timestamp(),
	OUT "limit" float8,
	OUT window_seconds float8,
	OUT remaining float8,
	OUT reset_seconds float8,
	OUT retry_after_seconds float8,
	OUT malformed int)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_parse_rate_limit'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.parse_rate_limit(jsonb, timestamptz) IS
'What a response''s headers (a jsonb object of name -> value, names in any case) say about the destination''s rate limit, as received at at: RateLimit and RateLimit-Policy (IETF drafts, both syntaxes), X-RateLimit-Limit/-Remaining/-Reset (or RateLimit-Limit/-Remaining/-Reset), Retry-After. Returns the limit per window, the window, the requests remaining, the seconds until the reset and until the Retry-After time (NULL when not given), and how many fields were given but malformed.';

--
-- Calendar quotas
--
-- A quota is a bucket whose tokens do not refill at a rate: the quota is
-- given back in full at each boundary of its period (hour, day, week,
-- month) in a named time zone.  It is a row of ratebucket.buckets, with
-- conf_rate 0 and conf_capacity the quota, so every take, peek and claim
-- helper works on it, bucket_take_all included.
--

CREATE FUNCTION ratebucket.bucket_configure_quota(
	endpoint text,
	quota float8,
	period text,
	time_zone text DEFAULT 'UTC')
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_configure_quota'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_configure_quota(text, float8, text, text) IS
'Make the endpoint''s bucket a calendar quota: quota tokens per hour, day, week (from Monday) or month of time_zone (a zone of the time zone database; windows follow its wall clock, so a day can last 23 or 25 hours), all given back at each boundary. Taken with bucket_take(endpoint, tokens), bucket_take_upto(endpoint, max_tokens) and bucket_take_all; a refusal waits until the window resets. What was used in the current window is kept; bucket_configure makes it a rate bucket again.';

CREATE FUNCTION ratebucket.quota_window(
	period text,
	time_zone text,
	at timestamptz DEFAULT clock_timestamp(),
	OUT window_start timestamptz,
	OUT resets_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_quota_window'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.quota_window(text, text, timestamptz) IS
'The window of a quota''s period (hour, day, week, month) in time_zone that contains at: when it started and when the quota resets. The arithmetic the takes use, for checking it at an explicit time.';

CREATE FUNCTION ratebucket.quota_now(
	b ratebucket.buckets,
	at timestamptz DEFAULT clock_timestamp(),
	OUT used float8,
	OUT remaining float8,
	OUT window_start timestamptz,
	OUT resets_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_quota_now'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.quota_now(ratebucket.buckets, timestamptz) IS
'A quota bucket''s window at time at: the tokens used and remaining in it, when it started and when it resets. All NULL for a rate bucket.';

--
-- Striped (hot) buckets (the table ratebucket.bucket_stripes, above)
--

CREATE FUNCTION ratebucket.bucket_stripe(
	endpoint text,
	stripes int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_stripe'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_stripe(text, int) IS
'Split a configured endpoint''s bucket over stripes rows (2 to 64), each with rate/stripes and capacity/stripes, so that concurrent takes of one hot endpoint do not queue on one row lock; 1 puts it back in one row. A take is granted by one stripe, so it must fit in capacity/stripes. The tokens held now are shared among the new stripes. Returns the stripe count it had.';

CREATE FUNCTION ratebucket.stripe_key(
	endpoint text,
	stripe int,
	stripes int)
RETURNS text
AS 'MODULE_PATHNAME', 'ratebucket_stripe_key'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.stripe_key(text, int, int) IS
'The key in ratebucket.buckets of stripe (0 to stripes - 1) of a striped endpoint: longer than any endpoint may be, so no take can name it.';

--
-- In-flight caps (the tables ratebucket.inflight_caps and inflight_slots,
-- above), in C (src/bucket/inflight.c).  The functions run as the
-- extension's owner (SECURITY DEFINER, a fixed search_path, every table and
-- operator schema-qualified), so no role needs privileges on the tables.
--

CREATE FUNCTION ratebucket.inflight_configure(
	key text,
	cap int,
	lease interval DEFAULT '5 minutes')
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_inflight_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION ratebucket.inflight_configure(text, int, interval) IS
'Allow at most cap slots of key in flight at once, each held for at most lease unless renewed (cap 0 holds everything back). Slots already held are kept; a lower cap only stops new ones.';

CREATE FUNCTION ratebucket.inflight_acquire(key text, n int DEFAULT 1)
RETURNS bigint[]
AS 'MODULE_PATHNAME', 'ratebucket_inflight_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION ratebucket.inflight_acquire(text, int) IS
'Acquire up to n slots of key, as many as its cap leaves free (after reclaiming slots whose lease ran out; one that another transaction is releasing is not waited for and counts as held). Returns their ids, an empty array if none is free. The acquires of one key wait for each other until commit; a rollback gives the slots back.';

CREATE FUNCTION ratebucket.inflight_release(key text, slots bigint[])
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_inflight_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION ratebucket.inflight_release(text, bigint[]) IS
'Release slots of key (when their deliveries'' outcomes are recorded). Returns how many were still held: a slot whose lease ran out may already have been reclaimed.';

CREATE FUNCTION ratebucket.inflight_renew(key text, slots bigint[], lease interval DEFAULT NULL)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_inflight_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION ratebucket.inflight_renew(text, bigint[], interval) IS
'Extend the lease of slots of key still held, by lease from now (NULL: the cap''s lease), for a delivery that takes longer than its lease. Returns how many were renewed; an expired slot is not.';

CREATE FUNCTION ratebucket.inflight_drop(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_inflight_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION ratebucket.inflight_drop(text) IS
'Forget the in-flight cap of key and every slot it holds. False if there was none.';

--
-- Administration
--

CREATE FUNCTION ratebucket.bucket_pause(
	endpoint text,
	duration interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_pause'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_pause(text, interval) IS
'Refuse every take of the endpoint for duration, or until bucket_resume when NULL. Returns false if there is no such bucket.';

CREATE FUNCTION ratebucket.bucket_resume(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_resume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_resume(text) IS
'End a pause. Cooldowns and an open breaker are not affected (bucket_reset clears them). Returns false if there is no such bucket.';

CREATE FUNCTION ratebucket.bucket_reset(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_reset(text) IS
'Fill the endpoint''s bucket to capacity, keeping its configuration. Returns false if there is no such bucket.';

CREATE FUNCTION ratebucket.bucket_drop(endpoint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_drop(text) IS
'Delete the endpoint''s bucket and its configuration. Returns false if there was none.';

-- Pure arithmetic, the same the takes use: exposed for the status view and
-- for checking the arithmetic at an explicit time.
CREATE FUNCTION ratebucket.refill_tokens(
	tokens float8,
	rate float8,
	capacity float8,
	refilled_at timestamptz,
	at timestamptz)
RETURNS float8
AS 'MODULE_PATHNAME', 'ratebucket_refill_tokens'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.refill_tokens(float8, float8, float8, timestamptz, timestamptz) IS
'Tokens a bucket holding tokens at refilled_at holds at time at: min(capacity, tokens + rate * seconds elapsed); a time before refilled_at refills nothing.';

CREATE FUNCTION ratebucket.bucket_now(
	b ratebucket.buckets,
	at timestamptz DEFAULT clock_timestamp(),
	OUT tokens float8,
	OUT effective_rate float8,
	OUT cooldown_seconds float8,
	OUT paused boolean,
	OUT breaker text,
	OUT breaker_seconds float8,
	OUT at_floor_since timestamptz,
	OUT expirable boolean)
RETURNS record
AS 'MODULE_PATHNAME', 'ratebucket_bucket_now'
LANGUAGE C STABLE PARALLEL SAFE;

COMMENT ON FUNCTION ratebucket.bucket_now(ratebucket.buckets, timestamptz) IS
'A bucket row as it stands at time at, with the settings in force: tokens, the effective rate (lowered by feedback, recovering), seconds of cooldown left, paused, the breaker state and seconds until it changes, since when the rate sits at its floor, and whether expiry may delete it.';

CREATE FUNCTION ratebucket.bucket_expire(idle interval DEFAULT '1 hour')
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint := 0;
	deleted bigint;
	stmt text;
	p record;
	failed text;
BEGIN
	IF idle IS NULL OR idle OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
		RAISE EXCEPTION 'idle must be a non-negative interval'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Lock the candidates in endpoint order, skipping rows another
	-- transaction holds (a bucket being taken from is not idle): two
	-- expiries, or an expiry and a claim taking several buckets in
	-- endpoint order, never wait for each other in a cycle.  The locking
	-- re-checks the conditions against the newest version of each row.
	-- %1$s is the table: the buckets, or on Citus each of their shards.
	stmt := pg_catalog.format(
		'WITH d AS (DELETE FROM %%1$s AS b'
		' USING (SELECT c.ctid AS tid FROM %%1$s AS c'
		'        WHERE c.conf_rate IS NULL'
		'          AND c.refilled_at OPERATOR(pg_catalog.<=)'
		'              (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) %L::pg_catalog.interval)'
		'          AND (ratebucket.bucket_now(ROW(c.*)::ratebucket.buckets,'
		'                                     pg_catalog.clock_timestamp())).expirable'
		'        ORDER BY c.endpoint'
		'        FOR UPDATE SKIP LOCKED) AS v'
		' WHERE b.ctid OPERATOR(pg_catalog.=) v.tid RETURNING 1)'
		' SELECT pg_catalog.count(*) FROM d', idle);
	IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS d
				   WHERE d.logicalrelid OPERATOR(pg_catalog.=) 'ratebucket.buckets'::pg_catalog.regclass) THEN
			-- Citus: on each shard, on the node that holds it, each in a
			-- transaction of its own; a shard with several placements
			-- counted once
			FOR p IN SELECT r.shardid,
							pg_catalog.bool_and(r.success) AS success,
							pg_catalog.max(r.result) FILTER (WHERE r.success) AS deleted,
							pg_catalog.string_agg(r.nodename OPERATOR(pg_catalog.||) ':'
												  OPERATOR(pg_catalog.||) r.nodeport
												  OPERATOR(pg_catalog.||) ': '
												  OPERATOR(pg_catalog.||) r.result, '; ')
								FILTER (WHERE NOT r.success) AS failure
					 FROM pg_catalog.run_command_on_placements('ratebucket.buckets', stmt) AS r
					 GROUP BY r.shardid ORDER BY r.shardid
			LOOP
				n := n OPERATOR(pg_catalog.+) COALESCE(p.deleted::pg_catalog.int8, 0);
				IF NOT p.success THEN
					failed := pg_catalog.concat_ws('; ', failed,
						pg_catalog.format('shard %s (%s)', p.shardid, p.failure));
				END IF;
			END LOOP;
			IF failed IS NOT NULL THEN
				RAISE EXCEPTION 'could not expire the buckets of every shard: %', failed
					USING ERRCODE = 'connection_exception',
						  DETAIL = pg_catalog.format('The other shards expired on their own: %s buckets were deleted there.',
													 n);
			END IF;
			RETURN n;
		END IF;
	END IF;
	EXECUTE pg_catalog.format(stmt, 'ratebucket.buckets') INTO deleted;
	RETURN deleted;
END;
$$;

COMMENT ON FUNCTION ratebucket.bucket_expire(interval) IS
'Delete buckets that were not configured, have not been refilled for idle, are full now, and hold nothing learned from feedback (a lowered rate, a cooldown, a pause, an open breaker, a run of failures): a later take recreates them full, so expiry changes no decision. Returns the number deleted. On Citus each shard expires on its node, in a transaction of its own.';

--
-- Scale-out (Citus)
--
-- distribute: on a Citus coordinator, distribute ratebucket's tables by
-- endpoint (the stripes and the in-flight caps co-located with the
-- buckets, the templates a reference table on every node) and register
-- every function that works on one endpoint as a distributed function on
-- its first argument, so that a bare SELECT of it runs on the node that
-- holds the endpoint.  Idempotent: what is already distributed is left as
-- it is.  See doc/citus.md.
--
-- Long: 69 of its lines are the text of the bucket_status view in its
-- Citus form, one statement that it runs here and sends to every worker.
-- The rest are its three steps, each a short loop or check: the tables,
-- the view, and the functions, which are co-located with the buckets and
-- so come after them.
--
CREATE FUNCTION ratebucket.distribute(shard_count int DEFAULT NULL)
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t record;
	f regprocedure;
	status_view text;
	failed text;
BEGIN
	IF pg_catalog.to_regproc('pg_catalog.create_distributed_table') IS NULL THEN
		RAISE EXCEPTION 'Citus is not installed in this database'
			USING ERRCODE = 'feature_not_supported',
				  HINT = 'Run CREATE EXTENSION citus, then ratebucket.distribute() on the coordinator.';
	END IF;
	IF shard_count IS NOT NULL AND shard_count OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'shard_count must be at least 1'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR t IN SELECT * FROM (VALUES
			(1, 'ratebucket.buckets'::regclass, 'endpoint', NULL::text),
			(2, 'ratebucket.bucket_stripes'::regclass, 'endpoint', 'ratebucket.buckets'),
			(3, 'ratebucket.inflight_caps'::regclass, 'key', 'ratebucket.buckets'),
			(4, 'ratebucket.inflight_slots'::regclass, 'key', 'ratebucket.buckets'),
			(5, 'ratebucket.bucket_templates'::regclass, NULL, NULL)) AS v(o, rel, col, colocate)
		ORDER BY o
	LOOP
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition AS p
				   WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.rel) THEN
			object := t.rel::text; action := 'already distributed';
		ELSIF t.col IS NULL THEN
			-- the templates' statement trigger only tells the sessions of
			-- the node it fires on to read the templates again, which is
			-- what each node needs: "unsafe" triggers are safe here
			PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
			PERFORM pg_catalog.create_reference_table(t.rel);
			object := t.rel::text; action := 'reference table';
		ELSIF t.colocate IS NULL THEN
			PERFORM pg_catalog.create_distributed_table(t.rel, t.col, shard_count => shard_count);
			object := t.rel::text; action := 'distributed by ' || t.col;
		ELSE
			PERFORM pg_catalog.create_distributed_table(t.rel, t.col, colocate_with => t.colocate);
			object := t.rel::text;
			action := 'distributed by ' || t.col || ', co-located with ' || t.colocate;
		END IF;
		RETURN NEXT;
	END LOOP;
	-- The status view, in a form Citus can plan, here and on every worker:
	-- a striped endpoint's stripes hash to other shards than its row, so
	-- they are found by their keys, listed first (keys), which Citus runs
	-- as a step of its own; the rows go to the functions as
	-- ROW(b.*)::ratebucket.buckets, which a shard's own row type becomes
	-- there.  (On one node the view looks each stripe up from its
	-- endpoint's row instead, which reads only the stripes of the rows it
	-- returns; Citus refuses that join.)
	status_view := $view$
CREATE OR REPLACE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   COALESCE(st.tokens, n.tokens) AS tokens,
	   n.effective_rate,
	   n.cooldown_seconds,
	   n.paused,
	   n.breaker,
	   n.breaker_seconds,
	   n.at_floor_since,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.conf_floor_rate,
	   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
				b.last_granted_at) AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
					b.created_at) AS idle,
	   b.takes_granted OPERATOR(pg_catalog.+) COALESCE(st.takes_granted, 0) AS takes_granted,
	   b.tokens_granted OPERATOR(pg_catalog.+) COALESCE(st.tokens_granted, 0) AS tokens_granted,
	   b.successes,
	   b.failures,
	   b.throttles,
	   b.cooldowns,
	   b.breaker_opens,
	   b.malformed_headers,
	   b.failure_run,
	   b.last_status,
	   b.last_observed_at,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at,
	   b.quota_period,
	   b.quota_time_zone,
	   CASE WHEN b.quota_period IS NOT NULL THEN b.conf_capacity END AS quota,
	   q.used AS quota_used,
	   q.remaining AS quota_remaining,
	   q.window_start AS quota_window_start,
	   q.resets_at AS quota_resets_at,
	   COALESCE(r.stripes, 1) AS stripes,
	   b.template,
	   CASE WHEN n.paused THEN b.paused_until END AS paused_until
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(ROW(b.*)::ratebucket.buckets,
											  pg_catalog.clock_timestamp()) AS n
	 CROSS JOIN LATERAL ratebucket.quota_now(ROW(b.*)::ratebucket.buckets,
											 pg_catalog.clock_timestamp()) AS q
	 LEFT JOIN (
		 WITH keys AS MATERIALIZED (
			 SELECT k.endpoint, ratebucket.stripe_key(k.endpoint, i, k.stripes) AS key
			 FROM ratebucket.bucket_stripes AS k,
				  pg_catalog.generate_series(0, k.stripes OPERATOR(pg_catalog.-) 1) AS i)
		 SELECT keys.endpoint,
				pg_catalog.sum((ratebucket.bucket_now(ROW(s.*)::ratebucket.buckets,
													  pg_catalog.clock_timestamp())).tokens) AS tokens,
				pg_catalog.max(s.last_granted_at) AS last_granted_at,
				CAST(pg_catalog.sum(s.takes_granted) AS pg_catalog.int8) AS takes_granted,
				pg_catalog.sum(s.tokens_granted) AS tokens_granted
		 FROM keys
			  JOIN ratebucket.buckets AS s ON s.endpoint OPERATOR(pg_catalog.=) keys.key
		 GROUP BY keys.endpoint
	 ) AS st ON st.endpoint OPERATOR(pg_catalog.=) b.endpoint
WHERE pg_catalog.octet_length(b.endpoint) OPERATOR(pg_catalog.<=) 1024;
$view$;
	object := 'ratebucket.bucket_status';
	IF pg_catalog.pg_get_viewdef('ratebucket.bucket_status'::pg_catalog.regclass)
	   OPERATOR(pg_catalog.~) 'WITH keys AS' THEN
		action := 'already in its Citus form';
	ELSE
		action := 'replaced by its Citus form, here and on every worker';
	END IF;
	EXECUTE status_view;
	SELECT pg_catalog.string_agg(w.nodename OPERATOR(pg_catalog.||) ':'
								 OPERATOR(pg_catalog.||) w.nodeport
								 OPERATOR(pg_catalog.||) ': '
								 OPERATOR(pg_catalog.||) w.result, '; ')
	INTO failed
	-- (a worker refuses DDL on the extension's objects unless told this
	-- is not to be propagated)
	FROM pg_catalog.run_command_on_workers(
			 'SET citus.enable_ddl_propagation TO off; ' OPERATOR(pg_catalog.||) status_view) AS w
	WHERE NOT w.success;
	IF failed IS NOT NULL THEN
		RAISE EXCEPTION 'could not replace ratebucket.bucket_status on every worker: %', failed
			USING ERRCODE = 'connection_exception';
	END IF;
	RETURN NEXT;
	FOR f IN SELECT p.oid::regprocedure
			 FROM pg_catalog.pg_proc AS p
			 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'ratebucket'::regnamespace
			   AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY[
					 'bucket_take', 'bucket_take_upto', 'bucket_ready', 'bucket_wait',
					 'bucket_claimable', 'bucket_grantable', 'bucket_configure',
					 'bucket_configure_quota', 'bucket_stripe', 'bucket_observe',
					 'bucket_pause', 'bucket_resume', 'bucket_reset', 'bucket_drop',
					 'inflight_configure', 'inflight_acquire', 'inflight_release',
					 'inflight_renew', 'inflight_drop'])
			 ORDER BY 1::text
	LOOP
		object := f::text;
		IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_object AS d
				   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
					 AND d.objid OPERATOR(pg_catalog.=) f::oid
					 AND d.distribution_argument_index IS NOT NULL) THEN
			action := 'already delegated';
		ELSE
			PERFORM pg_catalog.create_distributed_function(f, '$1',
														   colocate_with => 'ratebucket.buckets');
			action := 'delegated on its first argument';
		END IF;
		RETURN NEXT;
	END LOOP;
END;
$$;

COMMENT ON FUNCTION ratebucket.distribute(int) IS
'On a Citus coordinator: distribute the buckets by endpoint (shard_count: Citus''s default when NULL), co-locate the stripes and the in-flight caps with them, make the templates a reference table, and register every per-endpoint function to run on the node that holds its endpoint. Idempotent; one row per table and function, saying what was done.';

--
-- Views (monitoring)
--

-- One row per endpoint, striped or not (a striped endpoint's tokens and
-- take counters are its stripes', summed; the stripes' own rows are not
-- listed), with the quota columns, the stripe count and the template at
-- the end.  On a Citus cluster distribute() replaces it
-- with a form Citus can plan (see there): the same columns.
CREATE VIEW ratebucket.bucket_status AS
SELECT b.endpoint,
	   b.rate,
	   b.capacity,
	   COALESCE(st.tokens, n.tokens) AS tokens,
	   n.effective_rate,
	   n.cooldown_seconds,
	   n.paused,
	   n.breaker,
	   n.breaker_seconds,
	   n.at_floor_since,
	   b.conf_rate IS NOT NULL AS configured,
	   b.conf_rate,
	   b.conf_capacity,
	   b.conf_floor_rate,
	   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
				b.last_granted_at) AS last_used,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
		   COALESCE(GREATEST(st.last_granted_at, b.last_granted_at),
					b.created_at) AS idle,
	   b.takes_granted OPERATOR(pg_catalog.+) COALESCE(st.takes_granted, 0) AS takes_granted,
	   b.tokens_granted OPERATOR(pg_catalog.+) COALESCE(st.tokens_granted, 0) AS tokens_granted,
	   b.successes,
	   b.failures,
	   b.throttles,
	   b.cooldowns,
	   b.breaker_opens,
	   b.malformed_headers,
	   b.failure_run,
	   b.last_status,
	   b.last_observed_at,
	   b.refilled_at,
	   b.created_at,
	   b.configured_at,
	   b.quota_period,
	   b.quota_time_zone,
	   CASE WHEN b.quota_period IS NOT NULL THEN b.conf_capacity END AS quota,
	   q.used AS quota_used,
	   q.remaining AS quota_remaining,
	   q.window_start AS quota_window_start,
	   q.resets_at AS quota_resets_at,
	   COALESCE(r.stripes, 1) AS stripes,
	   b.template,
	   CASE WHEN n.paused THEN b.paused_until END AS paused_until
FROM ratebucket.buckets AS b
	 LEFT JOIN ratebucket.bucket_stripes AS r
		 ON r.endpoint OPERATOR(pg_catalog.=) b.endpoint
	 CROSS JOIN LATERAL ratebucket.bucket_now(b, pg_catalog.clock_timestamp()) AS n
	 CROSS JOIN LATERAL ratebucket.quota_now(b, pg_catalog.clock_timestamp()) AS q
	 LEFT JOIN LATERAL (
		 SELECT pg_catalog.sum((ratebucket.bucket_now(s, pg_catalog.clock_timestamp())).tokens) AS tokens,
				pg_catalog.max(s.last_granted_at) AS last_granted_at,
				CAST(pg_catalog.sum(s.takes_granted) AS pg_catalog.int8) AS takes_granted,
				pg_catalog.sum(s.tokens_granted) AS tokens_granted
		 FROM pg_catalog.generate_series(0, r.stripes OPERATOR(pg_catalog.-) 1) AS i
			  JOIN ratebucket.buckets AS s
				  ON s.endpoint OPERATOR(pg_catalog.=) ratebucket.stripe_key(b.endpoint, i, r.stripes)
	 ) AS st ON r.stripes IS NOT NULL
WHERE pg_catalog.octet_length(b.endpoint) OPERATOR(pg_catalog.<=) 1024;

COMMENT ON VIEW ratebucket.bucket_status IS
'One row per bucket: its limits, the tokens it holds now, its effective rate, cooldown, pause and breaker, its configuration, when it was last used, and its counters.';
COMMENT ON COLUMN ratebucket.bucket_status.tokens IS
'Tokens the bucket holds now (refilled to the current clock), not the stored value.';
COMMENT ON COLUMN ratebucket.bucket_status.effective_rate IS
'Tokens per second now: the rate, lowered by feedback and recovering toward it.';
COMMENT ON COLUMN ratebucket.bucket_status.cooldown_seconds IS
'Seconds of cooldown left (0: none).';
COMMENT ON COLUMN ratebucket.bucket_status.breaker IS
'closed, open or half-open.';
COMMENT ON COLUMN ratebucket.bucket_status.breaker_seconds IS
'Seconds until an open breaker turns half-open (0 otherwise).';
COMMENT ON COLUMN ratebucket.bucket_status.at_floor_since IS
'Since when the effective rate sits at its floor; NULL when above it. Alert on it.';
COMMENT ON COLUMN ratebucket.bucket_status.last_used IS
'Clock of the last granted take; NULL if none yet.';
COMMENT ON COLUMN ratebucket.bucket_status.idle IS
'Time since the last granted take (or since creation, if none).';
COMMENT ON COLUMN ratebucket.bucket_status.quota_period IS
'For a calendar quota: hour, day, week or month; NULL for a rate bucket.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_time_zone IS
'For a calendar quota: the time zone of its calendar.';
COMMENT ON COLUMN ratebucket.bucket_status.quota IS
'For a calendar quota: the tokens it grants per window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_used IS
'For a calendar quota: tokens granted in the current window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_remaining IS
'For a calendar quota: tokens left in the current window.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_window_start IS
'For a calendar quota: when the current window started.';
COMMENT ON COLUMN ratebucket.bucket_status.quota_resets_at IS
'For a calendar quota: when the quota resets (the current window ends).';
COMMENT ON COLUMN ratebucket.bucket_status.stripes IS
'Rows the bucket is striped over (1: not striped); see bucket_stripe.';
COMMENT ON COLUMN ratebucket.bucket_status.paused_until IS
'While paused: until when (infinity: until bucket_resume); NULL otherwise.';
COMMENT ON COLUMN ratebucket.bucket_status.template IS
'The template the endpoint was configured by and follows (bucket_template); NULL if configured by bucket_configure or not at all.';

CREATE VIEW ratebucket.inflight_status AS
SELECT c.key,
	   c.cap,
	   c.lease,
	   pg_catalog.count(s.slot) FILTER (
		   WHERE s.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS in_flight,
	   pg_catalog.count(s.slot) FILTER (
		   WHERE s.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS expired,
	   pg_catalog.min(s.acquired_at) AS oldest,
	   c.configured_at
FROM ratebucket.inflight_caps AS c
LEFT JOIN ratebucket.inflight_slots AS s ON s.key OPERATOR(pg_catalog.=) c.key
GROUP BY c.key, c.cap, c.lease, c.configured_at;

COMMENT ON VIEW ratebucket.inflight_status IS
'One row per in-flight cap: the cap, the lease, the slots held (in_flight), those whose lease ran out and that the next acquire will reclaim (expired), and when the oldest slot was acquired.';

-- What limits each endpoint, in one row: what holds a take of it now, if
-- anything (the first that applies: paused, breaker open, cooldown, quota
-- spent, no tokens, cap full) and until when, then each limit's figures:
-- the bucket, its feedback state, its quota, the in-flight cap keyed like
-- the endpoint, its stripes.  The view to open first when an endpoint's
-- sends wait.
CREATE VIEW ratebucket.endpoint_limits AS
SELECT s.endpoint,
	   h.held_by,
	   h.until,
	   s.tokens,
	   s.capacity,
	   s.effective_rate,
	   COALESCE(s.conf_rate, s.rate) AS configured_rate,
	   s.conf_floor_rate AS floor_rate,
	   s.at_floor_since,
	   s.cooldown_seconds,
	   s.breaker,
	   s.breaker_seconds,
	   s.paused,
	   s.paused_until,
	   s.quota,
	   s.quota_used,
	   s.quota_remaining,
	   s.quota_resets_at,
	   i.cap,
	   i.in_flight,
	   s.stripes,
	   s.configured,
	   s.template
FROM ratebucket.bucket_status AS s
	 LEFT JOIN ratebucket.inflight_status AS i ON i.key OPERATOR(pg_catalog.=) s.endpoint
	 CROSS JOIN LATERAL (
		 SELECT CASE WHEN s.paused THEN 'paused'
					 WHEN s.breaker OPERATOR(pg_catalog.=) 'open' THEN 'breaker open'
					 WHEN s.cooldown_seconds OPERATOR(pg_catalog.>) 0 THEN 'cooldown'
					 WHEN s.quota IS NOT NULL
						  AND s.quota_remaining OPERATOR(pg_catalog.<) 1 THEN 'quota spent'
					 WHEN s.quota IS NULL AND s.tokens OPERATOR(pg_catalog.<) 1 THEN 'no tokens'
					 WHEN i.in_flight OPERATOR(pg_catalog.>=) i.cap THEN 'cap full'
				END AS held_by,
				CASE WHEN s.paused
						  THEN NULLIF(s.paused_until, 'infinity'::pg_catalog.timestamptz)
					 WHEN s.breaker OPERATOR(pg_catalog.=) 'open'
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs => s.breaker_seconds)
					 WHEN s.cooldown_seconds OPERATOR(pg_catalog.>) 0
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs => s.cooldown_seconds)
					 WHEN s.quota IS NOT NULL
						  AND s.quota_remaining OPERATOR(pg_catalog.<) 1 THEN s.quota_resets_at
					 WHEN s.quota IS NULL AND s.tokens OPERATOR(pg_catalog.<) 1
						  AND s.effective_rate OPERATOR(pg_catalog.>) 0
						  THEN pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)
							   pg_catalog.make_interval(secs =>
								   (1 OPERATOR(pg_catalog.-) s.tokens) OPERATOR(pg_catalog./) s.effective_rate)
				END AS until) AS h;

COMMENT ON VIEW ratebucket.endpoint_limits IS
'One row per endpoint: what holds a take of it now (paused, breaker open, cooldown, quota spent, no tokens, cap full; NULL: nothing) and until when, then every limit in force: the bucket, its rate against the configured one and its floor, cooldown, breaker, pause, quota, the in-flight cap keyed like the endpoint, stripes.';
COMMENT ON COLUMN ratebucket.endpoint_limits.held_by IS
'What refuses a take now, the first that applies: paused, breaker open, cooldown, quota spent, no tokens, cap full; NULL when a take would be granted.';
COMMENT ON COLUMN ratebucket.endpoint_limits.until IS
'When held_by lets go: the end of the pause (NULL: until bucket_resume), of the open breaker, of the cooldown, the quota''s reset, the next token; NULL for a full cap (a slot frees when a delivery is recorded or its lease ends).';
COMMENT ON COLUMN ratebucket.endpoint_limits.cap IS
'The in-flight cap whose key is the endpoint (inflight_configure), if there is one.';

--
-- Token reserves in shared memory (hot endpoints; the library preloaded)
--

CREATE FUNCTION ratebucket.bucket_reserve(
	endpoint text,
	batch int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_reserve(text, int) IS
'Give a configured endpoint a token reserve in shared memory: takes draw from it without writing the row, and the take that finds it empty moves up to batch tokens into it from the row. NULL takes the reserve away. Needs ratebucket in shared_preload_libraries. Returns the batch it had (NULL if none).';

CREATE FUNCTION ratebucket.bucket_reserves(
	OUT endpoint text,
	OUT tokens float8,
	OUT pending float8,
	OUT drawn float8,
	OUT batch int,
	OUT rate float8,
	OUT capacity float8,
	OUT draws bigint,
	OUT tokens_drawn float8,
	OUT refills bigint,
	OUT drains bigint,
	OUT created_at timestamptz,
	OUT last_refill_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'ratebucket_reserves'
LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 10;

COMMENT ON FUNCTION ratebucket.bucket_reserves() IS
'The token reserves of this database''s endpoints now: tokens ready to draw, pending (moved by refills not yet committed), drawn (by takes not yet committed), the batch and limits they were filled under, committed draws and refills since the reserve was made, and how often feedback or a change emptied it.';

--
-- Grants
--
-- Nothing is open to PUBLIC but the pure functions: the arithmetic
-- (refill_tokens, bucket_now, quota_window, quota_now, stripe_key), which
-- only computes from its arguments or a row its caller already has, and the
-- header parsers.  An administrator grants roles what they need (see
-- README, "Privileges"): workers EXECUTE on the takes, the peeks, the claim
-- helpers, bucket_observe and the in-flight slots; operators also the
-- configuration and administration functions; both SELECT on the views.
-- The C functions reach the tables as their owner, and the in-flight
-- functions run as it, so no role needs (or should get) privileges on the
-- tables themselves.
--
REVOKE ALL ON ALL TABLES IN SCHEMA ratebucket FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ratebucket FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
	ratebucket.refill_tokens(float8, float8, float8, timestamptz, timestamptz),
	ratebucket.bucket_now(ratebucket.buckets, timestamptz),
	ratebucket.parse_retry_after(text, timestamptz),
	ratebucket.parse_rate_limit(jsonb, timestamptz),
	ratebucket.quota_window(text, text, timestamptz),
	ratebucket.quota_now(ratebucket.buckets, timestamptz),
	ratebucket.stripe_key(text, int, int)
	TO PUBLIC;
