/*-------------------------------------------------------------------------
 *
 * http_date.c
 *	  HTTP-date (RFC 9110 section 5.6.7) and Retry-After (RFC 9110 section
 *	  10.2.3).
 *
 * Retry-After is delay-seconds or an HTTP-date.  An HTTP-date comes in three
 * forms, all of which a recipient must accept: IMF-fixdate, the obsolete
 * RFC 850 form with its two-digit year, and asctime's.  rb_parse_http_date
 * is public because X-RateLimit-Reset may carry one too (ratelimit.c).  The
 * calendar arithmetic the dates need (proleptic Gregorian, UTC, no leap
 * seconds) is here as well, since nothing else uses it.
 *
 * Only libc is used, so that this file can be built alone and fuzzed.  Every
 * parser works on (pointer, length) without a terminating NUL, never reads
 * outside that range, never allocates and never recurses.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/headers.h"
#include "core/lex.h"

/* Calendar range accepted for a reference clock: 0001-01-01 to 9999-12-31. */
#define RB_MIN_UNIX (-62135596800.0)
#define RB_MAX_UNIX 253402300799.0

/* Days from 0000-03-01 to 1970-01-01 in the proleptic Gregorian calendar. */
#define RB_CIVIL_EPOCH_SHIFT 719468

static const char *const rb_day_names[7] = {
	"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"
};
static const char *const rb_day_names_long[7] = {
	"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
	"Sunday"
};
static const char *const rb_month_names[12] = {
	"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	"Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
};

/*****************************************************************************
 * Cursor steps only the dates use
 *****************************************************************************/

/* Consume the NUL-terminated literal if it comes next, byte for byte. */
static bool
rb_accept_word(RbCursor *c, const char *word)
{
	size_t		n = strlen(word);

	if (c->len - c->pos < n || memcmp(c->s + c->pos, word, n) != 0)
		return false;
	c->pos += n;
	return true;
}

/* Consume exactly n digits into *value. */
static bool
rb_accept_digits(RbCursor *c, int n, int *value)
{
	int			v = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		if (!rb_is_digit(rb_peek(c)))
			return false;
		v = v * 10 + (c->s[c->pos] - '0');
		c->pos++;
	}
	*value = v;
	return true;
}

/* Consume one of the names in table; *index gets its position. */
static bool
rb_accept_name(RbCursor *c, const char *const *table, int count, int *index)
{
	int			i;

	for (i = 0; i < count; i++)
	{
		if (rb_accept_word(c, table[i]))
		{
			*index = i;
			return true;
		}
	}
	return false;
}

/*****************************************************************************
 * Calendar arithmetic (proleptic Gregorian, UTC, no leap seconds)
 *****************************************************************************/

