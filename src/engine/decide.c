/*-------------------------------------------------------------------------
 *
 * decide.c
 *	  A take decided on one bucket row in memory: the request's limits
 *	  resolved against the row, the optimistic write of a row read without
 *	  a lock, the write of a row held, and the held take of a batch.
 *
 * A take locks the endpoint's row, then reads the clock, refills, takes if
 * it can, and writes the row back, all before the caller's transaction
 * ends: every taker of one bucket shares one clock and one order, and a
 * take that rolls back gives its tokens back.  A denied take writes nothing
 * (unless it changes the limits, see rb_decide_take): its refill is a
 * function of time alone and is recomputed by the next reader.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "bucket/reserve.h"
#include "bucket/storage.h"
#include "engine/decide.h"

/*
 * rb_decide_request
 *		rb_bucket_decide with the request's limits resolved against the row
 *		(false, deciding nothing, if a configured take meets no
 *		configuration).  Sets the limits used in *rate and *capacity.
 */
bool
rb_decide_request(RbBucket *bucket, const RbTakeRequest *req, TimestampTz now,
				  RbTakeResult *result, bool *write, double *granted,
				  double *rate, double *capacity)
{
	*rate = req->rate;
	*capacity = req->capacity;
	if (!rb_bucket_limits(bucket, req->use_config, rate, capacity))
		return false;
	*result = rb_bucket_decide(bucket, *rate, *capacity, req->want, req->upto,
							   now, write, granted);
	return true;
}

/*
 * Does the request fit the capacity (else an error, raised under the lock)?
 * Written as the negation of the error's test, so that a capacity that is
 * not a number (a row edited by hand) is treated as the error's test treats
 * it.
 */
static bool
rb_request_fits(const RbTakeRequest *req, double capacity)
{
	return !(req->upto > 0 ? capacity < 1.0 : req->want > capacity);
}

/*
 * rb_peek_refuses
 *		Does the bucket's last committed state already refuse the take?
 *
 * Used only when another transaction holds the row.  That holder can take
 * tokens away, or change limits; a refusal judged from the state it started
 * from is the answer this take gets when ordered before it, so there is no
 * point queueing behind the holder's commit for it.  Anything else (enough
 * tokens, no configuration, a take larger than the configured capacity) is
 * decided under the lock, after waiting.
 */
bool
rb_peek_refuses(RbBucket *peeked, const RbTakeRequest *req,
				RbTakeResult *result)
{
	bool		write;
	double		granted;
	double		rate;
	double		capacity;

	if (!rb_decide_request(peeked, req, GetCurrentTimestamp(), result, &write,
						   &granted, &rate, &capacity))
		return false;
	if (!rb_request_fits(req, capacity))
		return false;
	return !result->allowed;
}

/*
 * rb_take_peeked
 *		The usual take, on a row just read by rb_storage_peek (without a
 *		lock): read the clock, decide, and write only if no other
 *		transaction has touched the row since it was read
 *		(rb_storage_update_unchanged).  Then no write came between our read
 *		and ours, and none can come before we commit: the take is the one it
 *		would have been under the lock, with one row operation instead of
 *		two.  A refusal writes nothing and locks nothing, so its answer is
 *		the one a take ordered before any holder's commit gets (see
 *		rb_peek_refuses).
 *
 *		Returns false, having written nothing, when the take must go the
 *		locked way: the row was held or written meanwhile, or the limits or
 *		the request need the checks made under the lock.
 */
bool
rb_take_peeked(RbBucket *bucket, const RbTakeRequest *req,
			   RbTakeResult *result, double *granted)
{
	TimestampTz now;
	bool		write;
	double		rate;
	double		capacity;
	double		moved = 0.0;

	now = GetCurrentTimestamp();
	if (!rb_decide_request(bucket, req, now, result, &write, granted,
						   &rate, &capacity))
		return false;
	if (!rb_request_fits(req, capacity))
		return false;
	if (!write)
		return true;			/* a refusal, or a take that changes nothing */

	bucket->rate = rate;
	bucket->capacity = capacity;
	if (result->allowed)
	{
		rb_bucket_count_grant(bucket, *granted, now);
		moved = rb_reserve_cut(bucket, now, !rb_storage_distributed());
	}
	if (!rb_storage_update_unchanged(bucket))
		return false;
	rb_take_refilled(bucket, req, moved, result, now);
	return true;
}

