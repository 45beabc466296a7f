/*-------------------------------------------------------------------------
 *
 * adapt.c
 *	  Learning from destinations: outcomes, cooldowns, the effective rate,
 *	  pause, and the circuit breaker, as pure functions of the stored state,
 *	  the policy and the clock.
 *
 * Nothing here needs a background job: the effective rate recovers as a
 * function of time, computed whenever the row is read, and the breaker's
 * half-open state is simply "open_until has passed".
 *
 * A cooldown empties the bucket and moves its refill time to the end of the
 * cooldown.  The arithmetic of arith.c then does the rest: nothing refills
 * before that time, wait_seconds reaches past it, and when it ends the
 * destination receives a trickle at the effective rate, not a full burst.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>

#include "core/adapt.h"

/*
 * A level that held, kept by the next episode: this much of it, from
 * RB_HELD_SHORT for a level that held only just past its return (a
 * destination's burst may have hidden an excess that long) up to
 * RB_HELD_LONG for one that held RB_HELD_SECONDS or more.
 */
#define RB_HELD_SHORT 0.85
#define RB_HELD_LONG 0.95
#define RB_HELD_SECONDS 10.0

/* A refusal at most this much above a level that held is one at it. */
#define RB_AT_LEVEL 1.02

/*
 * The longest wait a token bucket at its limit asks for: the time until its
 * next token, in the whole seconds of Retry-After or of an HTTP-date (two
 * at most, the date rounded up).  A longer one is a window's end or a
 * penalty (microseconds).
 */
#define RB_TOKEN_WAIT INT64_C(2000000)

/* The burst grows back by recovery_factor over this many intervals. */
#define RB_BURST_INTERVALS 4.0

/* rb_adapt_init: the state of a bucket nobody has heard from. */
void
rb_adapt_init(RbAdapt *adapt)
{
	adapt->rate_factor = 1.0;
	adapt->factor_at = RB_NO_TIME;
	adapt->target_factor = NAN;
	adapt->burst_factor = NAN;
	adapt->limit_factor = NAN;
	adapt->limit_burst_factor = NAN;
	adapt->cooldown_until = RB_NO_TIME;
	adapt->cooldown_from = RB_NO_TIME;
	adapt->lockout_seconds = NAN;
	adapt->at_floor_since = RB_NO_TIME;
	adapt->paused_until = RB_NO_TIME;
	adapt->failure_run = 0;
	adapt->breaker_trips = 0;
	adapt->open_until = RB_NO_TIME;
	adapt->probe_at = RB_NO_TIME;
}

/*
 * rb_start
 *		A bucket seen for the first time: full, refilled at "now", nothing
 *		heard from its destination.
 */
void
rb_start(RbState *state, RbAdapt *adapt, double capacity, int64_t now)
{
	state->tokens = capacity;
	state->refilled_at = now;
	rb_adapt_init(adapt);
}

/*
 * rb_classify
 *		What a delivery's outcome means.  has_status false (SQL NULL) and a
 *		status of 0 both stand for "no response": a connection failure or a
 *		timeout.
 */
RbOutcome
rb_classify(int status, bool has_status, bool has_retry_after)
{
	if (!has_status || status == 0)
		return RB_OUTCOME_FAILURE;
	if (status >= 200 && status <= 299)
		return RB_OUTCOME_SUCCESS;
	if (status == 429)
		return RB_OUTCOME_THROTTLED;
	if (status == 503 && has_retry_after)
		return RB_OUTCOME_UNAVAILABLE;
	if (status == 408 || (status >= 500 && status <= 599))
		return RB_OUTCOME_FAILURE;
	return RB_OUTCOME_NEUTRAL;
}

/* rb_outcome_name: the outcome as bucket_observe reports it. */
const char *
rb_outcome_name(RbOutcome outcome)
{
	switch (outcome)
	{
		case RB_OUTCOME_SUCCESS:
			return "success";
		case RB_OUTCOME_THROTTLED:
			return "throttled";
		case RB_OUTCOME_UNAVAILABLE:
			return "unavailable";
		case RB_OUTCOME_FAILURE:
			return "failure";
		case RB_OUTCOME_NEUTRAL:
			break;
	}
	return "neutral";
}

