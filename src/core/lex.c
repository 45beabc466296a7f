/*-------------------------------------------------------------------------
 *
 * lex.c
 *	  The lexical helpers more than one header grammar needs: OWS trimming
 *	  (RFC 9110 section 5.6.3), exact compares, and digit strings read with
 *	  saturation.
 *
 * Retry-After's delay-seconds (RFC 9110 section 10.2.3) and the X-RateLimit
 * numbers are both digit strings that may be of any length; both, and every
 * field value before it is parsed, are trimmed of OWS.  The inline classes
 * and cursor steps are in lex.h.  Only libc is used.
 *
 *-------------------------------------------------------------------------
 */
#include <string.h>

#include "core/lex.h"

/* Strip leading and trailing OWS from (*s, *len). */
void
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
bool
rb_equals(const char *s, size_t len, const char *word)
{
	return strlen(word) == len && memcmp(s, word, len) == 0;
}

/*
 * rb_parse_digits_saturating
 *		(s, len) is 1*DIGIT [ "." 1*DIGIT ] when allow_fraction, else 1*DIGIT;
 *		its value, saturated at cap.  False for anything else.
 *
 * Digits past the cap are still checked, but no longer accumulated, so a
 * string of any length costs one pass and cannot overflow.
 */
bool
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
