/*-------------------------------------------------------------------------
 *
 * quota.h
 *	  Calendar quotas as pure functions (quota.c): N tokens per hour, day,
 *	  week or month, given back in full at each window boundary.
 *
 * Like arith.h, nothing here calls PostgreSQL; where a window lies in a
 * named time zone is computed by bucket/calendar.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_QUOTA_H
#define RATEBUCKET_CORE_QUOTA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/adapt.h"
#include "core/arith.h"

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
extern RbTakeResult rb_quota_take(RbState *state, RbAdapt *adapt,
								  const RbPolicy *policy, double quota,
								  int64_t window_start, int64_t window_end,
								  double want, int64_t upto, int64_t now,
								  bool *write, double *granted);
extern double rb_quota_tokens(const RbState *state, double quota,
							  int64_t window_start);

#endif							/* RATEBUCKET_CORE_QUOTA_H */
