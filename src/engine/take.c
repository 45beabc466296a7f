/*-------------------------------------------------------------------------
 *
 * take.c
 *	  A take of one endpoint: bucket_take and bucket_take_upto, in both
 *	  forms, and the striped endpoints' takes of a batch.
 *
 * The ways a take goes, cheapest first:
 *	  0. an endpoint with a token reserve this backend knows of: drawn from
 *		 the reserve in shared memory, without touching the row or opening
 *		 the table (bucket/reserve.c); the take that finds it empty goes on
 *		 below, and refills it with its write (decide.c, rb_reserve_cut).
 *		 Never on a table Citus distributed;
 *	  1. an endpoint this backend knows to be striped: straight to its
 *		 stripes (striped.c);
 *	  2. optimistically: the row read without a lock, decided, and written
 *		 only if nobody touched it since (decide.c, rb_take_peeked);
 *	  3. the locked way: lock the row unless another transaction holds it,
 *		 read the clock, decide, write (rb_take_locked).  If the row is held,
 *		 a take its committed state already refuses returns at once, with
 *		 nowait any other is refused, and any other waits for the holder.  A
 *		 missing row is created full; for a take that uses the
 *		 configuration, from the template that matches the endpoint
 *		 (engine/template.c), and with none it is an error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "bucket/reserve.h"
#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/decide.h"
#include "engine/striped.h"

/*
 * A take of an endpoint this backend has met striped over k stripes: true
 * if its stripes answered; false, having changed nothing, if k is out of
 * date (or unknown), which is then forgotten.
 */
static bool
rb_take_cached_stripes(text *endpoint, const RbTakeRequest *req,
					   RbTakeResult *result, double *granted)
{
	int			k = rb_stripe_cached(endpoint);

	if (k < 2)
		return false;
	if (rb_take_striped(endpoint, k, req, result, granted))
		return true;
	rb_stripe_forget(endpoint);
	return false;
}

static bool rb_take_reserved(text *endpoint, Oid relid,
							 const RbTakeRequest *req, RbTakeResult *result,
							 double *granted);

/*
 * The optimistic take (rb_take_peeked) of the endpoint's row, or of its
 * stripes if the row says it is striped.  False, having written nothing,
 * when the row is missing or the take must go the locked way.
 */
static bool
rb_take_optimistic(text *endpoint, const RbTakeRequest *req,
				   RbTakeResult *result, double *granted)
{
	RbBucket	bucket;

	if (!rb_storage_peek(endpoint, &bucket))
		return false;
	/* a reserve this backend had not met: the read found it */
	if (bucket.reserve.found &&
		rb_take_reserved(endpoint, rb_storage_relid(), req, result, granted))
		return true;
	if (rb_is_stripe_parent(&bucket))
	{
		*result = rb_take_striped_now(endpoint, req, granted);
		return true;
	}
	return rb_take_peeked(&bucket, req, result, granted);
}

/* A take from the endpoint's reserve of table relid (the file header, 0). */
static bool
rb_take_reserved(text *endpoint, Oid relid, const RbTakeRequest *req,
				 RbTakeResult *result, double *granted)
{
	double		remaining;

	if (!rb_reserve_draw(endpoint, relid, req->use_config,
						 req->rate, req->capacity, req->want, req->upto,
						 req->nowait, granted, &remaining))
		return false;
	result->allowed = true;
	result->remaining = remaining;
	result->wait_seconds = 0.0;
	return true;
}

/* A refusal that does not wait: the row is held by another transaction. */
static void
rb_refuse_nowait(RbTakeResult *result, double *granted)
{
	result->allowed = false;
	result->remaining = 0.0;
	result->wait_seconds = 0.0;
	*granted = 0.0;
}

/*
 * The first take of an endpoint that has no row: the row is created full
 * and the take granted from it (the clock is read without a lock, since
 * nobody else can hold a row that does not exist).  True if the row was
 * inserted, the take answered; false if another transaction inserted it
 * meanwhile: then *bucket holds that row, locked, for the locked way.
 */
