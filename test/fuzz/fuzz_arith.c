/*-------------------------------------------------------------------------
 *
 * fuzz_arith.c
 *	  libFuzzer target for the bucket arithmetic (src/core/arith.c), the
 *	  adaptation state machine (src/core/adapt.c) and the feedback policy
 *	  (src/core/feedback.c): the shipped code, not a copy.
 *
 * The fuzz data is a program: a policy, a starting clock, then a sequence
 * of operations on one simulated bucket row (take, peek, observe an outcome,
 * cool down, lower the factor, pause, resume, clock steps forward and back),
 * each decoded from the next bytes.  The policy is rb_policy_resolve's of
 * fuzzed settings and configuration; a take follows src/bucket/bucket.c
 * (rb_bucket_decide, and what is stored after a grant), and an observe is
 * rb_feedback_observe itself, as src/engine/observe.c calls it, on a
 * response whose Retry-After and rate-limit fields are fuzzed text: the
 * arguments stay within the ranges the SQL layer lets through
 * (src/api/args.c, src/bucket/settings.c).  After every step the invariants of
 * the row are checked, and abort() is called on a violation:
 *
 *	 - tokens finite, within [0, capacity] (the table's CHECK);
 *	 - refilled_at never moves backwards;
 *	 - a take's remaining within [0, capacity], its wait_seconds finite and
 *	   >= 0, and 0 when allowed; a denied take of a paused / open / probing
 *	   bucket waits until the gate's time;
 *	 - a caller that waits wait_seconds (rounded up to the microsecond), with
 *	   the same limits and nothing else changed, is granted (rb_wait_seconds'
 *	   promise), for clocks within EXACT_USECS;
 *	 - rate_factor stored in (0, 1], rb_factor_now within [floor, 1], the
 *	   throttle episode's curve never falling as time goes on, the capacity
 *	   in force within [min(1, capacity), capacity];
 *	 - a 429 lowers the rate once per episode: one to a request sent before
 *	   the last episode's cooldown ended lowers nothing, a new one brings it
 *	   below the rate its request was sent at, to throttle_factor of it (or
 *	   the floor) when no earlier episode left a level to go back to;
 *	 - a remaining count leaves no more tokens than it says;
 *	 - the cooldown never shrinks, and rb_clamp_cooldown stays in
 *	   [min_cooldown, max_cooldown];
 *	 - the breaker: closed means no trips and no probe; open periods within
 *	   [breaker_open, breaker_max_open]; breaker_failures consecutive
 *	   failures open a closed breaker; the probe's non-failure answer closes
 *	   a half-open one; breaker_failures 0 keeps it closed.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/adapt.h"
#include "core/arith.h"
#include "core/feedback.h"

/* PostgreSQL's timestamptz range (MIN_TIMESTAMP, END_TIMESTAMP). */
#define PG_MIN_TS INT64_C(-211813488000000000)
#define PG_END_TS INT64_C(9223371331200000000)
/* The clock stays below this, so that now + a cooldown stays in range. */
#define CLOCK_MAX (PG_END_TS - INT64_C(10000000000000))

/* Limits of src/bucket/bucket.h and src/bucket/settings.c. */
#define MIN_RATE 1e-9
#define MAX_RATE 1e12
#define MAX_CAPACITY 1e12
#define INT_MAX_MS ((int64_t) 2147483647)

#define MAX_STEPS 64

/*
 * Times are exact in a double up to 2^53 microseconds (year 2255).  Beyond,
 * the differences arith.c and bucket.c compute in double round, and a denied
 * take one microsecond before the end of a pause may be told to wait 0 s:
 * harmless, and only for clocks centuries ahead, so "a denial waits more
 * than 0" is checked only within this range.
 */
#define EXACT_USECS INT64_C(9007199254740992)

#define CHECK(cond) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "fuzz_arith: invariant violated at %s:%d: %s\n", \
					__FILE__, __LINE__, #cond); \
			dump_state(); \
			abort(); \
		} \
	} while (0)

/* ------------------------------------------------------------ the data -- */

typedef struct Reader
{
	const uint8_t *p;
	size_t		left;
} Reader;

static uint64_t
rd_u64(Reader *r, int nbytes)
{
	uint64_t	v = 0;
	int			i;

	for (i = 0; i < nbytes; i++)
	{
		v <<= 8;
		if (r->left > 0)
		{
			v |= *r->p++;
			r->left--;
		}
	}
	return v;
}

static unsigned
rd_u8(Reader *r)
{
	return (unsigned) rd_u64(r, 1);
}

/* A fraction in [0, 1] from 4 bytes. */
static double
rd_frac(Reader *r)
{
	return (double) rd_u64(r, 4) / 4294967295.0;
}