/* A leap year of the Gregorian calendar. */
static bool
rb_is_leap(int64_t year)
{
	return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

/* Days in a month (1 to 12) of a year. */
static int
rb_days_in_month(int64_t year, int month)
{
	static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

	if (month == 2 && rb_is_leap(year))
		return 29;
	return days[month - 1];
}

/*
 * rb_days_from_civil
 *		Days since 1970-01-01 of year-month-day (month 1 to 12).  Exact for
 *		any year an int64 holds comfortably; a day past the end of its month
 *		counts on into the next.
 */
static int64_t
rb_days_from_civil(int64_t year, int month, int day)
{
	int64_t		y = year - (month <= 2 ? 1 : 0);
	int64_t		era = (y >= 0 ? y : y - 399) / 400;
	int64_t		yoe = y - era * 400;	/* 0 to 399 */
	int64_t		mp = month > 2 ? month - 3 : month + 9; /* March is 0 */
	int64_t		doy = (153 * mp + 2) / 5 + day - 1;
	int64_t		doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

	return era * 146097 + doe - RB_CIVIL_EPOCH_SHIFT;
}

/* The calendar date of a day number (inverse of rb_days_from_civil). */
static void
rb_civil_from_days(int64_t days, int64_t *year, int *month, int *day)
{
	int64_t		z = days + RB_CIVIL_EPOCH_SHIFT;
	int64_t		era = (z >= 0 ? z : z - 146096) / 146097;
	int64_t		doe = z - era * 146097;
	int64_t		yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t		doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t		mp = (5 * doy + 2) / 153;
	int			m = (int) (mp < 10 ? mp + 3 : mp - 9);

	*day = (int) (doy - (153 * mp + 2) / 5 + 1);
	*month = m;
	*year = yoe + era * 400 + (m <= 2 ? 1 : 0);
}

/* Unix seconds of a date and time of day. */
static double
rb_unix_time(int64_t year, int month, int day, int hour, int minute,
			 int second)
{
	return (double) rb_days_from_civil(year, month, day) * 86400.0 +
		hour * 3600.0 + minute * 60.0 + second;
}

/*
 * rb_resolve_two_digit_year
 *		The full year of an RFC 850 date with a two-digit year, by the rule of
 *		RFC 9110 section 5.6.7: a timestamp that appears to be more than 50
 *		years in the future is in the most recent year in the past with the
 *		same last two digits.
 *
 * The candidates are the years ending in yy of the current century and of
 * the next one; the later of them that is not more than 50 calendar years
 * after now is taken.
 */
static int64_t
rb_resolve_two_digit_year(int yy, int month, int day, int hour, int minute,
						  int second, double now_unix)
{
	double		now;
	int64_t		now_days;
	int64_t		now_year;
	int			now_month;
	int			now_day;
	double		now_sod;
	double		horizon;
	int64_t		year;
	int			i;

	/* a reference clock out of range (or NaN) is brought into range */
	now = now_unix;
	if (!(now >= RB_MIN_UNIX))
		now = isnan(now) ? 0.0 : RB_MIN_UNIX;
	if (now > RB_MAX_UNIX)
		now = RB_MAX_UNIX;
	now = floor(now);
	now_days = (int64_t) floor(now / 86400.0);
	now_sod = now - (double) now_days * 86400.0;
	rb_civil_from_days(now_days, &now_year, &now_month, &now_day);

	/* now + 50 years, in calendar terms */
	horizon = (double) rb_days_from_civil(now_year + 50, now_month, now_day) *
		86400.0 + now_sod;

	year = now_year - now_year % 100 + yy + 100;
	for (i = 0; i < 2; i++)
	{
		if (rb_unix_time(year, month, day, hour, minute, second) <= horizon)
			break;
		year -= 100;
	}
	return year;
}

/*****************************************************************************
 * HTTP-date (RFC 9110 section 5.6.7)
 *****************************************************************************/

/*
 * rb_parse_time_of_day
 *		time-of-day = hour ":" minute ":" second, two digits each; hour 00-23,
 *		minute 00-59, second 00-60 (60 being a leap second).
 */
static bool
rb_parse_time_of_day(RbCursor *c, int *hour, int *minute, int *second)
{
	return rb_accept_digits(c, 2, hour) && rb_accept(c, ':') &&
		rb_accept_digits(c, 2, minute) && rb_accept(c, ':') &&
		rb_accept_digits(c, 2, second) &&
		*hour <= 23 && *minute <= 59 && *second <= 60;
}

/* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT". */
static bool
rb_parse_imf_fixdate(RbCursor *c, int *year, int *month, int *day,
					 int *hour, int *minute, int *second)
{
	int			wday;

	if (!(rb_accept_name(c, rb_day_names, 7, &wday) &&
		  rb_accept(c, ',') && rb_accept(c, ' ') &&
		  rb_accept_digits(c, 2, day) && rb_accept(c, ' ') &&
		  rb_accept_name(c, rb_month_names, 12, month) && rb_accept(c, ' ') &&
		  rb_accept_digits(c, 4, year) && rb_accept(c, ' ') &&
		  rb_parse_time_of_day(c, hour, minute, second) &&
		  rb_accept_word(c, " GMT")))
		return false;
	(*month)++;
	return rb_at_end(c);
}

/* rfc850-date: "Sunday, 06-Nov-94 08:49:37 GMT"; *year gets the two digits. */
static bool
rb_parse_rfc850_date(RbCursor *c, int *year, int *month, int *day,
					 int *hour, int *minute, int *second)
{
	int			wday;

	if (!(rb_accept_name(c, rb_day_names_long, 7, &wday) &&
		  rb_accept(c, ',') && rb_accept(c, ' ') &&
		  rb_accept_digits(c, 2, day) && rb_accept(c, '-') &&
		  rb_accept_name(c, rb_month_names, 12, month) && rb_accept(c, '-') &&
		  rb_accept_digits(c, 2, year) && rb_accept(c, ' ') &&
		  rb_parse_time_of_day(c, hour, minute, second) &&
		  rb_accept_word(c, " GMT")))
		return false;
	(*month)++;
	return rb_at_end(c);
}

/* asctime-date: "Sun Nov  6 08:49:37 1994" (the day is 2DIGIT or SP DIGIT). */
static bool
rb_parse_asctime_date(RbCursor *c, int *year, int *month, int *day,
					  int *hour, int *minute, int *second)
{
	int			wday;

	if (!(rb_accept_name(c, rb_day_names, 7, &wday) && rb_accept(c, ' ') &&
		  rb_accept_name(c, rb_month_names, 12, month) && rb_accept(c, ' ')))
		return false;
	if (rb_accept(c, ' '))
	{
		if (!rb_accept_digits(c, 1, day))
			return false;
	}
	else if (!rb_accept_digits(c, 2, day))
		return false;
	if (!(rb_accept(c, ' ') &&
		  rb_parse_time_of_day(c, hour, minute, second) && rb_accept(c, ' ') &&
		  rb_accept_digits(c, 4, year)))
		return false;
	(*month)++;
	return rb_at_end(c);
}

/*
 * rb_parse_http_date
 *		Parse an HTTP-date in any of its three forms: IMF-fixdate
 *		"Sun, 06 Nov 1994 08:49:37 GMT", RFC 850 "Sunday, 06-Nov-94 08:49:37
 *		GMT" and asctime "Sun Nov  6 08:49:37 1994".  On success, *unix_seconds
 *		gets the Unix time of the date.
 *
 * (s, len) must be the date and nothing else, no surrounding whitespace.  As
 * RFC 9110 says, the date is case-sensitive ("GMT", "Nov", "Sun" exactly).
 * The day name must be a valid one but need not match the date, since
 * recipients may ignore it.  The date must exist (no 31 Feb, no 29 Feb 2023);
 * the hour is 00-23, the minute 00-59, the second 00-60.  A two-digit RFC 850
 * year is resolved against now_unix (see rb_resolve_two_digit_year).
 */
bool
rb_parse_http_date(const char *s, size_t len, double now_unix,
				   double *unix_seconds)
{
	RbCursor	c;
	int			year = 0;
	int			month = 0;
	int			day = 0;
	int			hour = 0;
	int			minute = 0;
	int			second = 0;
	int64_t		full_year;

	if (s == NULL || len == 0 || len > 64)
		return false;

	c.s = s;
	c.len = len;
	c.pos = 0;
	if (rb_parse_imf_fixdate(&c, &year, &month, &day, &hour, &minute, &second))
		full_year = year;
	else
	{
		c.pos = 0;
		if (rb_parse_rfc850_date(&c, &year, &month, &day,
								 &hour, &minute, &second))
			full_year = rb_resolve_two_digit_year(year, month, day, hour,
												  minute, second, now_unix);
		else
		{
			c.pos = 0;
			if (!rb_parse_asctime_date(&c, &year, &month, &day,
									   &hour, &minute, &second))
				return false;
			full_year = year;
		}
	}

	if (day < 1 || day > rb_days_in_month(full_year, month))
		return false;
	*unix_seconds = rb_unix_time(full_year, month, day, hour, minute, second);
	return true;
}

/*****************************************************************************
 * Retry-After (RFC 9110 section 10.2.3)
 *****************************************************************************/

/*
 * rb_parse_retry_after_at
 *		Parse a Retry-After value: delay-seconds or an HTTP-date.
 *
 * On RB_RA_DELAY, *value is the delay in seconds (1*DIGIT, leading zeros
 * allowed; exact up to 2^31, where it saturates); on RB_RA_DATE, the Unix
 * time of the date.  Leading and trailing SP and HTAB are ignored; an empty
 * or blank value is RB_RA_ABSENT; anything else is RB_RA_MALFORMED, *value
 * untouched: a sign, a fraction, a unit, an invalid date, trailing junk.
 * now_unix is the reference for a two-digit RFC 850 year, and only for that.
 */
RbRetryAfterKind
rb_parse_retry_after_at(const char *s, size_t len, double now_unix,
						double *value)
{
	double		v;

	if (s == NULL)
		return RB_RA_ABSENT;
	rb_trim(&s, &len);
	if (len == 0)
		return RB_RA_ABSENT;
	if (rb_parse_digits_saturating(s, len, false, RB_RETRY_AFTER_MAX_SECONDS, &v))
	{
		*value = v;
		return RB_RA_DELAY;
	}
	if (rb_parse_http_date(s, len, now_unix, &v))
	{
		*value = v;
		return RB_RA_DATE;
	}
	return RB_RA_MALFORMED;
}
