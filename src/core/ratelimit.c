/*-------------------------------------------------------------------------
 *
 * headers.c
 *	  Parsers for Retry-After, HTTP-date and the rate-limit fields a
 *	  destination sends.
 *
 * Only libc is used, so that this file can be built alone and fuzzed.  Every
 * parser works on (pointer, length) without a terminating NUL, never reads
 * outside that range, never allocates and never recurses; its cost is linear
 * in the length.  Any byte is acceptable input: what is not understood is
 * reported as malformed, never guessed at.
 *
 * Three families of fields are understood:
 *
 * - Retry-After (RFC 9110 section 10.2.3): delay-seconds, or an HTTP-date in
 *	 any of the three forms of RFC 9110 section 5.6.7.
 *
 * - The IETF httpapi draft fields, parsed as Structured Fields (RFC 8941,
 *	 with the RFC 9651 additions).  Two generations exist in the wild:
 *	   draft -05 to -07:  RateLimit-Policy: 100;w=60, 1000;w=3600
 *	   draft -07:		  RateLimit: limit=100, remaining=50, reset=30
 *	   draft -08 onwards: RateLimit-Policy: "default";q=100;w=60
 *						  RateLimit: "default";r=50;t=30
 *	 (drafts -00 to -06 sent separate RateLimit-Limit, -Remaining and -Reset
 *	 fields, which read like the X- fields below).  As the drafts require,
 *	 a field that does not parse, or that holds a value the draft forbids, is
 *	 ignored as a whole and counted as malformed.
 *
 * - The de facto X-RateLimit-Limit, -Remaining and -Reset: plain numbers, the
 *	 reset either a delay or a Unix timestamp.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "headers.h"

/* Calendar range accepted for a reference clock: 0001-01-01 to 9999-12-31. */
#define RB_MIN_UNIX (-62135596800.0)
#define RB_MAX_UNIX 253402300799.0

/* Days from 0000-03-01 to 1970-01-01 in the proleptic Gregorian calendar. */
#define RB_CIVIL_EPOCH_SHIFT 719468

/* A cursor over a field value: bytes s[0 .. len-1], the next at pos. */
typedef struct RbCursor
{
	const char *s;
	size_t		len;
	size_t		pos;
} RbCursor;

/* The kinds of Structured Field bare items (RFC 8941, RFC 9651). */
typedef enum RbSfType
{
	RB_SF_INTEGER,
	RB_SF_DECIMAL,
	RB_SF_STRING,
	RB_SF_TOKEN,
	RB_SF_BYTES,
	RB_SF_BOOLEAN,
	RB_SF_DATE,
	RB_SF_DISPLAY
} RbSfType;

/* A bare item; str points into the field value (for a string, unescaped). */
typedef struct RbSfBare
{
	RbSfType	type;
	double		num;			/* integer, decimal, date, boolean (0 or 1) */
	const char *str;			/* string contents (escapes kept), token */
	size_t		str_len;
} RbSfBare;

/*
 * A member of a List or Dictionary: an Item or an Inner List, with its
 * Parameters, which lie at [params_start, params_end) of the value.
 */
typedef struct RbSfMember
{
	bool		inner_list;
	RbSfBare	bare;			/* the item, when not an inner list */
	size_t		params_start;
	size_t		params_end;
} RbSfMember;

/* What one of the rate-limit fields said. */
typedef struct RbFieldValues
{
	bool		has_limit;
	double		limit;
	bool		has_window;
	double		window;
	bool		has_remaining;
	double		remaining;
	bool		has_reset;
	double		reset;
} RbFieldValues;

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
 * Small helpers
 *****************************************************************************/

/* SP or HTAB: the OWS of RFC 9110. */
static bool
rb_is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* An ASCII digit. */
static bool
rb_is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* An ASCII letter (ALPHA of RFC 5234). */
static bool
rb_is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Strip leading and trailing OWS from (*s, *len). */
static void
rb_trim(const char **s, size_t *len)
{
	while (*len > 0 && rb_is_ows((*s)[0]))
	{
		(*s)++;
		(*len)--;
	}
	while (*len > 0 && rb_is_ows((*s)[*len - 1]))
		(*len)--;
}

/* Does (s, len) equal the NUL-terminated word? */
static bool
rb_equals(const char *s, size_t len, const char *word)
{
	return strlen(word) == len && memcmp(s, word, len) == 0;
}