/*
 * A number within [lo, hi] (0 < lo): mostly log-uniform, sometimes one of
 * the edges, or the raw bits of a double when they happen to fall in range.
 */
static double
rd_bounded(Reader *r, double lo, double hi)
{
	unsigned	how = rd_u8(r) % 8;
	double		v;

	switch (how)
	{
		case 0:
			return lo;
		case 1:
			return hi;
		case 2:
			return nextafter(lo, hi);
		case 3:
			return nextafter(hi, lo);
		case 4:
			{
				uint64_t	bits = rd_u64(r, 8);

				memcpy(&v, &bits, sizeof(v));
				if (isfinite(v) && v >= lo && v <= hi)
					return v;
				return lo;
			}
		case 5:
			/* small integers: 1, 2, ... */
			v = (double) (rd_u8(r) + 1);
			return v < lo ? lo : v > hi ? hi : v;
		default:
			v = lo * pow(hi / lo, rd_frac(r));
			return v < lo ? lo : v > hi ? hi : v;
	}
}

/* A duration in microseconds, 0 to max, often small. */
static int64_t
rd_usecs(Reader *r, int64_t max)
{
	unsigned	how = rd_u8(r) % 6;
	uint64_t	v;

	switch (how)
	{
		case 0:
			return 0;
		case 1:
			return 1;
		case 2:
			v = rd_u64(r, 2);	/* up to 65 ms */
			break;
		case 3:
			v = rd_u64(r, 4);	/* up to 71 minutes */
			break;
		default:
			v = rd_u64(r, 8);
			break;
	}
	return (int64_t) (v % ((uint64_t) max + 1));
}

/* ----------------------------------------------------------- the state -- */

/* One simulated row of ratebucket.buckets: what arith.c and adapt.c see. */
typedef struct Row
{
	double		rate;			/* limits of the last grant */
	double		capacity;
	RbState		state;
	RbAdapt		adapt;
	RbFeedbackCounters counters;
} Row;

static Row	row;
static RbSettings settings;		/* the ratebucket.* settings */
static RbOverrides overrides;	/* the bucket's configuration */
static RbPolicy policy;			/* rb_policy_resolve of both */
static int64_t now;
static int	step_no;
static unsigned last_op;

static void
dump_state(void)
{
	fprintf(stderr,
			"  step %d op %u now %lld\n"
			"  row: rate %.17g capacity %.17g tokens %.17g refilled_at %lld\n"
			"  adapt: rate_factor %.17g factor_at %lld cooldown_until %lld "
			"at_floor_since %lld paused_until %lld failure_run %d trips %d "
			"open_until %lld probe_at %lld target %.17g limit %.17g burst %.17g\n"
			"  policy: throttle %.17g floor %.17g recovery %.17g/%.17gs "
			"cooldown default %lld min %lld max %lld breaker %d open %lld max %lld\n",
			step_no, last_op, (long long) now,
			row.rate, row.capacity, row.state.tokens,
			(long long) row.state.refilled_at,
			row.adapt.rate_factor, (long long) row.adapt.factor_at,
			(long long) row.adapt.cooldown_until,
			(long long) row.adapt.at_floor_since,
			(long long) row.adapt.paused_until, row.adapt.failure_run,
			row.adapt.breaker_trips, (long long) row.adapt.open_until,
			(long long) row.adapt.probe_at, row.adapt.target_factor,
			row.adapt.limit_factor, row.adapt.limit_burst_factor,
			policy.throttle_factor, policy.floor_factor,
			policy.recovery_factor, policy.recovery_interval,
			(long long) policy.default_cooldown,
			(long long) policy.min_cooldown, (long long) policy.max_cooldown,
			policy.breaker_failures, (long long) policy.breaker_open,
			(long long) policy.breaker_max_open);
}

/* The policy in force for a ceiling, as bucket/bucket.c resolves it. */
static void
set_floor(double ceiling)
{
	rb_policy_resolve(&settings, &overrides, ceiling, &policy);
}

/* The invariants that hold of the row between any two steps. */
static void
check_row(int64_t prev_refilled_at)
{
	double		f;

	CHECK(isfinite(row.state.tokens));
	CHECK(row.state.tokens >= 0.0);
	CHECK(row.state.tokens <= row.capacity);
	CHECK(row.state.refilled_at >= prev_refilled_at);

	CHECK(isfinite(row.adapt.rate_factor));
	CHECK(row.adapt.rate_factor > 0.0 && row.adapt.rate_factor <= 1.0);
	set_floor(row.rate);
	f = rb_factor_now(&row.adapt, &policy, now);
	CHECK(isfinite(f));
	CHECK(f >= policy.floor_factor && f <= 1.0);
	CHECK(f > 0.0);

	CHECK(row.adapt.failure_run >= 0);
	CHECK(row.adapt.breaker_trips >= 0);
	if (row.adapt.open_until == RB_NO_TIME)
	{
		CHECK(row.adapt.breaker_trips == 0);
		CHECK(row.adapt.probe_at == RB_NO_TIME);
	}
	else
		CHECK(row.adapt.breaker_trips >= 1);
	if (row.adapt.probe_at != RB_NO_TIME)
		CHECK(row.adapt.open_until != RB_NO_TIME);
}

