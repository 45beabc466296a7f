/*-------------------------------------------------------------------------
 *
 * ratelimit.c
 *	  The rate-limit fields a destination sends: the IETF RateLimit and
 *	  RateLimit-Policy, and the de facto X-RateLimit-Limit, -Remaining and
 *	  -Reset, combined by rb_parse_rate_limit.
 *
 * Two families of fields are understood:
 *
 * - The IETF httpapi draft fields (draft-ietf-httpapi-ratelimit-headers),
 *	 Structured Fields (RFC 8941, with the RFC 9651 additions) parsed by
 *	 sfv.c; this file gives their members a meaning.  Two generations exist
 *	 in the wild:
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
 *	 reset either a delay or a Unix timestamp (or an HTTP-date, read by
 *	 http_date.c).
 *
 * Only libc is used, so that this file can be built alone and fuzzed.  Every
 * parser works on (pointer, length) without a terminating NUL, never reads
 * outside that range, never allocates and never recurses; its cost is linear
 * in the length.  Any byte is acceptable input: what is not understood is
 * reported as malformed, never guessed at.
 *
 *-------------------------------------------------------------------------
 */
#include <string.h>

#include "core/headers.h"
#include "core/lex.h"
#include "core/sfv.h"

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

/* A duration in seconds, saturated at RB_HDR_MAX_SECONDS. */
static double
rb_cap_seconds(double seconds)
{
	return seconds < RB_HDR_MAX_SECONDS ? seconds : RB_HDR_MAX_SECONDS;
}

/*****************************************************************************
 * RateLimit and RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers)
 *****************************************************************************/

/* A non-negative sf-integer, as the drafts require of every count. */
static bool
rb_sf_count(const RbSfBare *b, double *value)
{
	if (b->type != RB_SF_INTEGER || b->num < 0.0)
		return false;
	*value = b->num;
	return true;
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

		if (!rb_sf_dictionary_member(&c, &key, &key_len, &m))
			return 0;
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

/*****************************************************************************
 * X-RateLimit-Limit, -Remaining and -Reset (de facto, no specification)
 *****************************************************************************/

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
 * rb_parse_x_fields
 *		X-RateLimit-Limit, -Remaining and -Reset (each NULL when absent), for
 *		rb_parse_rate_limit: each sets its value in out unless the IETF
 *		fields already did.  Each one is parsed, and counted in
 *		out->malformed if it does not parse, even when its value is unused.
 */
static void
rb_parse_x_fields(const char *x_limit, size_t x_limit_len,
				  const char *x_remaining, size_t x_remaining_len,
				  const char *x_reset, size_t x_reset_len,
				  double now_unix, RbRateLimit *out)
{
	double		v;

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

/*****************************************************************************
 * All the rate-limit fields of a response
 *****************************************************************************/

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
	rb_parse_x_fields(x_limit, x_limit_len, x_remaining, x_remaining_len,
					  x_reset, x_reset_len, now_unix, out);
}