/* Has the cursor consumed every byte? */
static bool
rb_at_end(const RbCursor *c)
{
	return c->pos >= c->len;
}

/* The next byte, or NUL at the end (NUL is never a valid byte anywhere). */
static char
rb_peek(const RbCursor *c)
{
	return c->pos < c->len ? c->s[c->pos] : '\0';
}

/* Consume ch if it is next. */
static bool
rb_accept(RbCursor *c, char ch)
{
	if (c->pos < c->len && c->s[c->pos] == ch)
	{
		c->pos++;
		return true;
	}
	return false;
}

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

/*
 * rb_parse_digits_saturating
 *		(s, len) is 1*DIGIT [ "." 1*DIGIT ] when allow_fraction, else 1*DIGIT;
 *		its value, saturated at cap.  False for anything else.
 *
 * Digits past the cap are still checked, but no longer accumulated, so a
 * string of any length costs one pass and cannot overflow.
 */
static bool
rb_parse_digits_saturating(const char *s, size_t len, bool allow_fraction,
						   double cap, double *value)
{
	double		v = 0.0;
	double		scale = 0.1;
	size_t		i = 0;

	if (len == 0 || !rb_is_digit(s[0]))
		return false;
	for (; i < len && rb_is_digit(s[i]); i++)
	{
		if (v < cap)
			v = v * 10.0 + (s[i] - '0');
	}
	if (i < len && s[i] == '.' && allow_fraction)
	{
		i++;
		if (i == len || !rb_is_digit(s[i]))
			return false;
		for (; i < len && rb_is_digit(s[i]); i++)
		{
			if (scale > 1e-9)	/* nanoseconds are plenty */
				v += (s[i] - '0') * scale;
			scale /= 10.0;
		}
	}
	if (i != len)
		return false;
	*value = v < cap ? v : cap;
	return true;
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
 * allowed; beyond RB_HDR_MAX_SECONDS it saturates); on RB_RA_DATE, the Unix
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
	if (rb_parse_digits_saturating(s, len, false, RB_HDR_MAX_SECONDS, &v))
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

/*****************************************************************************
 * Structured Fields (RFC 8941, with the RFC 9651 Date and Display String)
 *
 * Only what the rate-limit fields need: a List or Dictionary of Items and
 * Inner Lists with Parameters, parsed iteratively with a cursor.
 *****************************************************************************/

/* tchar of RFC 9110, plus ":" and "/" as sf-token allows. */
static bool
rb_sf_is_token_char(char c)
{
	return rb_is_alpha(c) || rb_is_digit(c) ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~:/", c) != NULL);
}

/* lcalpha / DIGIT / "_" / "-" / "." / "*", the rest of a key. */
static bool
rb_sf_is_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || rb_is_digit(c) ||
		c == '_' || c == '-' || c == '.' || c == '*';
}

/* Skip SP, the only whitespace inside Structured Field members. */
static void
rb_sf_skip_sp(RbCursor *c)
{
	while (rb_accept(c, ' '))
		;
}

/* Skip OWS, which may surround the commas between members. */
static void
rb_sf_skip_ows(RbCursor *c)
{
	while (!rb_at_end(c) && rb_is_ows(c->s[c->pos]))
		c->pos++;
}

/* key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" ) */
static bool
rb_sf_key(RbCursor *c, const char **key, size_t *key_len)
{
	size_t		start = c->pos;
	char		first = rb_peek(c);

	if (!((first >= 'a' && first <= 'z') || first == '*'))
		return false;
	c->pos++;
	while (!rb_at_end(c) && rb_sf_is_key_char(c->s[c->pos]))
		c->pos++;
	*key = c->s + start;
	*key_len = c->pos - start;
	return true;
}

/*
 * rb_sf_number
 *		sf-integer (at most 15 digits) or sf-decimal (at most 12 integer and
 *		1 to 3 fraction digits), with an optional leading "-".
 */
