/*-------------------------------------------------------------------------
 *
 * calendar.h
 *	  The windows of calendar quotas in a named time zone (calendar.c).
 *
 * The window arithmetic needs PostgreSQL's time zone code (pg_tz); the
 * take decision on a window is core/quota.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_CALENDAR_H
#define RATEBUCKET_BUCKET_CALENDAR_H

#include "postgres.h"

#include "pgtime.h"
#include "utils/timestamp.h"

#include "core/quota.h"

extern pg_tz *rb_quota_zone(const char *name);
extern void rb_quota_window(RbQuotaPeriod period, pg_tz *tz, TimestampTz at,
							TimestampTz *start, TimestampTz *end);

#endif							/* RATEBUCKET_BUCKET_CALENDAR_H */
