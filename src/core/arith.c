/*-------------------------------------------------------------------------
 *
 * arith.c
 *	  Token-bucket arithmetic: refill, take and wait time.
 *
 * These are pure functions of the stored state, the limits and the clock,
 * kept free of PostgreSQL calls so that they are easy to reason about and to
 * test exhaustively.  The callers validate their inputs (finite, positive,
 * want <= capacity) before calling in.
 *
 * Two rules make the bucket safe against a clock that steps: a clock that
 * reads earlier than the stored refill time refills nothing, and the stored
 * refill time never moves backwards.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>

#include "core/arith.h"

/*
 * rb_refill
 *		Tokens a bucket holding "tokens" at "refilled_at" holds at "now":
 *		min(capacity, tokens + rate * elapsed), elapsed never negative.
 *
 * A bucket holding more than capacity (its capacity was lowered) is cut to
 * capacity.
 */
double
rb_refill(double tokens, double rate, double capacity,
		  int64_t refilled_at, int64_t now)
{
	double		t = tokens;

	/* in double, so that even -infinity to +infinity cannot overflow */
	if (now > refilled_at)
		t += (((double) now - (double) refilled_at) / RB_USECS_PER_SEC) * rate;
	if (!(t <= capacity))		/* also catches an overflow to Inf */
		t = capacity;
	if (t < 0.0)
		t = 0.0;
	return t;
}

/*
 * rb_advance
 *		Refill the state to "now" in place; the refill time only moves forward.
 */
void
rb_advance(RbState *state, double rate, double capacity, int64_t now)
{
	state->tokens = rb_refill(state->tokens, rate, capacity,
							  state->refilled_at, now);
	if (now > state->refilled_at)
		state->refilled_at = now;
}

/*
 * rb_wait_seconds
 *		Seconds until a bucket holding "have" tokens holds "want" at "rate".
 *
 * Rounded up to the clock's microsecond, then checked with the very
 * arithmetic rb_refill uses, so a caller that sleeps exactly this long is
 * granted rather than told to wait one more microsecond.
 */
double
rb_wait_seconds(double have, double want, double rate)
{
	double		usecs;
	int			i;

	if (have >= want)
		return 0.0;
	usecs = ceil((want - have) / rate * RB_USECS_PER_SEC);
	/* a step or two at most; bounded, since huge values absorb "+ 1" */
	for (i = 0; i < 4 && have + (usecs / RB_USECS_PER_SEC) * rate < want; i++)
		usecs = fmax(usecs + 1.0, nextafter(usecs, INFINITY));
	return usecs / RB_USECS_PER_SEC;
}

/*
 * rb_take
 *		Refill to "now", then take "want" tokens if the bucket holds them.
 *
 * The state is refilled in place whether or not the take is allowed; a
 * caller that is denied need not store it, since the refill is a function of
 * time alone.  A refill time ahead of "now" (the end of a cooldown, or a
 * clock that stepped back) refills nothing until then, and a refused take's
 * wait reaches past it.
 */
RbTakeResult
rb_take(RbState *state, double rate, double capacity, double want,
		int64_t now)
{
	RbTakeResult result;
	RbState		stored = *state;

	rb_advance(state, rate, capacity, now);
	if (state->tokens >= want)
	{
		state->tokens -= want;
		result.allowed = true;
		result.wait_seconds = 0.0;
	}
	else
	{
		double		usecs;
		int			i;

		result.allowed = false;
		result.wait_seconds = rb_wait_seconds(state->tokens, want, rate);
		/* a refill time ahead of the clock (a cooldown) comes first */
		if (state->refilled_at > now)
			result.wait_seconds +=
				((double) state->refilled_at - (double) now) / RB_USECS_PER_SEC;

		/*
		 * A refused take stores nothing: the next take refills in one step
		 * from the stored state, which can round a hair lower than the two
		 * steps above.  Make sure the wait is enough for that take too.
		 */
		usecs = ceil(result.wait_seconds * RB_USECS_PER_SEC);
		for (i = 0; i < 4 && usecs < 9.0e15 &&
			 (double) now + usecs < 9.0e18 &&	/* no int64 overflow below */
			 rb_refill(stored.tokens, rate, capacity, stored.refilled_at,
					   now + (int64_t) usecs) < want; i++)
			usecs += 1.0;
		result.wait_seconds = usecs / RB_USECS_PER_SEC;
	}
	result.remaining = state->tokens;
	return result;
}