/* ------------------------------------------------------------ the steps -- */

/*
 * A take of "want" with the limits (rate, capacity), the bucket's feedback
 * on top: rb_decide_take, as src/bucket/bucket.c calls it, with checks of the gate
 * it will meet.  On *write, the row gets the take's limits.
 */
static RbTakeResult
decide(Row *b, double rate, double capacity, double want, int64_t at,
	   RbGateReason *gate_out, int64_t *until_out, bool *write)
{
	RbTakeResult result;
	RbGateReason gate;
	int64_t		until;
	double		effective;

	set_floor(rate);
	gate = rb_gate(&b->adapt, &policy, at, &until);
	effective = rate * rb_factor_now(&b->adapt, &policy, at);
	*gate_out = gate;
	*until_out = until;

	switch (gate)
	{
		case RB_GATE_OPEN:
		case RB_GATE_PROBE:
			CHECK(until == at);
			break;
		case RB_GATE_PAUSED:
			CHECK(until == b->adapt.paused_until && until > at);
			break;
		case RB_GATE_BREAKER_OPEN:
			CHECK(until == b->adapt.open_until && until > at);
			CHECK(rb_breaker_state(&b->adapt, at) == RB_BREAKER_OPEN);
			break;
		case RB_GATE_PROBE_IN_FLIGHT:
			CHECK(until > at);
			CHECK(rb_breaker_state(&b->adapt, at) == RB_BREAKER_HALF_OPEN);
			CHECK(b->adapt.probe_at != RB_NO_TIME);
			break;
		case RB_GATE_COOLDOWN:
			CHECK(until == b->adapt.cooldown_until && until > at);
			break;
		default:
			CHECK(!"unknown gate");
	}
	CHECK(isfinite(effective) && effective > 0.0);

	result = rb_decide_take(&b->state, &b->adapt, &policy, b->rate, b->capacity,
							rate, capacity, want, at, write);
	if (*write)
	{
		b->rate = rate;
		b->capacity = capacity;
	}
	return result;
}

static void
check_result(const RbTakeResult *r, double capacity, int64_t now)
{
	CHECK(r->allowed == 0 || r->allowed == 1);
	CHECK(isfinite(r->remaining));
	CHECK(r->remaining >= 0.0 && r->remaining <= capacity);
	CHECK(isfinite(r->wait_seconds));
	CHECK(r->wait_seconds >= 0.0);
	if (r->allowed)
		CHECK(r->wait_seconds == 0.0);
	else if (now > -EXACT_USECS && now < EXACT_USECS)
		CHECK(r->wait_seconds > 0.0);	/* see EXACT_USECS */
}

