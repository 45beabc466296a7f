/*-------------------------------------------------------------------------
 *
 * lex.h
 *	  Lexical pieces shared by the header parsers of src/core: character
 *	  classes, a cursor over a field value, OWS trimming, exact compares and
 *	  saturating digit strings.
 *
 * Internal to src/core (http_date.c, sfv.c, ratelimit.c); the public API is
 * core/headers.h.  Every field value is (pointer, length), never
 * NUL-terminated, so nothing here reads past the length it is given.  The
 * compares are exact, byte for byte: HTTP-dates and Structured Field keys
 * are case-sensitive (RFC 9110 section 5.6.7, RFC 8941 section 3.1.2).
 *
 * The one-line classes and cursor steps are static inline, as they were
 * static in a single file before: they run once per byte.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_LEX_H
#define RATEBUCKET_CORE_LEX_H

#include <stdbool.h>
#include <stddef.h>

/* A cursor over a field value: bytes s[0 .. len-1], the next at pos. */
typedef struct RbCursor
{
	const char *s;
	size_t		len;
	size_t		pos;
} RbCursor;

/* SP or HTAB: the OWS of RFC 9110. */
static inline bool
rb_is_ows(char c)
{
	return c == ' ' || c == '\t';
}

/* An ASCII digit. */
static inline bool
rb_is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* An ASCII letter (ALPHA of RFC 5234). */
static inline bool
rb_is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Has the cursor consumed every byte? */
static inline bool
rb_at_end(const RbCursor *c)
{
	return c->pos >= c->len;
}

/* The next byte, or NUL at the end (NUL is never a valid byte anywhere). */
static inline char
rb_peek(const RbCursor *c)
{
	return c->pos < c->len ? c->s[c->pos] : '\0';
}

/* Consume ch if it is next. */
static inline bool
rb_accept(RbCursor *c, char ch)
{
	if (c->pos < c->len && c->s[c->pos] == ch)
	{
		c->pos++;
		return true;
	}
	return false;
}

/* Strip leading and trailing OWS from (*s, *len). */
extern void rb_trim(const char **s, size_t *len);

/* Does (s, len) equal the NUL-terminated word, byte for byte? */
extern bool rb_equals(const char *s, size_t len, const char *word);

/*
 * (s, len) as 1*DIGIT [ "." 1*DIGIT ] (the fraction only when
 * allow_fraction), saturated at cap; false for anything else.
 */
extern bool rb_parse_digits_saturating(const char *s, size_t len,
									   bool allow_fraction, double cap,
									   double *value);

#endif							/* RATEBUCKET_CORE_LEX_H */
