/*-------------------------------------------------------------------------
 *
 * sfv.h
 *	  The Structured Field Values parser (RFC 8941, with the RFC 9651 Date
 *	  and Display String) that the IETF rate-limit fields are read with.
 *
 * Internal to src/core: sfv.c parses, ratelimit.c gives the members their
 * meaning.  A caller walks a List or Dictionary itself, member by member
 * (rb_sf_member or rb_sf_dictionary_member, then rb_sf_separator), and looks
 * up the parameters it cares about with rb_sf_find_param.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_SFV_H
#define RATEBUCKET_CORE_SFV_H

#include <stdbool.h>
#include <stddef.h>

#include "core/lex.h"

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

/* An Item or an Inner List at the cursor, then its parameters. */
extern bool rb_sf_member(RbCursor *c, RbSfMember *m);

/*
 * A Dictionary member at the cursor: key, then "=" and a member, or only
 * parameters (the value then being the boolean true).
 */
extern bool rb_sf_dictionary_member(RbCursor *c, const char **key,
									size_t *key_len, RbSfMember *m);

/* After a member: 0 at the end, 1 if another follows a ",", -1 if neither. */
extern int	rb_sf_separator(RbCursor *c);

/* The value of the last parameter named key of member m of field value s. */
extern bool rb_sf_find_param(const char *s, const RbSfMember *m,
							 const char *key, RbSfBare *value);

#endif							/* RATEBUCKET_CORE_SFV_H */
