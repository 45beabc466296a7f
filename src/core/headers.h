/*-------------------------------------------------------------------------
 *
 * headers.h
 *	  Parsers for the response fields a destination uses to say how fast it
 *	  may be called: Retry-After, HTTP-date, and the rate-limit fields.
 *
 * Nothing here calls PostgreSQL, and nothing allocates, recurses or reads
 * past the length it is given: the parsers take any bytes (they will be
 * fuzzed) and say "malformed" rather than guess.  Times are Unix seconds.
 *
 * The parsers are split by grammar, under src/core:
 *	 http_date.c  HTTP-date, its three forms (RFC 9110 section 5.6.7), and
 *				  Retry-After (RFC 9110 section 10.2.3);
 *	 sfv.c		  Structured Field Values (RFC 8941, RFC 9651), the syntax of
 *				  RateLimit and RateLimit-Policy (internal API in sfv.h);
 *	 ratelimit.c  RateLimit and RateLimit-Policy (the IETF httpapi drafts),
 *				  X-RateLimit-Limit, -Remaining and -Reset, and
 *				  rb_parse_rate_limit, which combines them;
 *	 lex.c		  what more than one of those needs: OWS, exact compares,
 *				  saturating digit strings (internal API in lex.h).
 * Only this header is the public API.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_HEADERS_H
#define RATEBUCKET_CORE_HEADERS_H

#include <stdbool.h>
#include <stddef.h>

/* Rate-limit durations saturate here (about 31.7 years). */
#define RB_HDR_MAX_SECONDS 1e9

/*
 * A Retry-After delay-seconds is exact up to 2^31 and saturates there: the
 * value RFC 9111 (section 1.2.2) has a recipient use for any delta-seconds
 * too large to represent.
 */
#define RB_RETRY_AFTER_MAX_SECONDS 2147483648.0

/* Counts (limits, remaining) saturate here. */
#define RB_HDR_MAX_COUNT 1e15

/* An X-RateLimit-Reset above this is a Unix timestamp, not a delay. */
#define RB_HDR_EPOCH_THRESHOLD 1e9

/* Retry-After (RFC 9110 section 10.2.3): delay-seconds or an HTTP-date. */
typedef enum RbRetryAfterKind
{
	RB_RA_ABSENT,				/* empty or all whitespace */
	RB_RA_DELAY,				/* *value = seconds, 0 to 2^31 */
	RB_RA_DATE,					/* *value = Unix seconds of the date */
	RB_RA_MALFORMED				/* anything else */
} RbRetryAfterKind;

/*
 * Parse a Retry-After value (s, len); *value gets the delay or the date.
 * A two-digit RFC 850 year is resolved against now_unix.
 */
extern RbRetryAfterKind rb_parse_retry_after_at(const char *s, size_t len,
												double now_unix,
												double *value);

/* Parse an HTTP-date (any of the three forms) into Unix seconds. */
extern bool rb_parse_http_date(const char *s, size_t len, double now_unix,
							   double *unix_seconds);

/* Rate-limit fields a destination may send, parsed together. */
typedef struct RbRateLimit
{
	bool		has_limit;
	double		limit;			/* requests allowed per window */
	bool		has_window;
	double		window_seconds; /* the window of that limit */
	bool		has_remaining;
	double		remaining;		/* requests left in the current window */
	bool		has_reset;
	double		reset_seconds;	/* seconds from now until the window resets */
	int			malformed;		/* how many given fields could not be parsed */
} RbRateLimit;

/*
 * Parse RateLimit, RateLimit-Policy, X-RateLimit-Limit, -Remaining and
 * -Reset (each NULL when absent) as received at now_unix.  The IETF fields
 * win over the X- ones, value by value: limit and window from the policy
 * with the lowest rate, else RateLimit's limit=, else X-RateLimit-Limit;
 * remaining and reset from RateLimit (the most restrictive item), else the
 * X- fields.  A field that does not parse gives nothing and counts in
 * malformed.  See ratelimit.c for the syntaxes accepted.
 */
extern void rb_parse_rate_limit(const char *ratelimit, size_t ratelimit_len,
								const char *policy, size_t policy_len,
								const char *x_limit, size_t x_limit_len,
								const char *x_remaining, size_t x_remaining_len,
								const char *x_reset, size_t x_reset_len,
								double now_unix, RbRateLimit *out);

#endif							/* RATEBUCKET_CORE_HEADERS_H */