static bool
rb_sf_number(RbCursor *c, RbSfBare *b)
{
	bool		negative = rb_accept(c, '-');
	double		v = 0.0;
	int			int_digits = 0;
	int			frac_digits = 0;
	double		scale = 0.1;

	if (!rb_is_digit(rb_peek(c)))
		return false;
	while (rb_is_digit(rb_peek(c)))
	{
		if (++int_digits > 15)
			return false;
		v = v * 10.0 + (c->s[c->pos] - '0');
		c->pos++;
	}
	b->type = RB_SF_INTEGER;
	if (rb_accept(c, '.'))
	{
		if (int_digits > 12)
			return false;
		while (rb_is_digit(rb_peek(c)))
		{
			if (++frac_digits > 3)
				return false;
			v += (c->s[c->pos] - '0') * scale;
			scale /= 10.0;
			c->pos++;
		}
		if (frac_digits == 0)
			return false;
		b->type = RB_SF_DECIMAL;
	}
	b->num = negative ? -v : v;
	return true;
}

/* sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, ASCII. */
static bool
rb_sf_string(RbCursor *c, RbSfBare *b)
{
	size_t		start;

	if (!rb_accept(c, '"'))
		return false;
	start = c->pos;
	while (!rb_at_end(c))
	{
		char		ch = c->s[c->pos];

		if (ch == '"')
		{
			b->type = RB_SF_STRING;
			b->str = c->s + start;
			b->str_len = c->pos - start;
			c->pos++;
			return true;
		}
		if (ch == '\\')
		{
			c->pos++;
			if (rb_peek(c) != '"' && rb_peek(c) != '\\')
				return false;
		}
		else if (ch < 0x20 || ch > 0x7e)	/* char may be signed: both */
			return false;
		c->pos++;
	}
	return false;				/* no closing quote */
}

/* sf-display-string (RFC 9651): "%" DQUOTE *( unescaped / "%" 2lchex ) DQUOTE */
static bool
rb_sf_display_string(RbCursor *c, RbSfBare *b)
{
	if (!(rb_accept(c, '%') && rb_accept(c, '"')))
		return false;
	while (!rb_at_end(c))
	{
		char		ch = c->s[c->pos++];

		if (ch == '"')
		{
			b->type = RB_SF_DISPLAY;
			return true;
		}
		if (ch == '%')
		{
			int			i;

			for (i = 0; i < 2; i++)
			{
				char		h = rb_peek(c);

				if (!(rb_is_digit(h) || (h >= 'a' && h <= 'f')))
					return false;
				c->pos++;
			}
		}
		else if (ch < 0x20 || ch > 0x7e)
			return false;
	}
	return false;
}

/* sf-token = ( ALPHA / "*" ) *( tchar / ":" / "/" ) */
static bool
rb_sf_token(RbCursor *c, RbSfBare *b)
{
	size_t		start = c->pos;

	if (!(rb_is_alpha(rb_peek(c)) || rb_peek(c) == '*'))
		return false;
	c->pos++;
	while (!rb_at_end(c) && rb_sf_is_token_char(c->s[c->pos]))
		c->pos++;
	b->type = RB_SF_TOKEN;
	b->str = c->s + start;
	b->str_len = c->pos - start;
	return true;
}

/* sf-binary = ":" *(base64) ":" */
static bool
rb_sf_bytes(RbCursor *c, RbSfBare *b)
{
	if (!rb_accept(c, ':'))
		return false;
	while (!rb_at_end(c))
	{
		char		ch = c->s[c->pos++];

		if (ch == ':')
		{
			b->type = RB_SF_BYTES;
			return true;
		}
		if (!(rb_is_alpha(ch) || rb_is_digit(ch) ||
			  ch == '+' || ch == '/' || ch == '='))
			return false;
	}
	return false;
}

/* bare-item: any of the eight kinds, chosen by its first byte. */
static bool
rb_sf_bare(RbCursor *c, RbSfBare *b)
{
	char		first = rb_peek(c);

	b->num = 0.0;
	b->str = NULL;
	b->str_len = 0;
	if (first == '-' || rb_is_digit(first))
		return rb_sf_number(c, b);
	if (first == '"')
		return rb_sf_string(c, b);
	if (first == '*' || rb_is_alpha(first))
		return rb_sf_token(c, b);
	if (first == ':')
		return rb_sf_bytes(c, b);
	if (first == '?')
	{
		c->pos++;
		if (rb_peek(c) != '0' && rb_peek(c) != '1')
			return false;
		b->type = RB_SF_BOOLEAN;
		b->num = c->s[c->pos] - '0';
		c->pos++;
		return true;
	}
	if (first == '@')
	{
		c->pos++;
		if (!rb_sf_number(c, b) || b->type != RB_SF_INTEGER)
			return false;
		b->type = RB_SF_DATE;
		return true;
	}
	if (first == '%')
		return rb_sf_display_string(c, b);
	return false;
}

