/*-------------------------------------------------------------------------
 *
 * template.c
 *	  Endpoints configured by templates: the first use of an endpoint that
 *	  nobody configured, and bucket_template and bucket_template_drop
 *	  carried to the endpoints that follow them.
 *
 * An endpoint follows a template when the template configured it (its
 * row's template column names it).  It keeps following it, and takes every
 * change of it, until bucket_configure or bucket_configure_quota gives it a
 * configuration of its own.  A first use configures it exactly as
 * bucket_configure would, under its row lock, in the transaction of the
 * take or claim that needed it: a rollback takes the configuration back
 * with the take.  Peeks (bucket_claimable, bucket_grantable) write
 * nothing: they judge an endpoint a template would configure as that
 * configuration, banked now, would be (rb_template_peek).
 *
 * bucket_template configures, in byte order and each under its row lock,
 * every endpoint the new pattern now decides: those that follow it, and
 * those it matches that follow a less specific template.
 * bucket_template_drop moves the endpoints that followed the template to
 * the next template that matches them, and leaves those that none matches
 * with the configuration they had, as their own: dropping a template never
 * leaves an endpoint without limits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "bucket/template.h"
#include "engine/engine.h"

/*
 * Configure a row the caller holds from a template, and write it: what
 * the old limits earned is banked first, as bucket_configure does.  The
 * row is locked again afterwards, so that *bucket is its newest version,
 * ready for the caller's own write.
 */
static void
rb_configure_held(text *endpoint, RbBucket *bucket, const RbTemplate *tmpl)
{
	TimestampTz now = GetCurrentTimestamp();

	rb_bucket_bank(bucket, now);
	rb_bucket_configure(bucket, &tmpl->config, tmpl->pattern, now);
	if (rb_is_stripe_parent(bucket))
	{
		bucket->state.tokens = 0.0;
		rb_stripe_sync(endpoint, bucket, RB_SYNC_CONFIG);
	}
	rb_storage_update(bucket);
	if (!rb_storage_lock(endpoint, bucket))
		elog(ERROR, "bucket row of \"%s\" vanished after its configuration",
			 text_to_cstring(endpoint));
}

/*
 * The template that configures the endpoint at its first use, with the
 * templates locked for it (see bucket/template.c); false, locking nothing,
 * if none matches.
 */
static bool
rb_template_for_use(text *endpoint, RbTemplate *tmpl)
{
	if (!rb_template_match(endpoint, tmpl))
		return false;
	rb_template_lock(false);
	/* a change may have committed while we waited for the lock */
	return rb_template_match(endpoint, tmpl);
}

/*
 * rb_template_prelock
 *		For a call that locks several rows in order and may configure some
 *		of them from their template on the way (bucket_take_all,
 *		bucket_take_batch), called for its keys before it locks any row:
 *		if a template matches this key, take the templates' lock now and
 *		return true (the caller stops asking).  Waiting for that lock while
 *		holding rows, which a change of a template may have to lock, could
 *		deadlock with the change.
 */
bool
rb_template_prelock(text *endpoint)
{
	RbTemplate	tmpl;

	return rb_template_for_use(endpoint, &tmpl);
}

/*
 * rb_template_adopt_held
 *		The caller holds the endpoint's row, which has no configuration:
 *		configure it from the template that matches it, if one does.  True
 *		if it did (*bucket is then the configured row, still held).
 */
bool
rb_template_adopt_held(text *endpoint, RbBucket *bucket)
{
	RbTemplate	tmpl;

	Assert(!rb_is_configured(bucket));
	if (!rb_template_for_use(endpoint, &tmpl))
		return false;
	rb_configure_held(endpoint, bucket, &tmpl);
	return true;
}

/*
 * rb_lock_configured
 *		Lock the endpoint's row for a configured take: true if it is then
 *		held and configured, by bucket_configure or, at this first use, by
 *		the template that matches it (a missing row is created from it,
 *		full).  False if the endpoint has no configuration and no template
 *		matches it; *bucket then holds its row if it has one.
 */
bool
rb_lock_configured(text *endpoint, RbBucket *bucket)
{
	RbTemplate	tmpl;
	RbBucket	fresh;
	TimestampTz now;

	if (rb_storage_lock(endpoint, bucket))
		return rb_is_configured(bucket) ||
			rb_template_adopt_held(endpoint, bucket);
	if (!rb_template_for_use(endpoint, &tmpl))
		return false;

	now = GetCurrentTimestamp();
	rb_new_bucket(&fresh, tmpl.config.rate, tmpl.config.capacity, now);
	rb_bucket_configure(&fresh, &tmpl.config, tmpl.pattern, now);
	if (rb_storage_lock_or_insert(endpoint, bucket, &fresh))
	{
		/* another transaction created it meanwhile */
		return rb_is_configured(bucket) ||
			rb_template_adopt_held(endpoint, bucket);
	}
	if (!rb_storage_lock(endpoint, bucket))
		elog(ERROR, "bucket row of \"%s\" vanished after its insertion",
			 text_to_cstring(endpoint));
	return true;
}