/* A take, as bucket_take(endpoint, rate, capacity, want) does it. */
static void
step_take(Reader *r, int peek_only)
{
	double		rate;
	double		capacity;
	double		want;
	Row			copy;
	RbTakeResult res;
	RbGateReason gate;
	int64_t		until;
	bool		write;

	/* often the limits already stored, sometimes new ones */
	if (rd_u8(r) % 4 == 0)
	{
		rate = rd_bounded(r, MIN_RATE, MAX_RATE);
		capacity = rd_bounded(r, nextafter(0.0, 1.0), MAX_CAPACITY);
	}
	else
	{
		rate = row.rate;
		capacity = row.capacity;
	}
	want = rd_bounded(r, nextafter(0.0, 1.0), capacity);	/* want <= capacity */

	copy = row;
	res = decide(&copy, rate, capacity, want, now, &gate, &until, &write);
	check_result(&res, capacity, now);
	if (gate == RB_GATE_PAUSED || gate == RB_GATE_BREAKER_OPEN ||
		gate == RB_GATE_PROBE_IN_FLIGHT)
	{
		CHECK(!res.allowed);
		CHECK(memcmp(&copy, &row, sizeof(row)) == 0);
	}
	/*
	 * A cooldown in force by the bucket's own clock grants nothing.  (Once
	 * a take has refilled past the cooldown's end, a clock that then steps
	 * back into the cooldown finds the tokens earned after it: those may be
	 * granted, as the design's "one clock" rule says.)
	 */
	if (gate == RB_GATE_COOLDOWN &&
		row.state.refilled_at <= row.adapt.cooldown_until)
		CHECK(!res.allowed);

	/*
	 * A denied take that only lacks tokens: waiting wait_seconds (rounded
	 * up to the microsecond, as a caller's clock ticks) must be enough, if
	 * the wait is short enough that the clock stays in range and nothing
	 * else changes by then.
	 */
	if (!res.allowed && (gate == RB_GATE_OPEN || gate == RB_GATE_COOLDOWN) &&
		rate == row.rate && capacity == row.capacity &&
		res.wait_seconds < 1e8)
	{
		int64_t		later = now + (int64_t) ceil(res.wait_seconds * RB_USECS_PER_SEC);
		Row			again = row;	/* a denied take stored nothing */
		RbTakeResult res2;
		RbGateReason gate2;
		int64_t		until2;
		bool		write2;

		if (later < EXACT_USECS && now > -EXACT_USECS &&
			row.state.refilled_at > -EXACT_USECS &&
			(row.adapt.paused_until == RB_NO_TIME || row.adapt.paused_until <= now) &&
			row.adapt.open_until == RB_NO_TIME &&
			row.adapt.rate_factor >= 1.0)
		{
			res2 = decide(&again, rate, capacity, want, later, &gate2, &until2,
						  &write2);
			check_result(&res2, capacity, later);
			if (!res2.allowed || gate2 != RB_GATE_OPEN)
				fprintf(stderr,
						"  take of %.17g at rate %.17g capacity %.17g: denied, wait %.17g s "
						"(remaining %.17g); at now + %lld us: gate %d, allowed %d, "
						"remaining %.17g, wait %.17g s, factor %.17g\n",
						want, rate, capacity, res.wait_seconds, res.remaining,
						(long long) (later - now), (int) gate2, (int) res2.allowed,
						res2.remaining, res2.wait_seconds,
						rb_factor_now(&row.adapt, &policy, later));
			CHECK(gate2 == RB_GATE_OPEN);
			CHECK(res2.allowed);
		}
	}

	if (peek_only)
		return;					/* bucket_ready: nothing is stored */
	if (write)
		row = copy;				/* what ratebucket_take writes back */
	else
		CHECK(!res.allowed);
}

/* Unix seconds of the simulated clock (microseconds since 2000-01-01). */
static double
unix_now(void)
{
	return (double) now / RB_USECS_PER_SEC + 946684800.0;
}

/*
 * A header value for a response: absent, a small number, a delay, an
 * HTTP-date near the clock, a RateLimit-Policy or RateLimit item, or raw
 * bytes.  Written into buf (of size len).
 */
static const char *
rd_header(Reader *r, char *buf, size_t len, size_t *out_len)
{
	unsigned	how = rd_u8(r) % 8;
	static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	"Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	int			n = 0;

	switch (how)
	{
		case 0:
			*out_len = 0;
			return NULL;
		case 1:
			n = snprintf(buf, len, "%u", (unsigned) rd_u64(r, 1));
			break;
		case 2:
			n = snprintf(buf, len, "%llu", (unsigned long long) rd_u64(r, 4));
			break;
		case 3:
			{
				/* an IMF-fixdate within a day of the clock (weekday not checked) */
				double		t = unix_now() + (double) ((int64_t) rd_u64(r, 3) - 8388608) / 100.0;
				int64_t		secs = (int64_t) floor(t);
				int64_t		days_since = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
				int64_t		rem = secs - days_since * 86400;

				/* civil date from days since 1970-01-01 (Howard Hinnant's) */
				int64_t		z = days_since + 719468;
				int64_t		era = (z >= 0 ? z : z - 146096) / 146097;
				int64_t		doe = z - era * 146097;
				int64_t		yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
				int64_t		doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
				int64_t		mp = (5 * doy + 2) / 153;
				int64_t		d = doy - (153 * mp + 2) / 5 + 1;
				int64_t		m = mp < 10 ? mp + 3 : mp - 9;
				int64_t		y = yoe + era * 400 + (m <= 2);

				if (y < 1 || y > 9999)
					y = 2026;
				n = snprintf(buf, len, "%s, %02d %s %04d %02d:%02d:%02d GMT",
							 days[((days_since % 7) + 11) % 7], (int) d, months[m - 1],
							 (int) y, (int) (rem / 3600), (int) (rem / 60 % 60),
							 (int) (rem % 60));
			}
			break;
		case 4:
			n = snprintf(buf, len, "%u;w=%u", 1 + (unsigned) rd_u64(r, 2),
						 1 + (unsigned) rd_u8(r));
			break;
		case 5:
			n = snprintf(buf, len, "\"default\";r=%u;t=%u", (unsigned) rd_u8(r),
						 (unsigned) rd_u8(r));
			break;
		default:
			{
				size_t		k = rd_u8(r) % 24;
				size_t		i;

				for (i = 0; i < k && i + 1 < len; i++)
					buf[i] = (char) rd_u8(r);
				*out_len = i;
				return buf;
			}
	}
	if (n < 0)
		n = 0;
	*out_len = (size_t) n < len ? (size_t) n : len - 1;
	return buf;
}

