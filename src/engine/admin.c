/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  Administration under the row lock: bucket_configure,
 *	  bucket_configure_quota, bucket_reset, bucket_drop, bucket_pause,
 *	  bucket_resume and bucket_stripe.  (bucket_expire is set-based SQL in
 *	  the install script.)
 *
 * Each locks the endpoint's row first and reads the clock after, exactly
 * like a take, so that administration and takes serialise on the row and a
 * concurrent take never works from a stale read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/float.h"

#include "bucket/calendar.h"
#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

/*
 * rb_engine_configure
 *		Store the endpoint's limits and feedback policy.  Tokens earned under
 *		the old limits up to now are kept (cut to the new capacity); a new
 *		endpoint starts full.  What feedback taught (a lowered rate, a
 *		cooldown, the breaker) is kept too: bucket_reset forgets it.
 */
void
rb_engine_configure(text *endpoint, const RbConfig *config)
{
	RbStorageSession session;
	RbBucket	bucket;
	RbBucket	fresh;
	TimestampTz now;

	rb_storage_begin(&session);

	now = GetCurrentTimestamp();
	rb_new_bucket(&fresh, config->rate, config->capacity, now);
	rb_bucket_configure(&fresh, config, "", now);
	if (rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
	{
		/* bank what the old limits (and feedback) earned up to now */
		now = GetCurrentTimestamp();
		rb_bucket_bank(&bucket, now);
		rb_bucket_configure(&bucket, config, "", now);
		if (rb_is_stripe_parent(&bucket))
		{
			/* the row holds no tokens: the stripes take the new limits / k */
			bucket.state.tokens = 0.0;
			rb_stripe_sync(endpoint, &bucket, RB_SYNC_CONFIG);
		}
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
}

/*
 * rb_set_quota
 *		Make a bucket a calendar quota of "quota" per "period" in the zone
 *		named "zone" (both already checked and canonical), configured at
 *		"now".  What was used in the current window is kept, whatever the
 *		old quota was: raising a quota at noon gives the difference, not a
 *		second full quota.  A rate bucket becoming a quota starts its window
 *		with the full quota (what it took counted against another limit).
 *		The feedback policy goes back to the defaults; what feedback taught
 *		(a cooldown, a pause, the breaker) is kept, as bucket_configure does.
 */
static void
rb_set_quota(RbBucket *bucket, double quota, const char *period,
			 const char *zone, TimestampTz now)
{
	double		used = 0.0;

	if (rb_is_quota(bucket) && !isnan(bucket->conf_capacity) &&
		rb_quota_period(bucket->quota_period) != RB_QUOTA_NONE &&
		rb_quota_zone(bucket->quota_time_zone) != NULL)
	{
		TimestampTz start;
		TimestampTz end;

		rb_bucket_quota_window(bucket, Max(now, bucket->state.refilled_at),
							   &start, &end);
		used = bucket->conf_capacity -
			rb_quota_tokens(&bucket->state, bucket->conf_capacity, start);
		if (used < 0.0)
			used = 0.0;
		if (now > bucket->state.refilled_at)
			bucket->state.refilled_at = now;
	}
	else
		bucket->state.refilled_at = now;	/* take back a cooldown's refill time */

	bucket->state.tokens = quota > used ? quota - used : 0.0;
	bucket->rate = 0.0;
	bucket->capacity = quota;
	bucket->conf_rate = 0.0;
	bucket->conf_capacity = quota;
	bucket->conf_floor_rate = get_float8_nan();
	bucket->conf_throttle_factor = get_float8_nan();
	bucket->conf_recovery_factor = get_float8_nan();
	bucket->conf_breaker_failures = -1;
	bucket->configured_at = now;
	strlcpy(bucket->quota_period, period, RB_TEXT_LEN);
	strlcpy(bucket->quota_time_zone, zone, RB_TEXT_LEN);
	bucket->template_name[0] = '\0';
	bucket->reserve_batch = -1;	/* a quota has no reserve: its write drains it */
}

/*
 * rb_engine_configure_quota
 *		Make the endpoint's bucket a calendar quota: "quota" tokens per
 *		period of the zone tz (both checked by the caller), all of them again
 *		at each boundary.
 */
void
rb_engine_configure_quota(text *endpoint, double quota, RbQuotaPeriod period,
						  pg_tz *tz)
{
	char		zone[RB_TEXT_LEN];
	RbStorageSession session;
	RbBucket	bucket;
	RbBucket	fresh;
	TimestampTz now;

	strlcpy(zone, pg_get_timezone_name(tz), sizeof(zone));

	rb_storage_begin(&session);

	now = GetCurrentTimestamp();
	rb_new_bucket(&fresh, 0.0, quota, now);
	rb_set_quota(&fresh, quota, rb_quota_period_name(period), zone, now);
	if (rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
	{
		if (rb_is_stripe_parent(&bucket))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("endpoint \"%s\" is striped", text_to_cstring(endpoint)),
					 errdetail("A calendar quota is one row: its window's tokens cannot be split."),
					 errhint("Put it back in one row first: ratebucket.bucket_stripe(endpoint, 1).")));
		now = GetCurrentTimestamp();
		rb_set_quota(&bucket, quota, rb_quota_period_name(period), zone, now);
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
}

/*
 * rb_engine_reset
 *		Fill the bucket to its capacity and forget what feedback taught (rate
 *		factor, cooldown, pause, breaker).  False if there is no such bucket.
 *
 * The refill time is set to the clock even if it was ahead (a cooldown, or
 * a clock that stepped back): that is the point of a reset, and it cannot
 * grant more than a full bucket.
 */
bool
rb_engine_reset(text *endpoint)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
	if (found)
	{
		TimestampTz now = GetCurrentTimestamp();

		rb_adapt_init(&bucket.adapt);
		if (rb_is_stripe_parent(&bucket))
			rb_stripe_sync(endpoint, &bucket, RB_SYNC_RESET);
		else
		{
			/* a cooldown may have put the refill time ahead: take it back */
			bucket.state.refilled_at = now;
			bucket.state.tokens = bucket.capacity;
		}
		rb_storage_update(&bucket);
	}
	rb_storage_end(&session);
	return found;
}

/*
 * rb_engine_drop
 *		Delete the bucket and its configuration (and its stripes).  False if
 *		there was none.
 */
bool
rb_engine_drop(text *endpoint)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
		rb_stripe_drop(endpoint);
	found = rb_storage_delete(endpoint);
	rb_storage_end(&session);
	return found;
}

