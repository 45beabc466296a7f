/*-------------------------------------------------------------------------
 *
 * calendar.c
 *	  Calendar windows of quotas: the hour, day, week or month of a named
 *	  time zone that a time falls in.  The quota's take decision, which
 *	  needs only the window's bounds, is core/quota.c.
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

#include "bucket/calendar.h"

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