/*
 * An outcome, as bucket_observe(endpoint, status, retry_after, headers)
 * decides it: rb_feedback_observe itself, on a response of fuzzed status
 * and fields, then the invariants it must keep.
 */
static void
step_observe(Reader *r)
{
	static const int statuses[] = {200, 204, 429, 503, 500, 408, 0, 404, 301, 599};
	char		bufs[6][48];
	RbResponse	resp;
	RbObservation obs;
	RbAdapt		before_adapt = row.adapt;
	RbFeedbackCounters before_counters = row.counters;
	RbBreakerState before_state;
	int64_t		before_cooldown = row.adapt.cooldown_until;
	int64_t		before_refilled = row.state.refilled_at;
	int32_t		before_run = row.adapt.failure_run;
	double		ceiling = row.rate;
	double		f_before;
	double		f_after;
	double		f_sent;
	int64_t		sent;
	bool		published;
	RbObserved	observed;
	RbRateLimit rl;
	RbRetryAfterKind ra_kind;
	double		ra_value;

	memset(&resp, 0, sizeof(resp));
	resp.status = statuses[rd_u8(r) % 10];
	switch (rd_u8(r) % 4)
	{
		case 0:
			resp.sent_at = RB_NO_TIME;
			break;
		case 1:
			/* a clock ahead of the database's */
			resp.sent_at = now + rd_usecs(r, INT64_C(100000000));
			break;
		default:
			resp.sent_at = now - rd_usecs(r, INT64_C(100000000));
			if (resp.sent_at < PG_MIN_TS)
				resp.sent_at = PG_MIN_TS;
			break;
	}
	resp.has_status = rd_u8(r) % 8 != 0;
	resp.retry_after = rd_header(r, bufs[0], sizeof(bufs[0]), &resp.retry_after_len);
	if (rd_u8(r) % 2)
	{
		resp.policy = rd_header(r, bufs[1], sizeof(bufs[1]), &resp.policy_len);
		resp.ratelimit = rd_header(r, bufs[2], sizeof(bufs[2]), &resp.ratelimit_len);
		resp.limit = rd_header(r, bufs[3], sizeof(bufs[3]), &resp.limit_len);
		resp.remaining = rd_header(r, bufs[4], sizeof(bufs[4]), &resp.remaining_len);
		resp.reset = rd_header(r, bufs[5], sizeof(bufs[5]), &resp.reset_len);
	}
	resp.retry_after_bad = rd_u8(r) % 16 == 0;
	resp.bad_fields = (int) (rd_u8(r) % 4 == 0);

	set_floor(ceiling);
	before_state = rb_breaker_state(&row.adapt, now);
	f_before = rb_factor_now(&row.adapt, &policy, now);
	sent = resp.sent_at == RB_NO_TIME || resp.sent_at > now ? now : resp.sent_at;
	f_sent = rb_factor_now(&row.adapt, &policy, sent);
	rb_read_response(&resp, unix_now(), &rl, &ra_kind, &ra_value);
	published = rl.has_limit && rl.has_window && rl.window_seconds > 0;

	observed.ceiling = ceiling;
	observed.capacity = row.capacity;
	/* the row's own limits, before the answer (as src/engine/observe.c) */
	observed.refill_rate = row.rate * f_before;
	observed.refill_capacity = rb_capacity_now(&row.adapt, &policy,
											   row.capacity, 0.0, now);
	observed.is_quota = false;
	observed.holds_tokens = true;
	rb_feedback_observe(&row.state, &row.adapt, &row.counters, &policy,
						&observed, &resp, now, unix_now(), &obs);
	check_row(before_refilled);
	f_after = rb_factor_now(&row.adapt, &policy, now);
	/*
	 * No more tokens than remaining, plus the row's refill since the send;
	 * never more than its own limits refilled (a remaining count only caps).
	 */
	if (rl.has_remaining && rl.remaining >= 0.0)
		CHECK(row.state.tokens <=
			  (rl.remaining +
			   (resp.sent_at == RB_NO_TIME ? 0.0 :
				observed.refill_rate * ((double) now - (double) sent) / 1e6)) *
			  (1.0 + 1e-9) + 1e-9);
	if (rl.has_remaining)
		CHECK(row.state.tokens <= observed.refill_capacity);

	/* what it reports is what the row now says */
	CHECK(obs.outcome == rb_response_outcome(&resp, unix_now()));
	CHECK(isfinite(obs.cooldown_seconds) && obs.cooldown_seconds >= 0.0);
	CHECK(obs.effective_rate == ceiling * f_after);
	CHECK(obs.breaker == rb_breaker_state(&row.adapt, now));
	if (row.adapt.cooldown_until != before_cooldown ||
		row.adapt.open_until != before_adapt.open_until ||
		row.adapt.breaker_trips != before_adapt.breaker_trips)
		CHECK(obs.adapt_changed);

	/*
	 * An answer never raises the rate (but a published limit, which may be
	 * higher than the one before), and the cooldown never shrinks.
	 */
	if (!published)
		CHECK(f_after <= f_before * (1.0 + 1e-12));
	if (before_cooldown != RB_NO_TIME)
		CHECK(row.adapt.cooldown_until >= before_cooldown);
	if (obs.outcome == RB_OUTCOME_THROTTLED || obs.outcome == RB_OUTCOME_UNAVAILABLE)
	{
		CHECK(row.adapt.cooldown_until != RB_NO_TIME);
		CHECK(row.adapt.cooldown_until >= now + policy.min_cooldown);
		CHECK(row.state.refilled_at >= row.adapt.cooldown_until ||
			  row.adapt.cooldown_until == before_cooldown);
	}

	/*
	 * Once per throttle episode: a 429 to a request sent before the last
	 * episode's cooldown ended (or, with no send time, one that meets a
	 * cooldown still running) leaves the curve as it was; one that starts
	 * an episode brings the rate to throttle_factor of the rate its request
	 * was sent at, or to the floor, and holds it there until its cooldown
	 * ends.
	 */
	if (obs.outcome == RB_OUTCOME_THROTTLED)
	{
		bool		same = resp.sent_at != RB_NO_TIME ?
			before_adapt.factor_at != RB_NO_TIME && sent < before_adapt.factor_at :
			before_cooldown != RB_NO_TIME && before_cooldown > now;

		/*
		 * A lock-out: the request sent within its first two tokens' time
		 * (or 0.1 s) after the last episode's cooldown ended, nothing but
		 * 429s heard since.  The rate holds where the episode put it until
		 * the new cooldown ends; a bare 429's cooldown is at most twice the
		 * last one, and never past 60 s.
		 */
		double		first = fmax(2.0 / (ceiling * f_sent) * 1e6, 100000.0);
		bool		locked = !same && before_cooldown != RB_NO_TIME &&
			before_adapt.factor_at == before_cooldown && sent >= before_cooldown &&
			(before_counters.last_observed_at == RB_NO_TIME ||
			 before_counters.last_observed_at < before_cooldown ||
			 before_counters.last_status == 429) &&
			(double) sent - (double) before_cooldown <= first;

		if (same || locked)
		{
			CHECK(row.adapt.rate_factor == before_adapt.rate_factor);
			CHECK(same ? row.adapt.factor_at == before_adapt.factor_at :
				  row.adapt.factor_at == row.adapt.cooldown_until);
			CHECK(isnan(row.adapt.target_factor) ? isnan(before_adapt.target_factor) :
				  row.adapt.target_factor == before_adapt.target_factor);
		}
		if (locked)
			CHECK(isfinite(row.adapt.lockout_seconds) && row.adapt.lockout_seconds >= 0.0);
		if (locked && ra_kind == RB_RA_ABSENT && !rl.has_reset &&
			row.adapt.cooldown_until != before_cooldown)
			CHECK(row.adapt.cooldown_until - now <=
				  (int64_t) fmax((double) policy.min_cooldown,
								 fmin(60e6, (double) policy.max_cooldown)) + 1);
		if (!same && !locked)
		{
			CHECK(row.adapt.factor_at >= now);
			CHECK(row.adapt.factor_at == row.adapt.cooldown_until ||
				  row.adapt.factor_at == now);
			/*
			 * Never above the rate it was sent at; with no earlier
			 * episode's level to go back to, throttle_factor of it.
			 */
			if (!published)
				CHECK(f_after <= fmax(policy.floor_factor, f_sent) * (1.0 + 1e-9));
			if (!published && isnan(before_adapt.target_factor))
				CHECK(f_after <= fmax(policy.floor_factor,
									  f_sent * policy.throttle_factor) * (1.0 + 1e-9));
		}
	}

	/*
	 * The curve: it never falls as time goes on, and the capacity in force
	 * stays within [min(1, capacity), capacity].
	 */
	{
		int64_t		dts[] = {0, 1000, 500000, 2000000, 10000000, 600000000};
		double		prev = 0.0;
		int			i;

		for (i = 0; i < (int) (sizeof(dts) / sizeof(dts[0])); i++)
		{
			int64_t		t = now + dts[i];
			double		c = rb_curve_now(&row.adapt, &policy, t);
			double		cap = rb_capacity_now(&row.adapt, &policy, row.capacity,
											  0.0, t);

			if (t > CLOCK_MAX)
				break;
			CHECK(isfinite(c) && c > 0.0 && c <= 1.0);
			CHECK(c >= prev * (1.0 - 1e-12));
			CHECK(cap <= row.capacity && cap >= fmin(1.0, row.capacity));
			prev = c;
		}
	}

	/* the counters count the outcome */
	CHECK(row.counters.throttles ==
		  before_counters.throttles + (obs.outcome == RB_OUTCOME_THROTTLED));
	CHECK(row.counters.successes ==
		  before_counters.successes + (obs.outcome == RB_OUTCOME_SUCCESS));
	CHECK(row.counters.failures ==
		  before_counters.failures + (obs.outcome == RB_OUTCOME_FAILURE));
	CHECK(row.counters.malformed_headers ==
		  before_counters.malformed_headers + rl.malformed);
	CHECK(row.counters.last_status == (resp.has_status ? resp.status : 0));
	CHECK(row.counters.last_observed_at == now);

	/* the breaker */
	if (obs.outcome == RB_OUTCOME_SUCCESS)
		CHECK(row.adapt.failure_run == 0);
	else if (obs.outcome == RB_OUTCOME_FAILURE)
		CHECK(row.adapt.failure_run == before_run + (before_run < INT32_MAX));
	else
		CHECK(row.adapt.failure_run == before_run);

	if (policy.breaker_failures <= 0)
		CHECK(rb_breaker_state(&row.adapt, now) == RB_BREAKER_CLOSED);
	else if (before_state == RB_BREAKER_CLOSED)
	{
		if (obs.outcome == RB_OUTCOME_FAILURE &&
			row.adapt.failure_run >= policy.breaker_failures)
		{
			CHECK(rb_breaker_state(&row.adapt, now) == RB_BREAKER_OPEN);
			CHECK(row.adapt.open_until - now >= policy.breaker_open);
			CHECK(row.adapt.open_until - now <= policy.breaker_max_open);
			CHECK(row.adapt.breaker_trips == 1);
			CHECK(row.counters.breaker_opens == before_counters.breaker_opens + 1);
		}
		else
			CHECK(rb_breaker_state(&row.adapt, now) == RB_BREAKER_CLOSED);
	}
	else if (before_state == RB_BREAKER_HALF_OPEN &&
			 rb_breaker_state(&row.adapt, now) != RB_BREAKER_HALF_OPEN)
	{
		/* only the probe's answer moves a half-open breaker */
		if (obs.outcome == RB_OUTCOME_FAILURE)
		{
			CHECK(rb_breaker_state(&row.adapt, now) == RB_BREAKER_OPEN);
			CHECK(row.adapt.open_until - now >= policy.breaker_open);
			CHECK(row.adapt.open_until - now <= policy.breaker_max_open);
		}
		else
			CHECK(rb_breaker_state(&row.adapt, now) == RB_BREAKER_CLOSED);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Reader		r = {data, size};
	unsigned	steps;

	memset(&row, 0, sizeof(row));
	memset(&policy, 0, sizeof(policy));
	step_no = 0;
	last_op = 0;

	/*
	 * The settings, within the ranges bucket/settings.c lets through, and a
	 * configuration within what bucket_configure accepts (api/admin.c); the
	 * policy is what rb_policy_resolve makes of them for each ceiling.
	 */
	settings.throttle_factor = rd_bounded(&r, 0.01, 1.0);
	settings.return_fraction = rd_bounded(&r, 0.01, 1.0);
	settings.return_time_ms = (int) (1 + rd_usecs(&r, INT64_C(3600000000)) / 1000);
	settings.recovery_factor = rd_u8(&r) % 4 == 0 ? 1.0 : rd_bounded(&r, 1.0, 100.0);
	settings.recovery_interval_s = (int) (1 + rd_u64(&r, 3) % 86400);
	settings.default_cooldown_ms = (int) (rd_usecs(&r, INT64_C(86400000000)) / 1000);
	settings.min_cooldown_ms = (int) (rd_usecs(&r, INT64_C(86400000000)) / 1000);
	settings.max_cooldown_ms = (int) (1000 + rd_usecs(&r, (INT_MAX_MS - 1000) * 1000) / 1000);
	switch (rd_u8(&r) % 4)
	{
		case 0:
			settings.breaker_failures = 0;
			break;
		case 1:
			settings.breaker_failures = (int) (rd_u64(&r, 3) % 1000001);
			break;
		default:
			settings.breaker_failures = 1 + (int) (rd_u8(&r) % 8);
			break;
	}
	settings.breaker_open_ms = (int) (1 + rd_usecs(&r, (INT_MAX_MS - 1) * 1000) / 1000);
	settings.breaker_max_open_ms = (int) (1 + rd_usecs(&r, (INT_MAX_MS - 1) * 1000) / 1000);
	settings.floor_fraction = rd_bounded(&r, 0.0001, 1.0);
	overrides.floor_rate = rd_u8(&r) % 2 ? NAN : rd_bounded(&r, MIN_RATE, MAX_RATE);
	overrides.throttle_factor = rd_u8(&r) % 2 ? NAN : rd_bounded(&r, nextafter(0.0, 1.0), 1.0);
	overrides.recovery_factor = rd_u8(&r) % 2 ? NAN : rd_bounded(&r, 1.0, 100.0);
	overrides.breaker_failures = rd_u8(&r) % 2 ? -1 : (int32_t) (rd_u64(&r, 4) & 0x7fffffff);

	/* the clock: anywhere in PostgreSQL's range, usually near today */
	if (rd_u8(&r) % 4 == 0)
		now = (int64_t) ((uint64_t) PG_MIN_TS +
						 rd_u64(&r, 8) % ((uint64_t) CLOCK_MAX - (uint64_t) PG_MIN_TS));
	else
		now = INT64_C(753000000000000) + (int64_t) rd_u64(&r, 5);

	/* a new bucket, full (rb_start, as rb_new_bucket of src/bucket/bucket.c) */
	row.rate = rd_bounded(&r, MIN_RATE, MAX_RATE);
	row.capacity = rd_bounded(&r, nextafter(0.0, 1.0), MAX_CAPACITY);
	rb_start(&row.state, &row.adapt, row.capacity, now);
	row.counters.last_status = -1;
	row.counters.last_observed_at = RB_NO_TIME;
	set_floor(row.rate);
	check_row(now);

	steps = rd_u8(&r) % (MAX_STEPS + 1);
	for (step_no = 1; step_no <= (int) steps && r.left > 0; step_no++)
	{
		int64_t		prev_refilled = row.state.refilled_at;
		unsigned	op = rd_u8(&r) % 12;

		last_op = op;
		switch (op)
		{
			case 0:
			case 1:
			case 2:
				step_take(&r, 0);
				break;
			case 3:
				step_take(&r, 1);
				break;
			case 4:
			case 5:
				step_observe(&r);
				break;
			case 6:
				/* the clock goes forward */
				now += rd_usecs(&r, INT64_C(100000000000));
				if (now > CLOCK_MAX)
					now = CLOCK_MAX;
				break;
			case 7:
				/* the clock steps back (NTP, a failover to another host) */
				now -= rd_usecs(&r, INT64_C(100000000000));
				if (now < PG_MIN_TS)
					now = PG_MIN_TS;
				break;
			case 8:
				/* a cooldown of a Retry-After in raw seconds */
				{
					double		secs;
					int64_t		c;
					uint64_t	bits = rd_u64(&r, 8);

					memcpy(&secs, &bits, sizeof(secs));
					c = rb_clamp_cooldown(&policy, secs);
					CHECK(c >= policy.min_cooldown && c <= policy.max_cooldown);
					rb_cool_down(&row.state, &row.adapt, now + c);
				}
				break;
			case 9:
				/* a published limit: any rate and burst factors */
				{
					double		f;
					uint64_t	bits = rd_u64(&r, 8);

					if (rd_u8(&r) % 2)
						memcpy(&f, &bits, sizeof(f));
					else
						f = rd_frac(&r);
					set_floor(row.rate);
					rb_publish_limit(&row.adapt, f, rd_frac(&r));
				}
				break;
			case 10:
				/* bucket_pause: for a positive duration, or forever */
				if (rd_u8(&r) % 3 == 0)
					row.adapt.paused_until = RB_FOREVER;
				else
				{
					int64_t		room = now < 0 ? INT64_C(4000000000000000000) :
						PG_END_TS - 2 - now;
					int64_t		d = 1 + rd_usecs(&r, room);

					row.adapt.paused_until = now + d;
				}
				break;
			case 11:
				/* bucket_resume */
				row.adapt.paused_until = RB_NO_TIME;
				break;
		}
		check_row(prev_refilled);
	}
	return 0;
}