/*
 * rb_sf_next_param
 *		If a parameter comes next (";" *SP key [ "=" bare-item ]), consume it
 *		and return 1; return 0 if none comes next, -1 if it does not parse.
 *		A parameter without a value is the boolean true.
 */
static int
rb_sf_next_param(RbCursor *c, const char **key, size_t *key_len,
				 RbSfBare *value)
{
	if (!rb_accept(c, ';'))
		return 0;
	rb_sf_skip_sp(c);
	if (!rb_sf_key(c, key, key_len))
		return -1;
	if (rb_accept(c, '='))
		return rb_sf_bare(c, value) ? 1 : -1;
	value->type = RB_SF_BOOLEAN;
	value->num = 1.0;
	value->str = NULL;
	value->str_len = 0;
	return 1;
}

/* Consume the parameters that come next, whatever they are. */
static bool
rb_sf_skip_params(RbCursor *c)
{
	const char *key;
	size_t		key_len;
	RbSfBare	value;
	int			r;

	while ((r = rb_sf_next_param(c, &key, &key_len, &value)) == 1)
		;
	return r == 0;
}

/*
 * rb_sf_find_param
 *		The value of the last parameter named key among the member's
 *		parameters (the last wins, RFC 8941 section 4.2.3.2).  The parameters
 *		were checked when the member was parsed.
 */
static bool
rb_sf_find_param(const char *s, const RbSfMember *m, const char *key,
				 RbSfBare *value)
{
	RbCursor	c;
	const char *k;
	size_t		k_len;
	RbSfBare	v;
	bool		found = false;

	c.s = s;
	c.len = m->params_end;
	c.pos = m->params_start;
	while (rb_sf_next_param(&c, &k, &k_len, &v) == 1)
	{
		if (rb_equals(k, k_len, key))
		{
			*value = v;
			found = true;
		}
	}
	return found;
}

/*
 * rb_sf_member
 *		An Item or an Inner List, then its parameters.  The items of an inner
 *		list are checked and skipped: no rate-limit field uses them.
 */
static bool
rb_sf_member(RbCursor *c, RbSfMember *m)
{
	if (rb_accept(c, '('))
	{
		m->inner_list = true;
		for (;;)
		{
			RbSfBare	item;

			rb_sf_skip_sp(c);
			if (rb_accept(c, ')'))
				break;
			if (!rb_sf_bare(c, &item) || !rb_sf_skip_params(c))
				return false;
			if (rb_peek(c) != ' ' && rb_peek(c) != ')')
				return false;
		}
	}
	else
	{
		m->inner_list = false;
		if (!rb_sf_bare(c, &m->bare))
			return false;
	}
	m->params_start = c->pos;
	if (!rb_sf_skip_params(c))
		return false;
	m->params_end = c->pos;
	return true;
}

/*
 * rb_sf_separator
 *		After a member of a List or Dictionary: return 0 at the end of the
 *		value, 1 if "," and another member follow, -1 for anything else
 *		(including a trailing comma).
 */
static int
rb_sf_separator(RbCursor *c)
{
	rb_sf_skip_ows(c);
	if (rb_at_end(c))
		return 0;
	if (!rb_accept(c, ','))
		return -1;
	rb_sf_skip_ows(c);
	return rb_at_end(c) ? -1 : 1;
}

/* A non-negative sf-integer, as the drafts require of every count. */
static bool
rb_sf_count(const RbSfBare *b, double *value)
{
	if (b->type != RB_SF_INTEGER || b->num < 0.0)
		return false;
	*value = b->num;
	return true;
}

/*****************************************************************************
 * The rate-limit fields
 *****************************************************************************/

/* A duration in seconds, saturated at RB_HDR_MAX_SECONDS. */
static double
rb_cap_seconds(double seconds)
{
	return seconds < RB_HDR_MAX_SECONDS ? seconds : RB_HDR_MAX_SECONDS;
}