/*
 * rb_take_refilled
 *		The row of a take was written, granted with "moved" tokens cut from
 *		it for its reserve (rb_reserve_cut, maybe none): hand them over, and
 *		report what the row has left.
 */
void
rb_take_refilled(RbBucket *bucket, const RbTakeRequest *req, double moved,
				 RbTakeResult *result, TimestampTz now)
{
	if (!result->allowed || !rb_has_reserve(bucket))
		return;
	rb_reserve_hand(bucket, rb_storage_relid(), moved, req->use_config,
					req->rate, req->capacity, now);
	if (moved > 0.0)
		result->remaining = bucket->state.tokens;
}

/*
 * rb_take_locked
 *		The take on a row the caller holds (not a striped endpoint's own
 *		row): resolve the limits (an endpoint with no configuration is
 *		configured by its template for a configured take, and with none is
 *		an error), check that the take fits, then only
 *		now read the clock and decide (rb_take_write).
 */
void
rb_take_locked(RbBucket *bucket, text *endpoint, const RbTakeRequest *req,
			   RbTakeResult *result, double *granted)
{
	double		rate = req->rate;
	double		capacity = req->capacity;

	if (!rb_bucket_limits(bucket, req->use_config, &rate, &capacity) &&
		!(req->use_config && !rb_is_configured(bucket) &&
		  rb_template_adopt_held(endpoint, bucket) &&
		  rb_bucket_limits(bucket, true, &rate, &capacity)))
		rb_bucket_not_configured(endpoint, true);
	rb_check_request_fits(req, capacity);
	rb_take_write(bucket, req, rate, capacity, result, granted);
}

/*
 * rb_take_write
 *		The take on a row the caller holds, with the limits resolved and
 *		checked: read the clock, decide, and write the row back (with those
 *		limits, and the grant counted) if the decision says so.
 */
void
rb_take_write(RbBucket *bucket, const RbTakeRequest *req, double rate,
			  double capacity, RbTakeResult *result, double *granted)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		write;

	*result = rb_bucket_decide(bucket, rate, capacity, req->want, req->upto,
							   now, &write, granted);
	if (write)
	{
		double		moved = 0.0;

		bucket->rate = rate;
		bucket->capacity = capacity;
		if (result->allowed)
		{
			rb_bucket_count_grant(bucket, *granted, now);
			moved = rb_reserve_cut(bucket, now, !rb_storage_distributed());
		}
		rb_storage_update(bucket);
		rb_take_refilled(bucket, req, moved, result, now);
	}
}

/*
 * rb_check_request_fits
 *		A take must fit the capacity: "want", or one whole token for an upto.
 */
void
rb_check_request_fits(const RbTakeRequest *req, double capacity)
{
	if (req->upto > 0 && capacity < 1.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capacity (%g) is less than one token", capacity),
				 errdetail("bucket_take_upto grants whole tokens only.")));
	rb_bucket_check_fits(req->want, capacity);
}

/*
 * rb_take_upto_held
 *		A take of up to "upto" whole tokens (upto >= 1) from a configured
 *		bucket whose row the caller holds, decided at "now" with its
 *		configuration, on the RbBucket in memory: its state is what the take
 *		leaves, its counters count the grant, and the caller writes it back
 *		(rb_storage_update).  Called twice at the same "now", the second take
 *		finds what the first left.  Sets *granted; an endpoint without a
 *		configuration, or of less than one token of capacity, is an error.
 */
RbTakeResult
rb_take_upto_held(RbBucket *bucket, text *endpoint, int64 upto,
				  TimestampTz now, int64 *granted)
{
	RbTakeRequest req = {true, 0.0, 0.0, 0.0, 0, false};
	RbTakeResult result;
	double		rate = 0.0;
	double		capacity = 0.0;
	double		g;
	bool		write;

	Assert(upto >= 1);
	req.upto = upto;
	if (!rb_bucket_limits(bucket, true, &rate, &capacity))
		rb_bucket_not_configured(endpoint, false);
	rb_check_request_fits(&req, capacity);
	result = rb_bucket_decide(bucket, rate, capacity, 1.0, upto, now, &write, &g);
	if (result.allowed && g > 0)
	{
		bucket->rate = rate;
		bucket->capacity = capacity;
		rb_bucket_count_grant(bucket, g, now);
	}
	*granted = result.allowed ? (int64) g : 0;
	return result;
}
