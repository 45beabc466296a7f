/*-------------------------------------------------------------------------
 *
 * stripe.h
 *	  Striped (hot) buckets: one endpoint's bucket split over k rows.
 *
 * See stripe.c for the layout.  The take itself is engine/striped.c's,
 * which owns the decision; this file names the stripes, remembers which
 * endpoints are striped, lays a bucket out over its stripes, and keeps
 * the stripes in step with their endpoint's row.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_STRIPE_H
#define RATEBUCKET_BUCKET_STRIPE_H

#include "postgres.h"

#include "bucket/bucket.h"

/* Most stripes one endpoint may have. */
#define RB_MAX_STRIPES 64

/*
 * The row of a striped endpoint (its "parent") keeps the configuration, the
 * feedback state and the counters of everything but takes; its own tokens
 * are never granted: it holds none, and its refill time is infinity, which
 * no other row can have (a cooldown is bounded).  That is also how a take
 * that meets the row knows the endpoint is striped.
 */
#define rb_is_stripe_parent(bucket) ((bucket)->state.refilled_at == RB_FOREVER)

/* How a change to the parent is carried to its stripes. */
typedef enum RbStripeSync
{
	RB_SYNC_CONFIG,				/* bank at the old limits, take the new / k */
	RB_SYNC_RESET,				/* fill, forget feedback */
	RB_SYNC_ADAPT				/* pause, cooldown, rate factor, breaker */
} RbStripeSync;

extern text *rb_stripe_key(text *endpoint, int stripe, int stripes);
extern int	rb_stripe_cached(text *endpoint);
extern void rb_stripe_forget(text *endpoint);
extern int	rb_stripe_lookup(text *endpoint);
extern int	rb_stripe_start(int stripes);
extern void rb_stripe_used(int stripe);
extern void rb_stripe_sync(text *endpoint, const RbBucket *parent,
						   RbStripeSync how);
extern bool rb_stripe_drop(text *endpoint);
extern void rb_stripe_remember(text *endpoint, int stripes);
extern int	rb_stripe_count(text *endpoint);
extern void rb_stripe_record(text *endpoint, int stripes, TimestampTz now);
extern void rb_stripe_gather(text *endpoint, RbBucket *parent, int old,
							 TimestampTz now, double *tokens,
							 TimestampTz *refilled_at);
extern void rb_stripe_spread(text *endpoint, RbBucket *parent, int stripes,
							 double tokens, TimestampTz refilled_at,
							 TimestampTz now);

#endif							/* RATEBUCKET_BUCKET_STRIPE_H */