/*
 * rb_parse_policy_field
 *		RateLimit-Policy: a List of quota policies, each either
 *		  100;w=60				 (drafts -05 to -07: the item is the quota)
 *		  "name";q=100;w=60		 (draft -08 on: q is the quota)
 *		with w, the window in seconds, optional.  Of the policies, the one
 *		with the lowest rate q/w is chosen (the lower quota on a tie); if none
 *		has a window, the lowest quota.  A policy whose "qu" says its quota is
 *		not counted in requests (content-bytes, concurrent-requests) is
 *		skipped.  False if the field is malformed.
 */
static bool
rb_parse_policy_field(const char *s, size_t len, RbFieldValues *out)
{
	RbCursor	c;
	bool		have = false;
	double		best_q = 0.0;
	double		best_w = 0.0;	/* 0: no window */
	int			sep;

	c.s = s;
	c.len = len;
	c.pos = 0;
	do
	{
		RbSfMember	m;
		RbSfBare	p;
		double		q;
		double		w = 0.0;
		bool		better;

		if (!rb_sf_member(&c, &m) || m.inner_list)
			return false;
		if (m.bare.type == RB_SF_INTEGER)
		{
			if (!rb_sf_count(&m.bare, &q))
				return false;
		}
		else if (m.bare.type == RB_SF_STRING || m.bare.type == RB_SF_TOKEN)
		{
			if (!rb_sf_find_param(s, &m, "q", &p) || !rb_sf_count(&p, &q))
				return false;
		}
		else
			return false;
		if (rb_sf_find_param(s, &m, "w", &p))
		{
			if (!rb_sf_count(&p, &w) || w <= 0.0)
				return false;
			w = rb_cap_seconds(w);
		}
		if (rb_sf_find_param(s, &m, "qu", &p))
		{
			if (p.type != RB_SF_STRING && p.type != RB_SF_TOKEN)
				return false;
			if (!rb_equals(p.str, p.str_len, "requests"))
				continue;		/* a quota of bytes, or of concurrency */
		}

		if (!have)
			better = true;
		else if ((w > 0.0) != (best_w > 0.0))
			better = w > 0.0;	/* a known rate beats an unknown one */
		else if (w > 0.0 && q / w != best_q / best_w)
			better = q / w < best_q / best_w;
		else
			better = q < best_q;
		if (better)
		{
			have = true;
			best_q = q;
			best_w = w;
		}
	} while ((sep = rb_sf_separator(&c)) == 1);
	if (sep < 0)
		return false;

	if (have)
	{
		out->has_limit = true;
		out->limit = best_q;
		out->has_window = best_w > 0.0;
		out->window = best_w;
	}
	return true;
}

/*
 * rb_parse_ratelimit_dictionary
 *		RateLimit as a Dictionary (draft -07): limit=100, remaining=50,
 *		reset=30, each a non-negative integer.  Returns 1 if parsed, 0 if the
 *		value is not such a dictionary (it may be the newer List form), -1 if
 *		it is one but a value is not allowed.
 */
static int
rb_parse_ratelimit_dictionary(const char *s, size_t len, RbFieldValues *out)
{
	static const char *const keys[3] = {"limit", "remaining", "reset"};
	RbSfBare	values[3];
	bool		seen[3] = {false, false, false};
	double		v[3] = {0.0, 0.0, 0.0};
	RbCursor	c;
	int			sep;
	int			i;

	memset(values, 0, sizeof(values));
	c.s = s;
	c.len = len;
	c.pos = 0;
	do
	{
		const char *key;
		size_t		key_len;
		RbSfMember	m;

		if (!rb_sf_key(&c, &key, &key_len))
			return 0;
		if (rb_accept(&c, '='))
		{
			if (!rb_sf_member(&c, &m))
				return 0;
		}
		else
		{
			memset(&m, 0, sizeof(m));
			m.bare.type = RB_SF_BOOLEAN;
			m.bare.num = 1.0;
			if (!rb_sf_skip_params(&c))
				return 0;
		}
		for (i = 0; i < 3; i++)
		{
			if (rb_equals(key, key_len, keys[i]))
			{
				/* the last instance of a key wins */
				seen[i] = true;
				values[i] = m.bare;
				if (m.inner_list)
					values[i].type = RB_SF_BOOLEAN; /* i.e. not a count */
			}
		}
	} while ((sep = rb_sf_separator(&c)) == 1);
	if (sep < 0)
		return 0;
	if (!seen[0] && !seen[1] && !seen[2])
		return 0;

	for (i = 0; i < 3; i++)
	{
		if (seen[i] && !rb_sf_count(&values[i], &v[i]))
			return -1;
	}
	out->has_limit = seen[0];
	out->limit = v[0];
	out->has_remaining = seen[1];
	out->remaining = v[1];
	out->has_reset = seen[2];
	out->reset = rb_cap_seconds(v[2]);
	return 1;
}

