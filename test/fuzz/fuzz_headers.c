/*-------------------------------------------------------------------------
 *
 * fuzz_headers.c
 *	  libFuzzer target for the header parsers of src/core (http_date.c,
 *	  sfv.c, ratelimit.c, lex.c): rb_parse_retry_after_at, rb_parse_http_date
 *	  and rb_parse_rate_limit.
 *
 * Input format (kept readable, so that the seed corpus can be written by
 * hand):
 *
 *	 [ "@" NOW "\n" ]  FIELD0 [ "\n" FIELD1 ... "\n" FIELD5 ]
 *
 * NOW is the reference clock in Unix seconds: an optional "-" and digits,
 * or "nan", "inf", "-inf" (absent: 1700000000, 2023-11-14).  FIELD0 is a
 * Retry-After value (also parsed as a bare HTTP-date); FIELD1 to FIELD5 are
 * RateLimit, RateLimit-Policy, X-RateLimit-Limit, -Remaining and -Reset.  A
 * field that is not in the input is passed as NULL (absent); any byte
 * except "\n" may appear in a field, NUL included.
 *
 * Every field is copied into a heap buffer of exactly its length, so that
 * AddressSanitizer catches a parser that reads one byte past the length it
 * was given.  What the parsers return is checked against what
 * core/headers.h promises; a violation calls abort(), which libFuzzer
 * reports as a crash.
 *
 *-------------------------------------------------------------------------
 */
#define _POSIX_C_SOURCE 200809L	/* gmtime_r */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/headers.h"

#define NFIELDS 6

