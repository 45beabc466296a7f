/*-------------------------------------------------------------------------
 *
 * sfv.c
 *	  Structured Field Values (RFC 8941, with the RFC 9651 Date and Display
 *	  String): the syntax of the IETF RateLimit and RateLimit-Policy fields.
 *
 * Only what the rate-limit fields need: the members of a List (RFC 8941
 * section 3.1) or Dictionary (section 3.2), each an Item or an Inner List
 * with Parameters (section 3.1.2), every kind of bare item (section 3.3).
 * Members are parsed iteratively with a cursor, one at a time; what they
 * mean is ratelimit.c's business.  Only libc is used; nothing reads outside
 * the value, allocates or recurses (an Inner List cannot nest).
 *
 *-------------------------------------------------------------------------
 */
#include <string.h>

#include "core/sfv.h"

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
bool
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
bool
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
 * rb_sf_dictionary_member
 *		A member of a Dictionary (RFC 8941 section 3.2): key "=" member, or a
 *		key and only parameters, the value then being the boolean true.
 */
bool
rb_sf_dictionary_member(RbCursor *c, const char **key, size_t *key_len,
						RbSfMember *m)
{
	if (!rb_sf_key(c, key, key_len))
		return false;
	if (rb_accept(c, '='))
		return rb_sf_member(c, m);
	memset(m, 0, sizeof(*m));
	m->bare.type = RB_SF_BOOLEAN;
	m->bare.num = 1.0;
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
int
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