/*
 * rb_template_peek
 *		For a peek of an endpoint without a configuration (*bucket its row
 *		as peeked if "found", else nothing): the row as the template that
 *		matches it would configure it now, in memory.  False, changing
 *		nothing, if none matches.
 */
bool
rb_template_peek(text *endpoint, RbBucket *bucket, bool found)
{
	RbTemplate	tmpl;
	TimestampTz now = GetCurrentTimestamp();

	if (!rb_template_match(endpoint, &tmpl))
		return false;
	if (found)
		rb_bucket_bank(bucket, now);
	else
		rb_new_bucket(bucket, tmpl.config.rate, tmpl.config.capacity, now);
	rb_bucket_configure(bucket, &tmpl.config, tmpl.pattern, now);
	return true;
}

/*
 * Carry a template to an endpoint it matches, under its row lock, if the
 * endpoint follows it or a less specific template.  True if it was
 * configured.
 */
static bool
rb_template_carry(text *endpoint, const RbTemplate *tmpl)
{
	RbBucket	bucket;
	const char *key = VARDATA_ANY(endpoint);
	int			len = VARSIZE_ANY_EXHDR(endpoint);

	if (!rb_storage_lock(endpoint, &bucket) || !rb_follows_template(&bucket))
		return false;
	/* configured from a template less specific than tmpl, or from it */
	if (len < tmpl->prefix_len || memcmp(key, tmpl->pattern, tmpl->prefix_len) != 0 ||
		(int) strlen(bucket.template_name) - 1 > tmpl->prefix_len)
		return false;
	rb_configure_held(endpoint, &bucket, tmpl);
	return true;
}

/*
 * rb_engine_template_for
 *		The template that would configure the endpoint if it had no
 *		configuration (bucket_template_for); false if none matches.
 */
bool
rb_engine_template_for(text *endpoint, RbTemplate *tmpl)
{
	RbStorageSession session;
	bool		found;

	rb_storage_begin_peek(&session);
	found = rb_template_match(endpoint, tmpl);
	rb_storage_end(&session);
	return found;
}

/*
 * Between two followers of a carry: a session that locks thousands of rows
 * starts afresh every RB_CARRY_SESSION_ROWS of them (a storage session
 * remembers every row it read), and a cancel is heard.
 */
#define RB_CARRY_SESSION_ROWS 256

static void
rb_template_next_follower(RbStorageSession *session, int done)
{
	CHECK_FOR_INTERRUPTS();
	if ((done + 1) % RB_CARRY_SESSION_ROWS == 0)
	{
		rb_storage_end(session);
		rb_storage_begin(session);
	}
}

/*
 * rb_engine_template_set
 *		Create or replace a template (bucket_template), and configure every
 *		endpoint it now decides.  Returns how many.
 */
int64
rb_engine_template_set(const RbTemplate *tmpl, bool *created)
{
	RbStorageSession session;
	List	   *endpoints;
	ListCell   *lc;
	int64		n = 0;

	rb_storage_begin(&session);
	rb_template_lock(true);
	*created = rb_template_store(tmpl);
	/*
	 * Every backend's copy of the templates is read again, this one's at
	 * once: told here, not left to the table's trigger, which does not fire
	 * under session_replication_role = replica or when it is disabled.
	 */
	rb_template_invalidate();
	endpoints = rb_template_followers(tmpl->pattern, true);
	foreach(lc, endpoints)
	{
		if (rb_template_carry((text *) lfirst(lc), tmpl))
			n++;
		rb_template_next_follower(&session, foreach_current_index(lc));
	}
	rb_storage_end(&session);
	return n;
}

/*
 * rb_engine_template_drop
 *		Drop a template (bucket_template_drop): its endpoints move to the
 *		next template that matches them, or keep their configuration as
 *		their own.  False if there was no such template.
 */
bool
rb_engine_template_drop(const char *pattern)
{
	RbStorageSession session;
	List	   *endpoints;
	ListCell   *lc;
	bool		found;

	rb_storage_begin(&session);
	rb_template_lock(true);
	found = rb_template_delete(pattern);
	/* the copy of the templates is read again: without this one */
	rb_template_invalidate();
	endpoints = found ? rb_template_followers(pattern, false) : NIL;
	foreach(lc, endpoints)
	{
		text	   *endpoint = (text *) lfirst(lc);
		RbBucket	bucket;
		RbTemplate	next;

		if (!rb_storage_lock(endpoint, &bucket) ||
			strcmp(bucket.template_name, pattern) != 0)
			continue;
		if (rb_template_match(endpoint, &next))
			rb_configure_held(endpoint, &bucket, &next);
		else
		{
			bucket.template_name[0] = '\0';
			rb_storage_update(&bucket);
		}
		rb_template_next_follower(&session, foreach_current_index(lc));
	}
	rb_storage_end(&session);
	return found;
}
