/*-------------------------------------------------------------------------
 *
 * take_all.c
 *	  bucket_take_all's decision: several configured buckets at once, all
 *	  or nothing.
 *
 * Every row is locked first, in lock order (the endpoints' bytes, the same
 * order for every caller whatever order they named them in, so that two
 * takers of the same buckets cannot deadlock), waiting for holders; then
 * the clock is read once and each bucket decides its take as bucket_take
 * would.  If all grant, every row is written; if one refuses, none is, and
 * the wait is the longest of the refusals' waits: the time until all of
 * them could grant, each refilling on its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

static int
rb_all_item_cmp(const void *a, const void *b)
{
	return strcmp(((const RbAllItem *) a)->key, ((const RbAllItem *) b)->key);
}

/*
 * rb_engine_sort_items
 *		Put the buckets of a bucket_take_all in lock order; an endpoint
 *		named twice is an error.
 */
void
rb_engine_sort_items(RbAllItem *items, int n)
{
	int			i;

	qsort(items, n, sizeof(RbAllItem), rb_all_item_cmp);
	for (i = 1; i < n; i++)
		if (strcmp(items[i - 1].key, items[i].key) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("endpoint \"%s\" is named twice", items[i].key),
					 errhint("Take the sum of its tokens once.")));
}

/* Lock every item's row, in the (sorted) order given. */
static void
rb_all_lock(RbAllItem *items, int n)
{
	int			i;

	/* the templates' lock before any row, if a first use may need it */
	for (i = 0; i < n && !rb_template_prelock(items[i].endpoint); i++)
		;
	for (i = 0; i < n; i++)
	{
		if (!rb_lock_configured(items[i].endpoint, &items[i].bucket))
			rb_bucket_not_configured(items[i].endpoint, false);
		if (rb_is_stripe_parent(&items[i].bucket))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("bucket_take_all cannot take from striped endpoint \"%s\"",
							items[i].key),
					 errhint("Take from a striped endpoint with bucket_take, or put it back in one row with ratebucket.bucket_stripe(endpoint, 1).")));
	}
}

/*
 * rb_engine_take_all
 *		Take from every item (sorted by rb_engine_sort_items), all or
 *		nothing; true if all were granted, else *wait is the longest wait.
 *		Each item's result.remaining is what it holds after the take (or,
 *		refused, now).
 */
bool
rb_engine_take_all(RbAllItem *items, int n, double *wait)
{
	RbStorageSession session;
	TimestampTz now;
	bool		allowed = true;
	int			i;

	*wait = 0.0;
	rb_storage_begin(&session);
	rb_all_lock(items, n);

	/* Every row is held: only now read the clock, once for all. */
	now = GetCurrentTimestamp();

	for (i = 0; i < n; i++)
	{
		RbAllItem  *it = &items[i];
		double		rate = 0.0;
		double		capacity = 0.0;
		double		granted;
		bool		write;

		if (!rb_bucket_limits(&it->bucket, true, &rate, &capacity))
			rb_bucket_not_configured(it->endpoint, false);
		rb_bucket_check_fits(it->want, capacity);
		it->result = rb_bucket_decide(&it->bucket, rate, capacity, it->want, 0,
									  now, &write, &granted);
		if (!it->result.allowed)
		{
			allowed = false;
			*wait = Max(*wait, it->result.wait_seconds);
		}
	}

	for (i = 0; i < n; i++)
	{
		RbAllItem  *it = &items[i];

		if (allowed)
		{
			it->bucket.rate = it->bucket.conf_rate;
			it->bucket.capacity = it->bucket.conf_capacity;
			rb_bucket_count_grant(&it->bucket, it->want, now);
			rb_storage_update(&it->bucket);
		}
		else if (it->result.allowed)
			it->result.remaining += it->want;	/* not taken after all */
	}
	rb_storage_end(&session);
	return allowed;
}
