/*-------------------------------------------------------------------------
 *
 * reserve.c
 *	  bucket_reserve and bucket_reserves: giving an endpoint a token
 *	  reserve in shared memory, taking it away, and listing the reserves
 *	  (the reserves themselves are bucket/reserve.c's).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "bucket/reserve.h"
#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

/* Can this endpoint's row be given a reserve of "batch"?  Errors if not. */
static void
rb_reserve_check(text *endpoint, const RbBucket *bucket, int32 batch)
{
	char	   *name = text_to_cstring(endpoint);

	if (rb_is_quota(bucket))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("endpoint \"%s\" is a calendar quota", name),
				 errdetail("A reserve holds tokens of a rate bucket; a quota counts every take in its row.")));
	if (rb_is_stripe_parent(bucket))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("endpoint \"%s\" is striped", name),
				 errhint("A reserve replaces the stripes: put the bucket back in one row with ratebucket.bucket_stripe('%s', 1) first.",
						 name)));
	if (batch > bucket->conf_capacity)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch (%d) exceeds the capacity (%g)", batch,
						bucket->conf_capacity),
				 errdetail("A refill moves at most the tokens the row holds, and it never holds more than its capacity.")));
}

/*
 * rb_engine_reserve
 *		Give a configured endpoint a token reserve that each refill moves
 *		up to "batch" tokens into (-1: take its reserve away, and what it
 *		holds with it).  Returns the batch it had (-1: none).
 */
int32
rb_engine_reserve(text *endpoint, int32 batch)
{
	RbStorageSession session;
	RbBucket	bucket;
	int32		old;
	bool		off = batch < 1;

	if (!off && !rb_reserve_available())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("token reserves are not available on this server"),
				 errdetail("Reserves live in shared memory, which the library has only when the server preloads it."),
				 errhint("Add ratebucket to shared_preload_libraries (and keep ratebucket.reserves above 0), then restart the server.")));
	if (VARSIZE_ANY_EXHDR(endpoint) > RB_RESERVE_MAX_ENDPOINT && !off)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("endpoint is too long for a reserve"),
				 errdetail("An endpoint with a reserve has at most %d bytes; this one has %d.",
						   RB_RESERVE_MAX_ENDPOINT,
						   (int) VARSIZE_ANY_EXHDR(endpoint))));
	rb_storage_begin(&session);
	if (rb_storage_distributed() && !off)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("token reserves are not available on a table Citus distributed"),
				 errdetail("A take of a distributed bucket reaches its row through the endpoint's shard, not through this node's shared memory.")));
	if (!rb_lock_configured(endpoint, &bucket))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("endpoint \"%s\" is not configured", text_to_cstring(endpoint)),
				 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first: only a configured endpoint can have a reserve.")));
	if (!off)
		rb_reserve_check(endpoint, &bucket, batch);
	old = bucket.reserve_batch;
	bucket.reserve_batch = batch;
	rb_storage_update(&bucket);
	if (off)
		rb_reserve_forget(endpoint, rb_storage_relid());
	rb_storage_end(&session);
	return old;
}

/*
 * rb_engine_reserves
 *		The reserves of this database's buckets, palloc'd into *infos;
 *		returns how many.
 */
int
rb_engine_reserves(RbReserveInfo **infos)
{
	RbStorageSession session;
	int			n;

	rb_storage_begin_peek(&session);
	n = rb_reserve_list(rb_storage_relid(), infos);
	rb_storage_end(&session);
	return n;
}