/*
 * rb_parse_ratelimit_list
 *		RateLimit as a List (draft -08 on): "name";r=50;t=30, r required, t
 *		optional, both non-negative integers.  Of several items the most
 *		restrictive is taken: the lowest r, then the longest t.  False if
 *		malformed.
 */
static bool
rb_parse_ratelimit_list(const char *s, size_t len, RbFieldValues *out)
{
	RbCursor	c;
	bool		have = false;
	double		best_r = 0.0;
	double		best_t = -1.0;	/* -1: no t */
	int			sep;

	c.s = s;
	c.len = len;
	c.pos = 0;
	do
	{
		RbSfMember	m;
		RbSfBare	p;
		double		r;
		double		t = -1.0;

		if (!rb_sf_member(&c, &m) || m.inner_list)
			return false;
		if (!rb_sf_find_param(s, &m, "r", &p) || !rb_sf_count(&p, &r))
			return false;
		if (rb_sf_find_param(s, &m, "t", &p))
		{
			if (!rb_sf_count(&p, &t))
				return false;
			t = rb_cap_seconds(t);
		}
		if (!have || r < best_r || (r == best_r && t > best_t))
		{
			have = true;
			best_r = r;
			best_t = t;
		}
	} while ((sep = rb_sf_separator(&c)) == 1);
	if (sep < 0)
		return false;

	out->has_remaining = true;
	out->remaining = best_r;
	out->has_reset = best_t >= 0.0;
	out->reset = best_t >= 0.0 ? best_t : 0.0;
	return true;
}

/*
 * rb_parse_ratelimit_field
 *		RateLimit in either generation: the Dictionary of draft -07 when the
 *		value is one and names limit, remaining or reset; else the List of
 *		draft -08 on.  False if malformed.
 */
static bool
rb_parse_ratelimit_field(const char *s, size_t len, RbFieldValues *out)
{
	RbFieldValues v;
	int			r;

	memset(&v, 0, sizeof(v));
	r = rb_parse_ratelimit_dictionary(s, len, &v);
	if (r < 0)
		return false;
	if (r == 0)
	{
		memset(&v, 0, sizeof(v));
		if (!rb_parse_ratelimit_list(s, len, &v))
			return false;
	}
	*out = v;
	return true;
}

/*
 * rb_parse_x_number
 *		An X-RateLimit-* value: a non-negative number, 1*DIGIT [ "." 1*DIGIT ],
 *		saturated at cap.  The value may go on after a "," or ";" (the
 *		RateLimit-Limit of drafts -00 to -04 read "100, 100;w=60"): the first
 *		number is the one taken.  False for anything else.
 */
static bool
rb_parse_x_number(const char *s, size_t len, double cap, double *value)
{
	size_t		n = 0;

	while (n < len && (rb_is_digit(s[n]) || s[n] == '.'))
		n++;
	if (!rb_parse_digits_saturating(s, n, true, cap, value))
		return false;
	while (n < len && rb_is_ows(s[n]))
		n++;
	return n == len || s[n] == ',' || s[n] == ';';
}

/*
 * rb_parse_x_reset
 *		X-RateLimit-Reset: seconds until the reset, or, above
 *		RB_HDR_EPOCH_THRESHOLD, the Unix time of the reset; an HTTP-date is
 *		understood too.  A time in the past is a reset of 0.
 */
static bool
rb_parse_x_reset(const char *s, size_t len, double now_unix, double *seconds)
{
	double		v;

	if (rb_parse_x_number(s, len, 1e18, &v))
	{
		if (v > RB_HDR_EPOCH_THRESHOLD)
			v -= now_unix;
	}
	else if (rb_parse_http_date(s, len, now_unix, &v))
		v -= now_unix;
	else
		return false;
	if (!(v > 0.0))				/* also a NaN from a bad now_unix */
		v = 0.0;
	*seconds = rb_cap_seconds(v);
	return true;
}

