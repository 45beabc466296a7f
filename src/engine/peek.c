/*-------------------------------------------------------------------------
 *
 * peek.c
 *	  What a take would be told now, judged from the last committed row
 *	  without a lock and without writing: for bucket_ready, bucket_wait,
 *	  bucket_claimable and bucket_grantable, the filters of a claim.
 *
 * A peek is a hint: the take under the row lock decides, and may grant
 * fewer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

/* A peek's decision on one row, with the limits it stores. */
static RbTakeResult
rb_peek_row(RbBucket *bucket, double want, int64 upto, TimestampTz now,
			double *granted)
{
	bool		configured = rb_is_configured(bucket);
	bool		write;

	return rb_bucket_decide(bucket,
							configured ? bucket->conf_rate : bucket->rate,
							configured ? bucket->conf_capacity : bucket->capacity,
							want, upto, now, &write, granted);
}

/*
 * rb_peek_striped
 *		rb_engine_peek of a striped endpoint: what the best of its stripes
 *		would answer, since a take tries every stripe.  Granted if one
 *		grants (as many as the best grants); else refused with the shortest
 *		wait.
 */
static RbTakeResult
rb_peek_striped(text *endpoint, double want, int64 upto, double *granted)
{
	RbTakeResult best = {false, 0.0, 0.0};
	TimestampTz now = GetCurrentTimestamp();
	int			attempt;

	*granted = 0.0;
	for (attempt = 0; attempt < 2; attempt++)
	{
		int			k = attempt == 0 ? rb_stripe_cached(endpoint) : 0;
		int			seen = 0;
		int			s;

		if (k < 2)
			k = rb_stripe_lookup(endpoint);
		for (s = 0; s < k; s++)
		{
			RbBucket	stripe;
			RbTakeResult r;
			double		g;

			if (!rb_storage_peek(rb_stripe_key(endpoint, s, k), &stripe))
				continue;
			r = rb_peek_row(&stripe, want, upto, now, &g);
			if (seen++ == 0 ||
				(r.allowed && (!best.allowed || g > *granted)) ||
				(!r.allowed && !best.allowed && r.wait_seconds < best.wait_seconds))
			{
				best = r;
				*granted = r.allowed ? g : 0.0;
			}
		}
		if (seen > 0)
			return best;
		rb_stripe_forget(endpoint);
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not read endpoint \"%s\": its stripes changed concurrently",
					text_to_cstring(endpoint)),
			 errhint("Retry the transaction.")));
	return best;				/* keep the compiler quiet */
}

/*
 * rb_engine_peek
 *		What a take would be told now, judged from the last committed row
 *		with the limits it stores (its configuration, if it has one),
 *		including a cooldown, a pause or an open breaker, without locking:
 *		a take of "want" tokens, or with upto > 0 of as many whole tokens as
 *		it would grant up to that many (*granted).  An unknown endpoint's
 *		bucket would start full: granted, all of it.
 */
RbTakeResult
rb_engine_peek(text *endpoint, double want, int64 upto, double *granted)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;
	RbTakeResult result = {true, 0.0, 0.0};

	rb_storage_begin_peek(&session);
	found = rb_storage_peek(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
	{
		result = rb_peek_striped(endpoint, want, upto, granted);
		rb_storage_end(&session);
		return result;
	}
	rb_storage_end(&session);

	*granted = upto > 0 ? (double) upto : want;
	if (found)
		result = rb_peek_row(&bucket, want, upto, GetCurrentTimestamp(),
							 granted);
	return result;
}

/*
 * rb_engine_peek_configured
 *		How many whole tokens, up to "upto", a take of a configured bucket
 *		would be granted now (rb_engine_peek): false, setting nothing, if
 *		the endpoint has no configuration and no template matches it (a take
 *		would be an error, not a grant).  An endpoint a template would
 *		configure is judged as that configuration would leave it now.  For
 *		bucket_grantable and bucket_claimable.
 */
bool
rb_engine_peek_configured(text *endpoint, int64 upto, int64 *granted)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;
	double		g = 0.0;

	rb_storage_begin_peek(&session);
	found = rb_storage_peek(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
	{
		(void) rb_peek_striped(endpoint, 1.0, upto, &g);
		rb_storage_end(&session);
		*granted = (int64) g;
		return true;
	}
	/* no configuration yet: as its template would configure it */
	if ((!found || !rb_is_configured(&bucket)) &&
		!rb_template_peek(endpoint, &bucket, found))
	{
		rb_storage_end(&session);
		return false;
	}
	rb_storage_end(&session);
	(void) rb_peek_row(&bucket, 1.0, upto, GetCurrentTimestamp(), &g);
	*granted = (int64) g;
	return true;
}