static int64_t
rb_max_time(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/*
 * rb_curve_now
 *		The rate factor the last throttle episode's curve gives at "now",
 *		before the floor and any published limit:
 *
 *		  until factor_at (the end of the episode's cooldown): rate_factor;
 *		  then, for return_time, a concave return to target_factor,
 *			target - (target - rate_factor) * (1 - t / return_time)^3,
 *		  fast at first and flat on arrival (the shape of TCP CUBIC);
 *		  then a convex climb above it, slow at first, across the gap to the
 *		  ceiling:
 *			target + (1 - target) * (recovery_factor - 1) * (t' / recovery_interval)^3,
 *		  t' the time since the return ended: with recovery_factor 2, the
 *		  ceiling after recovery_interval;
 *		never above 1.  A row without a target (none was set, or it was
 *		written before targets existed) climbs from rate_factor at once.
 */
double
rb_curve_now(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	double		low = adapt->rate_factor;
	double		target = adapt->target_factor;
	double		t;
	double		f;

	if (!(low < 1.0))			/* also NaN */
		return 1.0;
	if (isnan(target) || target < low)
		target = low;
	if (adapt->factor_at == RB_NO_TIME || now <= adapt->factor_at)
		return low;

	t = ((double) now - (double) adapt->factor_at) / RB_USECS_PER_SEC;
	if (target > low)
	{
		if (t < policy->return_time)
		{
			/* 1 - (1 - u)^3, as u (3 - 3u + u^2): no cancellation near low */
			double		u = t / policy->return_time;

			f = low + (target - low) * u * (3.0 - 3.0 * u + u * u);
			return f < 1.0 ? f : 1.0;
		}
		t -= policy->return_time;
	}
	f = target;
	if (policy->recovery_factor > 1.0)
	{
		double		x = t / policy->recovery_interval;

		f += (1.0 - target) * (policy->recovery_factor - 1.0) * x * x * x;
	}
	if (!(f <= 1.0))			/* also an overflow to Inf */
		f = 1.0;
	return f;
}

/*
 * rb_factor_now
 *		The rate factor in force at "now": the curve, never above a limit
 *		the destination published, and never below the floor.
 */
double
rb_factor_now(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	double		f = rb_curve_now(adapt, policy, now);

	if (adapt->limit_factor < f)	/* false for NaN */
		f = adapt->limit_factor;
	if (f < policy->floor_factor)
		f = policy->floor_factor;
	return f;
}

/*
 * rb_burst_curve
 *		The burst factor a throttle episode set, at "now": burst_factor
 *		until factor_at, then growing by recovery_factor per
 *		RB_BURST_INTERVALS recovery intervals, never above 1: slower than
 *		the rate, so that a destination that takes no burst is not sent one
 *		again at every probe.
 */
static double
rb_burst_curve(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	double		b = adapt->burst_factor;

	if (!(b < 1.0))				/* also NaN */
		return 1.0;
	if (adapt->factor_at != RB_NO_TIME && now > adapt->factor_at &&
		policy->recovery_factor > 1.0)
		b *= pow(policy->recovery_factor,
				 ((double) now - (double) adapt->factor_at) /
				 RB_USECS_PER_SEC /
				 (policy->recovery_interval * RB_BURST_INTERVALS));
	return b < 1.0 ? b : 1.0;
}

/*
 * rb_burst_fraction, rb_capacity_now
 *		The capacity in force at "now" for a bucket whose configured (or
 *		requested) capacity is "capacity": it shrinks and recovers with the
 *		rate factor, so that a full bucket lasts no longer than configured
 *		(capacity / rate) at the rate in force; each throttle episode halves
 *		it further (a destination that takes less of a burst than of a
 *		rate: a pacer), and it grows back as the rate climbs; it never
 *		exceeds a burst the destination published (but the floor's share).
 *		Lowered, it is a whole number of tokens.  Never less than a take of
 *		"want" needs (at most the capacity itself), so that a take that fits
 *		the capacity always comes through in time, and never less than one
 *		token.
 */
double
rb_burst_fraction(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	double		f = rb_curve_now(adapt, policy, now);
	double		b = rb_burst_curve(adapt, policy, now);

	if (b < f)
		f = b;
	if (adapt->limit_burst_factor < f)	/* false for NaN */
		f = adapt->limit_burst_factor;
	if (f < policy->floor_factor)
		f = policy->floor_factor;
	return f < 1.0 ? f : 1.0;
}

double
rb_capacity_now(const RbAdapt *adapt, const RbPolicy *policy, double capacity,
				double want, int64_t now)
{
	double		f = rb_burst_fraction(adapt, policy, now);
	double		least;
	double		c;

	if (f >= 1.0)
		return capacity;
	/* whole tokens: a fraction above one would let takes come closer */
	c = floor(capacity * f);
	least = want > 1.0 ? want : 1.0;
	if (least > capacity)
		least = capacity;
	return c > least ? c : least;
}

/* rb_at_floor: is the effective rate at its floor now? */
bool
rb_at_floor(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	return adapt->at_floor_since != RB_NO_TIME &&
		policy->floor_factor < 1.0 &&
		rb_curve_now(adapt, policy, now) <= policy->floor_factor;
}

/*
 * rb_adapt_settle
 *		Clear what time has ended, for a row about to be written at "now": a
 *		floor the rate has left, a pause that is over.  Neither changes a
 *		decision (both were over already); they make the stored row say so,
 *		which is what its events watch (bucket/events.c).
 */
void
rb_adapt_settle(RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	if (adapt->at_floor_since != RB_NO_TIME && !rb_at_floor(adapt, policy, now))
		adapt->at_floor_since = RB_NO_TIME;
	if (adapt->paused_until != RB_NO_TIME && adapt->paused_until <= now)
		adapt->paused_until = RB_NO_TIME;
}

/* rb_breaker_state: closed, open, or half-open (open period over). */
RbBreakerState
rb_breaker_state(const RbAdapt *adapt, int64_t now)
{
	if (adapt->open_until == RB_NO_TIME)
		return RB_BREAKER_CLOSED;
	if (now < adapt->open_until)
		return RB_BREAKER_OPEN;
	return RB_BREAKER_HALF_OPEN;
}

const char *
rb_breaker_name(RbBreakerState state)
{
	switch (state)
	{
		case RB_BREAKER_OPEN:
			return "open";
		case RB_BREAKER_HALF_OPEN:
			return "half-open";
		case RB_BREAKER_CLOSED:
			break;
	}
	return "closed";
}

/*
 * rb_gate
 *		Is the take refused whatever the tokens?  Sets *until to when that
 *		ends (for wait_seconds).
 *
 * Half-open lets one probe through: a take that finds no probe out (or one
 * sent longer than a first open period ago, whose worker may have died) may
 * be the probe; every other take waits for the probe's outcome.
 */
RbGateReason
rb_gate(const RbAdapt *adapt, const RbPolicy *policy, int64_t now,
		int64_t *until)
{
	*until = now;
	if (adapt->paused_until != RB_NO_TIME && now < adapt->paused_until)
	{
		*until = adapt->paused_until;
		return RB_GATE_PAUSED;
	}
	switch (rb_breaker_state(adapt, now))
	{
		case RB_BREAKER_OPEN:
			*until = adapt->open_until;
			return RB_GATE_BREAKER_OPEN;
		case RB_BREAKER_HALF_OPEN:
			/* (a clock that stepped back before probe_at: still in flight) */
			if (adapt->probe_at != RB_NO_TIME &&
				(now < adapt->probe_at ||
				 now - adapt->probe_at < policy->breaker_open))
			{
				*until = rb_max_time(adapt->probe_at, now) + policy->breaker_open;
				return RB_GATE_PROBE_IN_FLIGHT;
			}
			break;
		case RB_BREAKER_CLOSED:
			break;
	}
	if (adapt->cooldown_until != RB_NO_TIME && now < adapt->cooldown_until)
	{
		*until = adapt->cooldown_until;
		return RB_GATE_COOLDOWN;
	}
	if (rb_breaker_state(adapt, now) == RB_BREAKER_HALF_OPEN)
		return RB_GATE_PROBE;
	return RB_GATE_OPEN;
}

/*
 * rb_clamp_cooldown
 *		A cooldown of "seconds" (NaN: none was given), clamped to the policy:
 *		none given means the default; a past date or a tiny delay means the
 *		minimum; nothing is longer than the maximum.  Returns microseconds.
 */
int64_t
rb_clamp_cooldown(const RbPolicy *policy, double seconds)
{
	double		usecs;

	if (isnan(seconds))
		usecs = (double) policy->default_cooldown;
	else
		usecs = seconds * RB_USECS_PER_SEC;
	if (usecs < (double) policy->min_cooldown)
		return policy->min_cooldown;
	if (usecs > (double) policy->max_cooldown)
		return policy->max_cooldown;
	return (int64_t) ceil(usecs);
}

/*
 * rb_cool_down
 *		Refuse takes until "until": empty the bucket and start its refill
 *		then.  A shorter cooldown never cuts a longer one short.
 */
void
rb_cool_down(RbState *state, RbAdapt *adapt, int64_t until)
{
	if (adapt->cooldown_until != RB_NO_TIME && adapt->cooldown_until >= until)
		return;
	adapt->cooldown_until = until;
	state->tokens = 0.0;
	if (until > state->refilled_at)
		state->refilled_at = until;
}

/*
 * How much of the level the last episode returned to the next one keeps
 * (rb_throttle_episode), or 0 if that level did not hold.  It held if the
 * request was sent once the return was over: the limit lies about there,
 * and the rate returns a little below it, the closer the longer it held (a
 * level that only held while the destination's burst hid an excess is left
 * in an episode or two).  But a destination that locked the sender out
 * counts in a window, and a level holds there until the window fills, as
 * long as the window lasts: it held only once it outlasted the time the
 * destination stayed closed and RB_HELD_SECONDS more.  And a refusal
 * that asks for a longer wait than a token bucket would is no request that
 * met the destination early, but a window spent until its end: no level
 * protects the rate from it.
 */
static double
rb_level_held(const RbAdapt *adapt, const RbPolicy *policy, int64_t sent,
			  int64_t now)
{
	int64_t		held_from = adapt->factor_at +
		(int64_t) (policy->return_time * RB_USECS_PER_SEC);
	double		seconds = ((double) sent - (double) held_from) / RB_USECS_PER_SEC;

	if (adapt->factor_at == RB_NO_TIME || sent < held_from)
		return 0.0;
	if (adapt->lockout_seconds > 0.0 &&	/* false for NaN */
		seconds < RB_HELD_SECONDS + adapt->lockout_seconds)
		return 0.0;
	if (adapt->cooldown_until != RB_NO_TIME &&
		adapt->cooldown_until - now > RB_TOKEN_WAIT)
		return 0.0;
	return RB_HELD_SHORT + (RB_HELD_LONG - RB_HELD_SHORT) *
		(seconds < RB_HELD_SECONDS ? seconds / RB_HELD_SECONDS : 1.0);
}

/*
 * The rate a window fits, for a refusal that asks for a longer wait than a
 * token bucket would (a window spent until its end; else at_send): what
 * the destination took since the last episode's cooldown ended, over that
 * time and the wait.  The episode returns no higher (rb_throttle_episode).
 */
static double
rb_window_fits(const RbAdapt *adapt, double at_send, int64_t sent, int64_t now)
{
	double		sending;
	double		wait;

	if (adapt->cooldown_until == RB_NO_TIME ||
		adapt->cooldown_until - now <= RB_TOKEN_WAIT ||
		adapt->factor_at == RB_NO_TIME || sent <= adapt->factor_at)
		return at_send;
	sending = (double) sent - (double) adapt->factor_at;
	wait = (double) adapt->cooldown_until - (double) now;
	return at_send * sending / (sending + wait);
}

/*
 * rb_throttle_episode
 *		A 429 that starts a new throttle episode: a request sent at "sent"
 *		(its send time, or "now" when unknown) was refused at "now", after
 *		the cooldown it asked for was applied.  The rate the request was sent
 *		at is where the destination's limit was crossed: the rate drops to
 *		throttle_factor of it (never below the floor), and returns, once the
 *		cooldown is over, to return_fraction of it, or to just below the
 *		level the last episode returned to if the request was sent once that
 *		level had held (to that level itself if it held RB_HELD_SECONDS and
 *		a climb above it was refused; rb_level_held), never above what a
 *		window fits (rb_window_fits).  The burst halves (rb_capacity_now).
 */
void
rb_throttle_episode(RbAdapt *adapt, const RbPolicy *policy, int64_t sent,
					int64_t now)
{
	double		at_send = rb_factor_now(adapt, policy, sent);
	double		burst = rb_burst_curve(adapt, policy, now);
	double		low = at_send * policy->throttle_factor;
	double		target = at_send * policy->return_fraction;
	double		keep = rb_level_held(adapt, policy, sent, now);
	bool		held = keep > 0.0;
	double		fits = rb_window_fits(adapt, at_send, sent, now);

	if (held && !isnan(adapt->target_factor) &&
		adapt->target_factor <= at_send && adapt->target_factor * keep > target)
	{
		/*
		 * Refused at that very level, not above it (no climb yet): a
		 * request that met the destination early (jitter), not a rate too
		 * high; after the cooldown, straight back to just below it.
		 * Refused above it, once it had held RB_HELD_SECONDS: the climb
		 * crossed the limit, the level itself did not, and the rate returns
		 * to it whole (TCP CUBIC's last good window).
		 */
		if (at_send <= adapt->target_factor * RB_AT_LEVEL)
			low = adapt->target_factor * keep;
		else if (keep >= RB_HELD_LONG)
			keep = 1.0;
		target = adapt->target_factor * keep;
	}

	if (fits < target)
		target = fits;
	if (low <= policy->floor_factor)
	{
		low = policy->floor_factor;
		if (!rb_at_floor(adapt, policy, now))
			adapt->at_floor_since = now;
	}
	if (target < low)
		target = low;
	adapt->rate_factor = low < 1.0 ? low : 1.0;
	adapt->target_factor = target < 1.0 ? target : 1.0;
	adapt->burst_factor = burst * 0.5;
	adapt->factor_at = adapt->cooldown_until != RB_NO_TIME &&
		adapt->cooldown_until > now ? adapt->cooldown_until : now;
}

/*
 * rb_lock_out
 *		A 429 that locked the sender out (feedback.c: rb_locked_out), after
 *		the longer cooldown it asked for was applied.  The rate holds where
 *		the episode put it until that cooldown ends, then returns as the
 *		episode set it; the burst halves, as an episode halves it: a
 *		destination that counts in a window refuses at once every request
 *		of a burst sent before it has room.  lockout_seconds: how long the
 *		destination has been closed since the episode began, which
 *		cooldowns doubling from the default add up to (twice the last, less
 *		the default).
 */
void
rb_lock_out(RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	double		last = adapt->cooldown_until > now ?
		((double) adapt->cooldown_until - (double) now) / RB_USECS_PER_SEC : 0.0;
	double		closed = 2.0 * last -
		(double) policy->default_cooldown / RB_USECS_PER_SEC;

	adapt->burst_factor = rb_burst_curve(adapt, policy, now) * 0.5;
	adapt->factor_at = adapt->cooldown_until > now ? adapt->cooldown_until : now;
	adapt->lockout_seconds = closed > last ? closed : last;
}

/*
 * rb_publish_limit
 *		A rate and a burst the destination published, as factors of the
 *		ceiling and of the capacity: the rate and the burst never exceed
 *		them (but the floor), until it publishes others.  A factor of 1 or
 *		more (or none, NaN) limits nothing; one of 0 or less is no limit a
 *		rate can follow (a spent window says so with its reset).
 */
void
rb_publish_limit(RbAdapt *adapt, double rate_factor, double burst_factor)
{
	adapt->limit_factor = rate_factor > 0.0 && rate_factor < 1.0 ?
		rate_factor : NAN;
	adapt->limit_burst_factor = burst_factor > 0.0 && burst_factor < 1.0 ?
		burst_factor : NAN;
}

/* How long the breaker stays open on its n-th trip in a row. */
static int64_t
rb_open_period(const RbPolicy *policy, int trips)
{
	double		period = (double) policy->breaker_open;

	while (--trips > 0 && period < (double) policy->breaker_max_open)
		period *= 2.0;
	if (period > (double) policy->breaker_max_open)
		period = (double) policy->breaker_max_open;
	return (int64_t) period;
}

/*
 * rb_breaker_observe
 *		The circuit breaker's transitions.  Closed: a run of breaker_failures
 *		consecutive failures opens it.  Open: outcomes change nothing (they
 *		answer requests sent before it opened).  Half-open: only once the
 *		probe is out does an outcome count, as the probe's: a failure reopens
 *		the breaker for twice as long, up to the maximum; any answer that is
 *		not a failure (even a 429 or a 404: the destination is up) closes it.
 *		A success anywhere ends a run of failures.  With breaker_failures 0
 *		the breaker is disabled, and one left open is closed.
 */
void
rb_breaker_observe(RbAdapt *adapt, const RbPolicy *policy, RbOutcome outcome,
				   int64_t now)
{
	RbBreakerState state = rb_breaker_state(adapt, now);

	if (outcome == RB_OUTCOME_SUCCESS)
		adapt->failure_run = 0;
	else if (outcome == RB_OUTCOME_FAILURE && adapt->failure_run < INT32_MAX)
		adapt->failure_run++;

	if (policy->breaker_failures <= 0)
	{
		adapt->open_until = RB_NO_TIME;
		adapt->probe_at = RB_NO_TIME;
		adapt->breaker_trips = 0;
		return;
	}

	switch (state)
	{
		case RB_BREAKER_OPEN:
			return;
		case RB_BREAKER_HALF_OPEN:
			if (adapt->probe_at == RB_NO_TIME)
				return;			/* not the probe's answer */
			if (outcome == RB_OUTCOME_FAILURE)
				break;			/* reopen, below */
			adapt->open_until = RB_NO_TIME;
			adapt->probe_at = RB_NO_TIME;
			adapt->breaker_trips = 0;
			return;
		case RB_BREAKER_CLOSED:
			if (outcome != RB_OUTCOME_FAILURE ||
				adapt->failure_run < policy->breaker_failures)
				return;
			break;
	}
	if (adapt->breaker_trips < INT32_MAX)
		adapt->breaker_trips++;
	adapt->open_until = now + rb_open_period(policy, adapt->breaker_trips);
	adapt->probe_at = RB_NO_TIME;
}

/*
 * rb_decide_take
 *		Decide a take of "want" at "now" with the take's limits (rate,
 *		capacity), for a bucket whose row stores state, adapt, and the limits
 *		of its last write (stored_rate, stored_capacity): first what stops
 *		any take (a pause, an open breaker, a probe already out), then the
 *		tokens at the effective rate.
 *
 * Updates state and adapt in place and sets *write when the row must be
 * written back: a grant, or limits that changed.  When the limits change,
 * the time since the row's refill is first banked at the stored limits, so
 * that new limits apply from now on and not backwards; that banking is
 * written even if the take is refused, so that the next take (and the wait
 * returned now) refill from the same state.  A refusal with unchanged limits
 * writes nothing: its refill is a function of time alone.
 */
RbTakeResult
rb_decide_take(RbState *state, RbAdapt *adapt, const RbPolicy *policy,
			   double stored_rate, double stored_capacity,
			   double rate, double capacity, double want, int64_t now,
			   bool *write)
{
	RbTakeResult result;
	RbGateReason gate;
	int64_t		until;
	double		factor = rb_factor_now(adapt, policy, now);

	*write = false;
	gate = rb_gate(adapt, policy, now, &until);
	if (gate == RB_GATE_PAUSED || gate == RB_GATE_BREAKER_OPEN ||
		gate == RB_GATE_PROBE_IN_FLIGHT)
	{
		double		wait = ((double) until - (double) now) / RB_USECS_PER_SEC;

		/* an open-ended pause: look again after the longest cooldown */
		if (gate == RB_GATE_PAUSED && until == RB_FOREVER)
			wait = (double) policy->max_cooldown / RB_USECS_PER_SEC;
		result.allowed = false;
		result.remaining = rb_refill(state->tokens, rate * factor,
									 rb_capacity_now(adapt, policy, capacity,
													 want, now),
									 state->refilled_at, now);
		result.wait_seconds = wait;
		return result;
	}

	if (stored_rate != rate || stored_capacity != capacity)
	{
		rb_advance(state, stored_rate * factor,
				   rb_capacity_now(adapt, policy, stored_capacity, 0.0, now),
				   now);
		*write = true;
	}

	result = rb_take(state, rate * factor,
					 rb_capacity_now(adapt, policy, capacity, want, now),
					 want, now);
	if (result.allowed)
	{
		*write = true;
		if (gate == RB_GATE_PROBE)
			adapt->probe_at = now;
	}
	return result;
}

/*
 * rb_decide_take_upto
 *		rb_decide_take for as many whole tokens as the bucket grants now, up
 *		to max_want: at most one while a half-open breaker waits for its
 *		probe.  Sets *granted (0 for a refusal).  When fewer than max_want
 *		were granted, wait_seconds is the time until the next one could be
 *		(what a take of one would be told next); otherwise 0.
 *
 * The count comes from a dry run on copies; the take itself is then one
 * rb_decide_take, so it writes and banks exactly as a take of that many
 * tokens would.
 */
RbTakeResult
rb_decide_take_upto(RbState *state, RbAdapt *adapt, const RbPolicy *policy,
					double stored_rate, double stored_capacity,
					double rate, double capacity, int64_t max_want,
					int64_t now, bool *write, int64_t *granted)
{
	RbState		trial_state = *state;
	RbAdapt		trial_adapt = *adapt;
	RbTakeResult result;
	int64_t		until;
	int64_t		n;
	bool		trial_write;

	*granted = 0;

	/* a take of one: if even that is refused, so is this take */
	result = rb_decide_take(&trial_state, &trial_adapt, policy,
							stored_rate, stored_capacity, rate, capacity,
							1.0, now, &trial_write);
	if (!result.allowed || max_want <= 1 ||
		rb_gate(adapt, policy, now, &until) == RB_GATE_PROBE)
		n = 1;
	else if (result.remaining >= (double) (max_want - 1))
		n = max_want;
	else
		n = 1 + (int64_t) floor(result.remaining);

	/*
	 * The take itself.  Should rounding refuse a count the dry run allowed,
	 * try one fewer: a refusal changes nothing that matters here (at most
	 * the banking of changed limits, which is idempotent at one clock).
	 */
	for (;;)
	{
		result = rb_decide_take(state, adapt, policy,
								stored_rate, stored_capacity, rate, capacity,
								(double) n, now, write);
		if (result.allowed || n == 1)
			break;
		n--;
	}
	if (!result.allowed)
		return result;
	*granted = n;

	if (n < max_want)
	{
		/* the next token: ask a take of one from the state just left */
		RbTakeResult next;

		trial_state = *state;
		trial_adapt = *adapt;
		next = rb_decide_take(&trial_state, &trial_adapt, policy,
							  rate, capacity, rate, capacity,
							  1.0, now, &trial_write);
		result.wait_seconds = next.allowed ? 0.0 : next.wait_seconds;
	}
	return result;
}

/*
 * rb_adapt_is_idle
 *		Does the state say nothing a fresh bucket would not?  (For expiry.)
 */
bool
rb_adapt_is_idle(const RbAdapt *adapt, const RbPolicy *policy, int64_t now)
{
	return rb_curve_now(adapt, policy, now) >= 1.0 &&
		rb_burst_curve(adapt, policy, now) >= 1.0 &&
		isnan(adapt->limit_factor) && isnan(adapt->limit_burst_factor) &&
		(adapt->cooldown_until == RB_NO_TIME || adapt->cooldown_until <= now) &&
		(adapt->paused_until == RB_NO_TIME || adapt->paused_until <= now) &&
		adapt->open_until == RB_NO_TIME &&
		adapt->failure_run == 0;
}
