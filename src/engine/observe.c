/*-------------------------------------------------------------------------
 *
 * observe.c
 *	  bucket_observe under the row lock: what the destination answered,
 *	  applied to the endpoint's bucket by the feedback policy of
 *	  core/feedback.c, and carried to its stripes if it is striped.
 *
 * The row is locked first and the clock read after, as for a take, so
 * that the answer's Retry-After dates and resets are measured on the same
 * clock as the takes it then refuses.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

/* Unix seconds of a finite TimestampTz (microseconds since 2000-01-01). */
static double
rb_unix_seconds(TimestampTz ts)
{
	return (double) ts / USECS_PER_SEC +
		(double) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

/*
 * rb_observe_locked
 *		Apply one response to a bucket locked and read at "now", as
 *		bucket_observe does: measured against its configuration, refilled
 *		at the limits its last take wrote, carried to its stripes.
 */
static void
rb_observe_locked(text *endpoint, RbBucket *bucket, const RbResponse *response,
				  TimestampTz now, RbObservation *out)
{
	RbPolicy	policy;
	RbObserved	observed;

	observed.ceiling = rb_bucket_ceiling(bucket);
	observed.capacity = rb_is_configured(bucket) ?
		bucket->conf_capacity : bucket->capacity;
	observed.is_quota = rb_is_quota(bucket);
	observed.holds_tokens = !rb_is_stripe_parent(bucket);
	rb_bucket_policy(bucket, observed.ceiling, &policy);
	rb_bucket_settle(bucket, now);
	/* the row refills at the limits its last take wrote, as a take banks */
	observed.refill_rate = rb_bucket_rate_now(bucket, now);
	observed.refill_capacity = rb_bucket_capacity_now(bucket, now);
	rb_feedback_observe(&bucket->state, &bucket->adapt, &bucket->feedback,
						&policy, &observed, response,
						now, rb_unix_seconds(now), out);

	/* a striped bucket: what takes are told changes on every stripe */
	if (rb_is_stripe_parent(bucket) && out->adapt_changed)
		rb_stripe_sync(endpoint, bucket, RB_SYNC_ADAPT);
}

/*
 * rb_engine_observe_many
 *		Apply n responses of one endpoint to its bucket, in their order,
 *		under one lock and with one write of its row: what n calls of
 *		bucket_observe in a row would do, each reading the clock the first
 *		one read.  False if the endpoint has no bucket (and no template
 *		makes one): each out[i] then says only the outcome.
 */
bool
rb_engine_observe_many(text *endpoint, const RbResponse *responses, int n,
					   RbObservation *out)
{
	RbStorageSession session;
	RbBucket	bucket;
	TimestampTz now;
	bool		found;

	rb_storage_begin(&session);
	/* an endpoint with no row yet: created by its template, if one matches */
	found = rb_storage_lock(endpoint, &bucket) ||
		rb_lock_configured(endpoint, &bucket);
	now = GetCurrentTimestamp();

	for (int i = 0; i < n; i++)
	{
		if (!found)
		{
			memset(&out[i], 0, sizeof(out[i]));
			out[i].outcome = rb_response_outcome(&responses[i],
												 rb_unix_seconds(now));
		}
		else
			rb_observe_locked(endpoint, &bucket, &responses[i], now, &out[i]);
	}
	if (found)
		rb_storage_update(&bucket);
	rb_storage_end(&session);
	return found;
}

/*
 * rb_engine_observe
 *		Apply a response to the endpoint's bucket.  False if the endpoint
 *		has no bucket (and no template makes one): nothing to adapt, and
 *		*out says only the outcome.
 */
bool
rb_engine_observe(text *endpoint, const RbResponse *response,
				  RbObservation *out)
{
	return rb_engine_observe_many(endpoint, response, 1, out);
}
