/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  SQL-callable administration: bucket_configure, bucket_reset and
 *	  bucket_drop.  (bucket_expire is set-based SQL in the install script.)
 *
 * Each locks the endpoint's row first and reads the clock after, exactly
 * like a take, so that administration and takes serialise on the row and a
 * concurrent take never works from a stale read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/timestamp.h"

#include "arith.h"
#include "ratebucket.h"
#include "storage.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_configure);
PG_FUNCTION_INFO_V1(ratebucket_reset);
PG_FUNCTION_INFO_V1(ratebucket_drop);

/* Store the configured limits in a bucket, and make them the ones in force. */
static void
rb_set_config(RbBucket *bucket, double rate, double capacity, TimestampTz now)
{
	bucket->rate = rate;
	bucket->capacity = capacity;
	bucket->configured = true;
	bucket->conf_rate = rate;
	bucket->conf_capacity = capacity;
	bucket->configured_at = now;
	if (bucket->state.tokens > capacity)
		bucket->state.tokens = capacity;
}

/*
 * bucket_configure(endpoint text, rate float8, capacity float8)
 *		Store the endpoint's limits.  Tokens earned under the old limits up to
 *		now are kept (cut to the new capacity); a new endpoint starts full.
 */
Datum
ratebucket_configure(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		rate = rb_arg_rate(fcinfo, 1);
	double		capacity = rb_arg_capacity(fcinfo, 2);
	RbStorageSession session;
	RbBucket	bucket;
	RbBucket	fresh;
	TimestampTz now;

	rb_storage_begin(&session);

	now = GetCurrentTimestamp();
	rb_new_bucket(&fresh, rate, capacity, now);
	rb_set_config(&fresh, rate, capacity, now);
	if (rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
	{
		now = GetCurrentTimestamp();
		rb_advance(&bucket.state, bucket.rate, bucket.capacity, now);
		rb_set_config(&bucket, rate, capacity, now);
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
	PG_RETURN_VOID();
}

/*
 * bucket_reset(endpoint text) returns boolean
 *		Fill the bucket to its capacity.  False if there is no such bucket.
 */
Datum
ratebucket_reset(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
	if (found)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (now > bucket.state.refilled_at)
			bucket.state.refilled_at = now;
		bucket.state.tokens = bucket.capacity;
		rb_storage_update(&bucket);
	}
	rb_storage_end(&session);
	PG_RETURN_BOOL(found);
}

/*
 * bucket_drop(endpoint text) returns boolean
 *		Delete the bucket and its configuration.  False if there was none.
 */
Datum
ratebucket_drop(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbStorageSession session;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_delete(endpoint);
	rb_storage_end(&session);
	PG_RETURN_BOOL(found);
}
