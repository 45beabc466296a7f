/*-------------------------------------------------------------------------
 *
 * quota.c
 *	  Calendar quotas: the window a time falls in (hour, day, week or month
 *	  of a named time zone), and the take decision of a quota bucket.
 *
 * A quota bucket does not refill continuously.  Its tokens are the quota
 * left in the current window; a take that finds the row last written in an
 * earlier window starts from the full quota.  Which window the row belongs
 * to is told by its refill time (the clock of its last grant), which, as in
 * arith.c, never moves backwards: a clock that steps back across a boundary
 * cannot hand out a window twice.
 *
 * Windows follow the zone's wall clock, as date_trunc(period, at, zone)
 * does: a day starts at local midnight and lasts 23 or 25 hours on the days
 * daylight saving time starts or ends; a week starts on Monday (ISO); a
 * month on its first day.  An hour starts where the local clock reads
 * minute 0, found from the instant rather than by converting a local time
 * back, so the hour a fall-back repeats is a window of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "datatype/timestamp.h"
#include "pgtime.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "quota.h"

/* rb_quota_period: the period a name stands for (RB_QUOTA_NONE: none). */
RbQuotaPeriod
rb_quota_period(const char *name)
{
	if (pg_strcasecmp(name, "hour") == 0)
		return RB_QUOTA_HOUR;
	if (pg_strcasecmp(name, "day") == 0)
		return RB_QUOTA_DAY;
	if (pg_strcasecmp(name, "week") == 0)
		return RB_QUOTA_WEEK;
	if (pg_strcasecmp(name, "month") == 0)
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
 * rb_quota_zone
 *		The time zone of a name from the time zone database (as the
 *		TimeZone setting accepts: 'America/New_York', 'UTC', a POSIX
 *		specification), or NULL.  Abbreviations with no rules of their own
 *		('PST') are not zones.  Lookups are cached by PostgreSQL.
 */
pg_tz *
rb_quota_zone(const char *name)
{
	if (name[0] == '\0' || strlen(name) > TZ_STRLEN_MAX)
		return NULL;
	return pg_tzset(name);
}

/* Local midnight at the start of Julian day "jd" in tz, as an instant. */
static TimestampTz
rb_local_midnight(int jd, pg_tz *tz)
{
	struct pg_tm tm;
	int			tzoff;
	TimestampTz result;

	memset(&tm, 0, sizeof(tm));
	j2date(jd, &tm.tm_year, &tm.tm_mon, &tm.tm_mday);
	tm.tm_isdst = -1;
	tzoff = DetermineTimeZoneOffset(&tm, tz);
	if (tm2timestamp(&tm, 0, &tzoff, &result) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	return result;
}

/*
 * rb_quota_window
 *		The window of "period" in tz that contains "at": [*start, *end).
 */
void
rb_quota_window(RbQuotaPeriod period, pg_tz *tz, TimestampTz at,
				TimestampTz *start, TimestampTz *end)
{
	struct pg_tm tm;
	fsec_t		fsec;
	int			tzoff;
	int			jd;

	if (TIMESTAMP_NOT_FINITE(at) ||
		timestamp2tm(at, &tzoff, &tm, &fsec, NULL, tz) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));

	jd = date2j(tm.tm_year, tm.tm_mon, tm.tm_mday);
	switch (period)
	{
		case RB_QUOTA_HOUR:
			*start = at - ((int64) tm.tm_min * SECS_PER_MINUTE + tm.tm_sec) *
				USECS_PER_SEC - fsec;
			*end = *start + USECS_PER_HOUR;
			return;
		case RB_QUOTA_DAY:
			*start = rb_local_midnight(jd, tz);
			*end = rb_local_midnight(jd + 1, tz);
			break;
		case RB_QUOTA_WEEK:
			/* j2day: 0 is Sunday; ISO weeks start on Monday */
			jd -= (j2day(jd) + 6) % 7;
			*start = rb_local_midnight(jd, tz);
			*end = rb_local_midnight(jd + 7, tz);
			break;
		case RB_QUOTA_MONTH:
			*start = rb_local_midnight(date2j(tm.tm_year, tm.tm_mon, 1), tz);
			if (tm.tm_mon == MONTHS_PER_YEAR)
				*end = rb_local_midnight(date2j(tm.tm_year + 1, 1, 1), tz);
			else
				*end = rb_local_midnight(date2j(tm.tm_year, tm.tm_mon + 1, 1), tz);
			break;
		case RB_QUOTA_NONE:
			elog(ERROR, "not a quota period");
	}

	/*
	 * A zone that moves its clock at midnight can make local midnight
	 * ambiguous or absent; whatever instant the conversion chose, the
	 * window must contain "at".
	 */
	if (*start > at)
		*start = at;
	if (*end <= at)
		*end = at + 1;
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