static bool
rb_take_new(text *endpoint, const RbTakeRequest *req, RbBucket *bucket,
			RbTakeResult *result, double *granted)
{
	TimestampTz now = GetCurrentTimestamp();
	RbBucket	fresh;
	bool		write;

	rb_new_bucket(&fresh, req->rate, req->capacity, now);
	*result = rb_bucket_decide(&fresh, req->rate, req->capacity, req->want,
							   req->upto, now, &write, granted);
	Assert(result->allowed);
	rb_bucket_count_grant(&fresh, *granted, now);
	return !rb_storage_lock_or_insert(endpoint, bucket, &fresh);
}

/*
 * The endpoint's row could not be locked without waiting: another
 * transaction holds it, or there is none.  True if the take was answered
 * here (by the stripes, by a refusal its committed state already makes, by
 * a nowait refusal, or by creating the row); false when *bucket now holds
 * the row, locked after waiting for its holder.
 */
static bool
rb_take_contended(text *endpoint, const RbTakeRequest *req, RbBucket *bucket,
				  RbTakeResult *result, double *granted)
{
	RbBucket	peeked;
	bool		exists = rb_storage_peek(endpoint, &peeked);

	if (exists && rb_is_stripe_parent(&peeked))
	{
		*result = rb_take_striped_now(endpoint, req, granted);
		return true;
	}
	if (exists && rb_peek_refuses(&peeked, req, result))
	{
		*granted = 0.0;
		return true;
	}
	if (exists && req->nowait)
	{
		rb_refuse_nowait(result, granted);
		return true;
	}
	if (req->use_config)
	{
		/* configured by now, or by its template at this first use */
		if (!rb_lock_configured(endpoint, bucket))
			rb_bucket_not_configured(endpoint, true);
		return false;
	}
	return rb_take_new(endpoint, req, bucket, result, granted);
}

/* The locked way (see the file header, 3). */
static void
rb_take_locked_way(text *endpoint, const RbTakeRequest *req,
				   RbTakeResult *result, double *granted)
{
	RbBucket	bucket;

	if (!rb_storage_lock_skip(endpoint, &bucket) &&
		rb_take_contended(endpoint, req, &bucket, result, granted))
		return;

	/* the row of a bucket striped since this backend last met it */
	if (rb_is_stripe_parent(&bucket))
		*result = rb_take_striped_now(endpoint, req, granted);
	/* a reserve refilled by the transaction this take waited for */
	else if (!(bucket.reserve.found &&
			   rb_take_reserved(endpoint, rb_storage_relid(), req, result,
								granted)))
		rb_take_locked(&bucket, endpoint, req, result, granted);
}

/*
 * rb_engine_take
 *		The take itself, in a storage session of its own.  Sets *granted to
 *		the tokens granted (0 if refused).
 *
 * A draw from a reserve reads no row, so it comes before the session: it
 * neither opens nor locks the table, and so waits for no lock on it (a
 * draw holds nothing a row's lock or the table's would protect).  Only
 * when it cannot draw does the take open the session and go on; a backend
 * that knows of no reserve goes there at once.
 */
RbTakeResult
rb_engine_take(text *endpoint, const RbTakeRequest *req, double *granted)
{
	RbStorageSession session;
	RbTakeResult result;

	if (rb_reserve_known())
	{
		Oid			relid = rb_storage_table();

		/*
		 * Not where Citus distributed the table: there a take reaches its
		 * row through the endpoint's shard, which other nodes' takes reach
		 * too, and a reserve this node kept from before would give out
		 * tokens they cannot see (bucket_reserve refuses such a table, but
		 * a reserve made first stays).
		 */
		if (!rb_storage_distributed() &&
			rb_take_reserved(endpoint, relid, req, &result, granted))
			return result;
	}

	rb_storage_begin(&session);
	if (!rb_take_cached_stripes(endpoint, req, &result, granted) &&
		!rb_take_optimistic(endpoint, req, &result, granted))
		rb_take_locked_way(endpoint, req, &result, granted);
	/* a row that leased its refill to the reserve: which grants sooner */
	if (!result.allowed && result.wait_seconds > 0.0 &&
		!rb_storage_distributed())
		result.wait_seconds = rb_reserve_wait(endpoint, rb_storage_relid(),
											  req->use_config, req->rate,
											  req->capacity, req->want,
											  req->upto, result.wait_seconds);
	rb_storage_end(&session);
	return result;
}
