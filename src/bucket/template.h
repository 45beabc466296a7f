/*-------------------------------------------------------------------------
 *
 * template.h
 *	  Templates: the configuration of endpoints nobody configured, chosen
 *	  by key pattern ("acct:*", or "*" for every endpoint), kept in
 *	  ratebucket.bucket_templates (template.c).
 *
 * An endpoint that a configured take (or a claim) meets with no
 * configuration is configured from the most specific template that
 * matches it, under its row lock, in the transaction of that take
 * (engine/template.c).  This file reads and writes the templates, keeps
 * each backend's copy of them, and finds the endpoints a change concerns.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_TEMPLATE_H
#define RATEBUCKET_BUCKET_TEMPLATE_H

#include "postgres.h"

#include "nodes/pg_list.h"

#include "bucket/bucket.h"

/* Longest pattern accepted, in bytes (it is stored in RbBucket). */
#define RB_MAX_PATTERN_BYTES (RB_TEXT_LEN - 1)

typedef struct RbTemplate
{
	char		pattern[RB_TEXT_LEN];	/* "acct:*", or "*" */
	int			prefix_len;		/* bytes before the final '*' */
	RbConfig	config;
} RbTemplate;

extern int	rb_template_check_pattern(const char *pattern);
extern bool rb_template_match(text *endpoint, RbTemplate *out);
extern void rb_template_lock(bool change);
extern bool rb_template_store(const RbTemplate *tmpl);
extern bool rb_template_delete(const char *pattern);
extern List *rb_template_followers(const char *pattern, bool outranked);
extern void rb_template_invalidate(void);

#endif							/* RATEBUCKET_BUCKET_TEMPLATE_H */