/*
 * rb_parse_rate_limit
 *		Parse the rate-limit fields of one response together.
 *
 * Each field is (pointer, length), NULL when absent; a field that is empty
 * or blank counts as absent.  ratelimit and policy are the IETF draft's
 * RateLimit and RateLimit-Policy, in either generation; x_limit, x_remaining
 * and x_reset are X-RateLimit-Limit, -Remaining and -Reset (or the
 * RateLimit-Limit, -Remaining and -Reset of drafts -00 to -06, which mean
 * the same).  now_unix is the time the response was received.
 *
 * What the IETF fields say wins over the X- fields, value by value:
 *	limit, window: the chosen RateLimit-Policy, else the draft -07 limit of
 *				   RateLimit, else X-RateLimit-Limit (the window comes only
 *				   from RateLimit-Policy);
 *	remaining:	   RateLimit (remaining= or r=), else X-RateLimit-Remaining;
 *	reset:		   RateLimit (reset= or t=), else X-RateLimit-Reset.
 * A field that does not parse, or holds a value that is not allowed (a
 * negative or fractional count, a zero window), gives nothing and adds one
 * to out->malformed.  Durations saturate at RB_HDR_MAX_SECONDS and counts at
 * RB_HDR_MAX_COUNT.
 */
void
rb_parse_rate_limit(const char *ratelimit, size_t ratelimit_len,
					const char *policy, size_t policy_len,
					const char *x_limit, size_t x_limit_len,
					const char *x_remaining, size_t x_remaining_len,
					const char *x_reset, size_t x_reset_len,
					double now_unix, RbRateLimit *out)
{
	RbFieldValues rl;
	RbFieldValues pol;
	double		v;

	memset(out, 0, sizeof(*out));
	memset(&rl, 0, sizeof(rl));
	memset(&pol, 0, sizeof(pol));

	if (ratelimit != NULL)
	{
		rb_trim(&ratelimit, &ratelimit_len);
		if (ratelimit_len > 0 &&
			!rb_parse_ratelimit_field(ratelimit, ratelimit_len, &rl))
			out->malformed++;
	}
	if (policy != NULL)
	{
		rb_trim(&policy, &policy_len);
		if (policy_len > 0 &&
			!rb_parse_policy_field(policy, policy_len, &pol))
			out->malformed++;
	}

	if (pol.has_limit)
	{
		out->has_limit = true;
		out->limit = pol.limit;
		out->has_window = pol.has_window;
		out->window_seconds = pol.window;
	}
	else if (rl.has_limit)
	{
		out->has_limit = true;
		out->limit = rl.limit;
	}
	if (rl.has_remaining)
	{
		out->has_remaining = true;
		out->remaining = rl.remaining;
	}
	if (rl.has_reset)
	{
		out->has_reset = true;
		out->reset_seconds = rl.reset;
	}

	/* The X- fields: each one is parsed (and counted) even if unused. */
	if (x_limit != NULL)
	{
		rb_trim(&x_limit, &x_limit_len);
		if (x_limit_len > 0)
		{
			if (!rb_parse_x_number(x_limit, x_limit_len, RB_HDR_MAX_COUNT, &v))
				out->malformed++;
			else if (!out->has_limit)
			{
				out->has_limit = true;
				out->limit = v;
			}
		}
	}
	if (x_remaining != NULL)
	{
		rb_trim(&x_remaining, &x_remaining_len);
		if (x_remaining_len > 0)
		{
			if (!rb_parse_x_number(x_remaining, x_remaining_len,
								   RB_HDR_MAX_COUNT, &v))
				out->malformed++;
			else if (!out->has_remaining)
			{
				out->has_remaining = true;
				out->remaining = v;
			}
		}
	}
	if (x_reset != NULL)
	{
		rb_trim(&x_reset, &x_reset_len);
		if (x_reset_len > 0)
		{
			if (!rb_parse_x_reset(x_reset, x_reset_len, now_unix, &v))
				out->malformed++;
			else if (!out->has_reset)
			{
				out->has_reset = true;
				out->reset_seconds = v;
			}
		}
	}
}