/*
 * rb_engine_pause
 *		Set the bucket's pause to end at "until" (RB_NO_TIME: no pause;
 *		RB_FOREVER: until resumed).  False if there is no such bucket (an
 *		endpoint a template would configure is paused, configured by it).
 */
bool
rb_engine_pause(text *endpoint, TimestampTz until)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	/* a pause of an endpoint with no row yet: made by its template, if any */
	found = rb_storage_lock(endpoint, &bucket) ||
		(until != RB_NO_TIME && rb_lock_configured(endpoint, &bucket));
	if (found)
	{
		bucket.adapt.paused_until = until;
		if (rb_is_stripe_parent(&bucket))
			rb_stripe_sync(endpoint, &bucket, RB_SYNC_ADAPT);
		rb_storage_update(&bucket);
	}
	rb_storage_end(&session);
	return found;
}

/*
 * The row of an endpoint about to be striped over "stripes", locked and
 * checked: configured, not a quota (unless going back to one row), with a
 * capacity that leaves each stripe at least one token.
 */
static void
rb_stripe_lock_parent(text *endpoint, int stripes, RbBucket *parent)
{
	if (!rb_lock_configured(endpoint, parent))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("endpoint \"%s\" is not configured", text_to_cstring(endpoint)),
				 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first: only a configured endpoint can be striped.")));
	if (rb_is_quota(parent) && stripes > 1)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("endpoint \"%s\" is a calendar quota", text_to_cstring(endpoint)),
				 errdetail("A calendar quota is one row: its window's tokens cannot be split.")));
	if (rb_has_reserve(parent) && stripes > 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("endpoint \"%s\" has a token reserve", text_to_cstring(endpoint)),
				 errhint("A reserve serves a hot endpoint without stripes: take it away with ratebucket.bucket_reserve('%s', NULL) first.",
						 text_to_cstring(endpoint))));
	if (parent->conf_capacity / stripes < 1.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capacity (%g) is too small for %d stripes",
						parent->conf_capacity, stripes),
				 errdetail("Each stripe holds capacity / stripes tokens, and a take is granted by one stripe."),
				 errhint("Use at most %d stripes, or raise the capacity.",
						 (int) Max(1.0, Min((double) RB_MAX_STRIPES,
											floor(parent->conf_capacity))))));
}

/*
 * rb_engine_stripe
 *		Split a configured endpoint's bucket over "stripes" rows (1: back to
 *		one row).  Returns the stripe count it had.
 *
 * The tokens the bucket holds now (summed over the old stripes) are shared
 * evenly among the new ones, and a cooldown's refill time is kept, so the
 * bound rate·T + capacity holds across the change.  Counters of the old
 * stripes are folded into the endpoint's row.
 */
int
rb_engine_stripe(text *endpoint, int stripes)
{
	RbStorageSession session;
	RbBucket	parent;
	TimestampTz now;
	double		tokens;
	TimestampTz refilled_at;
	int			old;

	rb_storage_begin(&session);
	rb_stripe_lock_parent(endpoint, stripes, &parent);
	old = rb_is_stripe_parent(&parent) ? rb_stripe_count(endpoint) : 1;
	if (old != stripes)
	{
		/* what the bucket holds now, and from when it refills */
		now = GetCurrentTimestamp();
		if (old == 1)
		{
			rb_bucket_bank(&parent, now);
			tokens = parent.state.tokens;
			refilled_at = parent.state.refilled_at;
		}
		else
			rb_stripe_gather(endpoint, &parent, old, now, &tokens, &refilled_at);

		rb_stripe_spread(endpoint, &parent, stripes, tokens, refilled_at, now);
		rb_storage_update(&parent);
		rb_stripe_record(endpoint, stripes, now);
		if (stripes > 1)
			rb_stripe_remember(endpoint, stripes);
		else
			rb_stripe_forget(endpoint);
	}
	rb_storage_end(&session);
	return old;
}
