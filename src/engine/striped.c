/*-------------------------------------------------------------------------
 *
 * striped.c
 *	  The take of an endpoint striped over k rows (bucket/stripe.c lays the
 *	  stripes out): try the stripes in turn, each read without a lock, and
 *	  take from the first that grants.
 *
 * Each stripe is an ordinary bucket row under its own lock, holding rate/k
 * and capacity/k, so each grants at most (rate/k)·T + capacity/k in any
 * window of T seconds, and all of them together at most rate·T + capacity:
 * the bound of the unstriped bucket, whatever the interleaving.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "utils/builtins.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/decide.h"
#include "engine/striped.h"

/*
 * rb_take_stripe
 *		The decision on one stripe its caller has locked, of an
 *		endpoint striped over k: the request's limits were already divided by
 *		k, and the take must fit in one stripe.
 */
static void
rb_take_stripe(text *endpoint, int k, RbBucket *stripe,
			   const RbTakeRequest *req, RbTakeResult *result, double *granted)
{
	double		rate = req->rate;
	double		capacity = req->capacity;

	if (!rb_bucket_limits(stripe, req->use_config, &rate, &capacity))
		elog(ERROR, "a stripe of endpoint \"%s\" has no configuration",
			 text_to_cstring(endpoint));
	if (req->upto > 0 ? capacity < 1.0 : req->want > capacity)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a take of %g tokens does not fit in one stripe of endpoint \"%s\"",
						req->upto > 0 ? 1.0 : req->want, text_to_cstring(endpoint)),
				 errdetail("The endpoint is striped over %d stripes of %g tokens each, and a take is granted by one stripe.",
						   k, capacity),
				 errhint("Take at most %g tokens at once, or use fewer stripes (ratebucket.bucket_stripe).",
						 floor(capacity))));

	rb_take_write(stripe, req, rate, capacity, result, granted);
}

/*
 * rb_take_striped
 *		A take of an endpoint striped over k stripes (see stripe.c).
 *
 * Starting at the stripe that last granted to this backend, each stripe is
 * read without a lock and taken from optimistically (rb_take_peeked): a
 * stripe whose committed state refuses is passed over, holding nothing; one
 * that grants is written if nobody touched it since the read.  If somebody
 * did, the stripe is locked, unless another transaction holds it (then it
 * is skipped), and the take is decided under the lock.  The first stripe
 * that grants ends the take.  If a stripe refused, and none granted, the
 * take is refused with the shortest wait; if every stripe that could grant
 * was held by another transaction, the take waits for the first of them.
 * Returns false, having changed nothing, if the stripes are not there (k is
 * out of date).
 */
bool
rb_take_striped(text *endpoint, int k, const RbTakeRequest *req,
				RbTakeResult *result, double *granted)
{
	RbTakeRequest sreq = *req;
	int			start = rb_stripe_start(k);
	bool		refused = false;
	int			held = -1;
	RbTakeResult best = {false, 0.0, 0.0};
	RbBucket	stripe;
	int			j;

	if (!req->use_config)
	{
		sreq.rate = req->rate / k;
		sreq.capacity = req->capacity / k;
	}

	for (j = 0; j < k; j++)
	{
		int			s = (start + j) % k;
		text	   *key = rb_stripe_key(endpoint, s, k);

		if (!rb_storage_peek(key, &stripe))
		{
			pfree(key);
			continue;			/* restriped meanwhile */
		}
		if (!rb_take_peeked(&stripe, &sreq, result, granted))
		{
			/* written or held since the read: the locked way */
			if (!rb_storage_lock_skip(key, &stripe))
			{
				if (held < 0)
					held = s;
				pfree(key);
				continue;
			}
			rb_take_stripe(endpoint, k, &stripe, &sreq, result, granted);
		}
		pfree(key);
		if (result->allowed)
		{
			rb_stripe_used(s);
			return true;
		}
		if (!refused || result->wait_seconds < best.wait_seconds)
			best = *result;
		refused = true;
	}
	if (refused)
	{
		*result = best;
		*granted = 0.0;
		return true;
	}
	if (held < 0)
		return false;

	/* Every stripe that could grant is held by another transaction. */
	if (req->nowait)
	{
		result->allowed = false;
		result->remaining = 0.0;
		result->wait_seconds = 0.0;
		*granted = 0.0;
		return true;
	}
	if (!rb_storage_lock(rb_stripe_key(endpoint, held, k), &stripe))
		return false;
	rb_take_stripe(endpoint, k, &stripe, &sreq, result, granted);
	if (result->allowed)
		rb_stripe_used(held);
	return true;
}

/*
 * rb_take_striped_now
 *		rb_take_striped for an endpoint whose row says it is striped: with
 *		its stripe count as committed.
 */
RbTakeResult
rb_take_striped_now(text *endpoint, const RbTakeRequest *req, double *granted)
{
	RbTakeResult result;
	int			k = rb_stripe_lookup(endpoint);

	if (k < 2 || !rb_take_striped(endpoint, k, req, &result, granted))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not take from endpoint \"%s\": its stripes changed concurrently",
						text_to_cstring(endpoint)),
				 errhint("Retry the transaction.")));
	return result;
}
