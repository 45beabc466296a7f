/*-------------------------------------------------------------------------
 *
 * quota.h
 *	  Calendar quotas: N tokens per hour, day, week or month of a named
 *	  time zone, given back in full at each boundary.
 *
 * The window arithmetic needs PostgreSQL's time zone code (pg_tz); the
 * take decision, rb_quota_take, is a pure function of the stored state and
 * of the window, like arith.c and adapt.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_QUOTA_H
#define RATEBUCKET_QUOTA_H

#include "postgres.h"

#include "pgtime.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "arith.h"

typedef enum RbQuotaPeriod
{
	RB_QUOTA_NONE = 0,			/* not a quota (or an unknown name) */
	RB_QUOTA_HOUR,
	RB_QUOTA_DAY,
	RB_QUOTA_WEEK,				/* ISO weeks: from Monday 00:00 */
	RB_QUOTA_MONTH
} RbQuotaPeriod;

/* The period names accepted, for messages. */
#define RB_QUOTA_PERIODS "hour, day, week, month"

extern RbQuotaPeriod rb_quota_period(const char *name);
extern const char *rb_quota_period_name(RbQuotaPeriod period);
extern pg_tz *rb_quota_zone(const char *name);
extern void rb_quota_window(RbQuotaPeriod period, pg_tz *tz, TimestampTz at,
							TimestampTz *start, TimestampTz *end);
extern RbTakeResult rb_quota_take(RbState *state, RbAdapt *adapt,
								  const RbPolicy *policy, double quota,
								  int64_t window_start, int64_t window_end,
								  double want, int64_t upto, int64_t now,
								  bool *write, double *granted);
extern double rb_quota_tokens(const RbState *state, double quota,
							  int64_t window_start);

#endif							/* RATEBUCKET_QUOTA_H */