#define CHECK(cond) \
	do { \
		if (!(cond)) \
		{ \
			fprintf(stderr, "fuzz_headers: invariant violated at %s:%d: %s\n", \
					__FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

/* A copy of (s, len) in a buffer of exactly len bytes (1 if len is 0). */
static char *
exact_copy(const uint8_t *s, size_t len)
{
	char	   *p = malloc(len > 0 ? len : 1);

	if (p == NULL)
		abort();
	if (len > 0)
		memcpy(p, s, len);
	return p;
}

/* Parse the "@NOW" line; *now_unix gets the clock. */
static void
parse_now(const uint8_t *s, size_t len, double *now_unix)
{
	size_t		i = 0;
	int			neg = 0;
	double		v = 0.0;

	if (len == 3 && memcmp(s, "nan", 3) == 0)
	{
		*now_unix = NAN;
		return;
	}
	if (len == 3 && memcmp(s, "inf", 3) == 0)
	{
		*now_unix = INFINITY;
		return;
	}
	if (len == 4 && memcmp(s, "-inf", 4) == 0)
	{
		*now_unix = -INFINITY;
		return;
	}
	if (i < len && s[i] == '-')
	{
		neg = 1;
		i++;
	}
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		v = v * 10.0 + (s[i] - '0');
	*now_unix = neg ? -v : v;
}

/* A finite number within [lo, hi]. */
static int
within(double v, double lo, double hi)
{
	return isfinite(v) && v >= lo && v <= hi;
}

/*
 * A date the parser accepted, printed back as an IMF-fixdate, must parse to
 * the very same time (when its year has four digits).
 */
static void
check_date_roundtrip(double unix_seconds, double now_unix)
{
	time_t		t;
	struct tm	tm;
	char		buf[64];
	int			n;
	double		again = NAN;
	static const char *const days[7] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char *const months[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
	"Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

	CHECK(isfinite(unix_seconds));
	CHECK(unix_seconds == floor(unix_seconds));
	/* 0000-01-01 .. 9999-12-31 23:59:59 */
	if (unix_seconds < -62167219200.0 || unix_seconds > 253402300799.0)
		return;
	t = (time_t) unix_seconds;
	if (gmtime_r(&t, &tm) == NULL)
		return;
	n = snprintf(buf, sizeof(buf), "%s, %02d %s %04d %02d:%02d:%02d GMT",
				 days[tm.tm_wday], tm.tm_mday, months[tm.tm_mon],
				 tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
	CHECK(n > 0 && (size_t) n < sizeof(buf));
	CHECK(rb_parse_http_date(buf, (size_t) n, now_unix, &again));
	CHECK(again == unix_seconds);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	double		now_unix = 1700000000.0;
	const uint8_t *field[NFIELDS] = {NULL};
	size_t		field_len[NFIELDS] = {0};
	char	   *copy[NFIELDS] = {NULL};
	int			nfields = 0;
	size_t		pos = 0;
	int			i;

	/* the optional clock line */
	if (size > 0 && data[0] == '@')
	{
		const uint8_t *nl = memchr(data, '\n', size);
		size_t		end = nl ? (size_t) (nl - data) : size;

		parse_now(data + 1, end - 1, &now_unix);
		pos = nl ? end + 1 : size;
		if (nl == NULL)
			size = pos;			/* no field at all */
	}

	/* the fields, split on "\n" */
	if (pos < size || (pos == size && size == 0))
	{
		while (nfields < NFIELDS)
		{
			const uint8_t *nl = memchr(data + pos, '\n', size - pos);
			size_t		end = nl ? (size_t) (nl - data) : size;

			field[nfields] = data + pos;
			field_len[nfields] = end - pos;
			nfields++;
			if (nl == NULL)
				break;
			pos = end + 1;
		}
	}
	for (i = 0; i < nfields; i++)
		copy[i] = exact_copy(field[i], field_len[i]);

	/* Retry-After, and the same bytes as a bare HTTP-date */
	if (nfields >= 1)
	{
		double		value = -12345.0;
		double		date = -12345.0;
		RbRetryAfterKind kind;
		bool		is_date;

		kind = rb_parse_retry_after_at(copy[0], field_len[0], now_unix, &value);
		switch (kind)
		{
			case RB_RA_ABSENT:
			case RB_RA_MALFORMED:
				CHECK(value == -12345.0);	/* untouched */
				break;
			case RB_RA_DELAY:
				CHECK(within(value, 0.0, RB_RETRY_AFTER_MAX_SECONDS));
				CHECK(value == floor(value));
				break;
			case RB_RA_DATE:
				CHECK(isfinite(value));
				check_date_roundtrip(value, now_unix);
				break;
			default:
				CHECK(!"unknown Retry-After kind");
		}

		is_date = rb_parse_http_date(copy[0], field_len[0], now_unix, &date);
		if (is_date)
		{
			CHECK(isfinite(date));
			/* a bare date is a Retry-After date too (no OWS to trim) */
			CHECK(kind == RB_RA_DATE && value == date);
			check_date_roundtrip(date, now_unix);
		}
		else
			CHECK(date == -12345.0);
		/* the NULL pointer is "absent", whatever the length */
		CHECK(rb_parse_retry_after_at(NULL, field_len[0], now_unix, &value) == RB_RA_ABSENT);
		CHECK(!rb_parse_http_date(NULL, field_len[0], now_unix, &date));
	}

	/* the rate-limit fields: fields 1 to 5, NULL when not in the input */
	{
		RbRateLimit rl;
		int			given = 0;

		memset(&rl, 0xA5, sizeof(rl));	/* must all be overwritten */
		rb_parse_rate_limit(copy[1], field_len[1], copy[2], field_len[2],
							copy[3], field_len[3], copy[4], field_len[4],
							copy[5], field_len[5], now_unix, &rl);
		for (i = 1; i < NFIELDS; i++)
			given += copy[i] != NULL;
		CHECK(rl.malformed >= 0 && rl.malformed <= given);
		CHECK(rl.has_limit == 0 || rl.has_limit == 1);
		CHECK(rl.has_window == 0 || rl.has_window == 1);
		CHECK(rl.has_remaining == 0 || rl.has_remaining == 1);
		CHECK(rl.has_reset == 0 || rl.has_reset == 1);
		if (rl.has_limit)
			CHECK(within(rl.limit, 0.0, RB_HDR_MAX_COUNT));
		if (rl.has_window)
		{
			CHECK(rl.has_limit);
			CHECK(within(rl.window_seconds, 0.0, RB_HDR_MAX_SECONDS));
			CHECK(rl.window_seconds > 0.0);
		}
		if (rl.has_remaining)
			CHECK(within(rl.remaining, 0.0, RB_HDR_MAX_COUNT));
		if (rl.has_reset)
			CHECK(within(rl.reset_seconds, 0.0, RB_HDR_MAX_SECONDS));

		/* each field alone: absent in, nothing out */
		memset(&rl, 0, sizeof(rl));
		rb_parse_rate_limit(NULL, 5, NULL, 5, NULL, 5, NULL, 5, NULL, 5,
							now_unix, &rl);
		CHECK(!rl.has_limit && !rl.has_window && !rl.has_remaining &&
			  !rl.has_reset && rl.malformed == 0);
	}

	for (i = 0; i < nfields; i++)
		free(copy[i]);
	return 0;
}
