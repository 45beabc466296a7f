/*-------------------------------------------------------------------------
 *
 * quota.c
 *	  Calendar quotas as pure functions: the period names, and the take
 *	  decision of a quota bucket given the bounds of its current window.
 *
 * A quota bucket does not refill continuously.  Its tokens are the quota
 * left in the current window; a take that finds the row last written in an
 * earlier window starts from the full quota.  Which window the row belongs
 * to is told by its refill time (the clock of its last grant), which, as in
 * arith.c, never moves backwards: a clock that steps back across a boundary
 * cannot hand out a window twice.  Where a window starts and ends in a
 * named time zone is bucket/calendar.c's business (it needs PostgreSQL's
 * time zone code); nothing here does.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>

#include "core/quota.h"

/* ASCII case-insensitive equality, as the period names are matched. */
static bool
rb_ascii_equal_ci(const char *a, const char *b)
{
	for (; *a != '\0' && *b != '\0'; a++, b++)
	{
		char		ca = (*a >= 'A' && *a <= 'Z') ? (char) (*a - 'A' + 'a') : *a;
		char		cb = (*b >= 'A' && *b <= 'Z') ? (char) (*b - 'A' + 'a') : *b;

		if (ca != cb)
			return false;
	}
	return *a == *b;
}

/* rb_quota_period: the period a name stands for (RB_QUOTA_NONE: none). */
RbQuotaPeriod
rb_quota_period(const char *name)
{
	if (rb_ascii_equal_ci(name, "hour"))
		return RB_QUOTA_HOUR;
	if (rb_ascii_equal_ci(name, "day"))
		return RB_QUOTA_DAY;
	if (rb_ascii_equal_ci(name, "week"))
		return RB_QUOTA_WEEK;
	if (rb_ascii_equal_ci(name, "month"))
		return RB_QUOTA_MONTH;
	return RB_QUOTA_NONE;
}

/* rb_quota_period_name: the name stored for a period. */
const char *
rb_quota_period_name(RbQuotaPeriod period)
{
	switch (period)
	{
		case RB_QUOTA_HOUR:
			return "hour";
		case RB_QUOTA_DAY:
			return "day";
		case RB_QUOTA_WEEK:
			return "week";
		case RB_QUOTA_MONTH:
			return "month";
		case RB_QUOTA_NONE:
			break;
	}
	return "";
}

/*
 * rb_quota_tokens
 *		The quota left now, in a window that started at window_start: all
 *		of it if the row was last written before then.
 */
double
rb_quota_tokens(const RbState *state, double quota, int64_t window_start)
{
	if (state->refilled_at < window_start)
		return quota;
	return state->tokens < quota ? state->tokens : quota;
}

/* Seconds from "now" to "until". */
static double
rb_seconds(int64_t until, int64_t now)
{
	return ((double) until - (double) now) / RB_USECS_PER_SEC;
}

/*
 * rb_quota_take
 *		Decide a take from a quota bucket at "now", in the window
 *		[window_start, window_end) of the later of "now" and its refill time:
 *		of "want" tokens, or with upto > 0 of as many whole tokens as are
 *		left, up to that many (*granted: how many; 0 when refused).
 *
 * A pause, a cooldown, an open breaker or a probe in flight refuse the
 * take as they do for a rate bucket (see rb_gate), but leave the quota
 * alone: a cooldown does not spend what the provider still allows today.
 * A refusal for want of quota waits until the window ends.  Updates the
 * state (and the probe time) in place and sets *write on a grant, the only
 * time the row must be written: a new window is a function of time alone.
 */
RbTakeResult
rb_quota_take(RbState *state, RbAdapt *adapt, const RbPolicy *policy,
			  double quota, int64_t window_start, int64_t window_end,
			  double want, int64_t upto, int64_t now,
			  bool *write, double *granted)
{
	RbTakeResult result;
	RbGateReason gate;
	int64_t		until;
	double		n;

	*write = false;
	*granted = 0.0;

	/* a new window, or a quota lowered since the last write */
	if (state->refilled_at < window_start)
	{
		state->tokens = quota;
		state->refilled_at = now > window_start ? now : window_start;
	}
	else if (state->tokens > quota)
		state->tokens = quota;

	result.allowed = false;
	result.remaining = state->tokens;
	result.wait_seconds = 0.0;

	gate = rb_gate(adapt, policy, now, &until);
	if (upto > 0)
	{
		n = floor(state->tokens);
		if (n > (double) upto)
			n = (double) upto;
		if (gate == RB_GATE_PROBE && n > 1.0)
			n = 1.0;
	}
	else
		n = state->tokens >= want ? want : 0.0;

	if (gate == RB_GATE_PAUSED || gate == RB_GATE_BREAKER_OPEN ||
		gate == RB_GATE_PROBE_IN_FLIGHT || gate == RB_GATE_COOLDOWN)
	{
		/* an open-ended pause: look again after the longest cooldown */
		if (gate == RB_GATE_PAUSED && until == RB_FOREVER)
			result.wait_seconds = (double) policy->max_cooldown / RB_USECS_PER_SEC;
		else
			result.wait_seconds = rb_seconds(until, now);
		/* out of quota as well: the later of the two */
		if (n <= 0.0 && rb_seconds(window_end, now) > result.wait_seconds)
			result.wait_seconds = rb_seconds(window_end, now);
		return result;
	}

	if (n <= 0.0)
	{
		result.wait_seconds = rb_seconds(window_end, now);
		return result;
	}

	state->tokens -= n;
	if (now > state->refilled_at)
		state->refilled_at = now;
	if (gate == RB_GATE_PROBE)
		adapt->probe_at = now;
	*write = true;
	*granted = n;
	result.allowed = true;
	result.remaining = state->tokens;

	if (upto > 0 && n < (double) upto)
	{
		/* the next token: what a take of one would be told now */
		RbState		trial_state = *state;
		RbAdapt		trial_adapt = *adapt;
		bool		trial_write;
		double		trial_granted;
		RbTakeResult next;

		next = rb_quota_take(&trial_state, &trial_adapt, policy, quota,
							 window_start, window_end, 1.0, 0, now,
							 &trial_write, &trial_granted);
		result.wait_seconds = next.allowed ? 0.0 : next.wait_seconds;
	}
	return result;
}
