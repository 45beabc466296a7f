/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  SQL-callable administration: bucket_configure,
 *	  bucket_configure_quota, bucket_reset, bucket_drop, bucket_pause and
 *	  bucket_resume.  (bucket_expire is
 *	  set-based SQL in the install script.)
 *
 * Each locks the endpoint's row first and reads the clock after, exactly
 * like a take, so that administration and takes serialise on the row and a
 * concurrent take never works from a stale read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/float.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "arith.h"
#include "quota.h"
#include "ratebucket.h"
#include "storage.h"
#include "stripe.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_configure);
PG_FUNCTION_INFO_V1(ratebucket_configure_quota);
PG_FUNCTION_INFO_V1(ratebucket_reset);
PG_FUNCTION_INFO_V1(ratebucket_drop);
PG_FUNCTION_INFO_V1(ratebucket_pause);
PG_FUNCTION_INFO_V1(ratebucket_resume);

/* A configuration: limits and the feedback policy's overrides (NaN/-1: default). */
typedef struct RbConfig
{
	double		rate;
	double		capacity;
	double		floor_rate;
	double		throttle_factor;
	double		recovery_factor;
	int32		breaker_failures;
} RbConfig;

/* Store a configuration in a bucket, and make its limits the ones in force. */
static void
rb_set_config(RbBucket *bucket, const RbConfig *config, TimestampTz now)
{
	bucket->rate = config->rate;
	bucket->capacity = config->capacity;
	bucket->conf_rate = config->rate;
	bucket->conf_capacity = config->capacity;
	bucket->conf_floor_rate = config->floor_rate;
	bucket->conf_throttle_factor = config->throttle_factor;
	bucket->conf_recovery_factor = config->recovery_factor;
	bucket->conf_breaker_failures = config->breaker_failures;
	bucket->configured_at = now;
	if (bucket->state.tokens > config->capacity)
		bucket->state.tokens = config->capacity;
	/* a rate bucket, whatever it was */
	bucket->quota_period[0] = '\0';
	bucket->quota_time_zone[0] = '\0';
}

/*
 * bucket_configure(endpoint text, rate float8, capacity float8,
 *					floor_rate float8, throttle_factor float8,
 *					recovery_factor float8, breaker_failures int)
 *		Store the endpoint's limits and feedback policy.  Tokens earned under
 *		the old limits up to now are kept (cut to the new capacity); a new
 *		endpoint starts full.  What feedback taught (a lowered rate, a
 *		cooldown, the breaker) is kept too: bucket_reset forgets it.
 */
Datum
ratebucket_configure(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbConfig	config;
	RbStorageSession session;
	RbBucket	bucket;
	RbBucket	fresh;
	TimestampTz now;

	config.rate = rb_arg_rate(fcinfo, 1);
	config.capacity = rb_arg_capacity(fcinfo, 2);
	config.floor_rate = rb_arg_optional(fcinfo, 3, "floor_rate",
										RB_MIN_RATE, true, RB_MAX_RATE);
	config.throttle_factor = rb_arg_optional(fcinfo, 4, "throttle_factor",
											 0.0, false, 1.0);
	config.recovery_factor = rb_arg_optional(fcinfo, 5, "recovery_factor",
											 1.0, true, 100.0);
	config.breaker_failures = -1;
	if (!PG_ARGISNULL(6))
	{
		config.breaker_failures = PG_GETARG_INT32(6);
		if (config.breaker_failures < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("breaker_failures must not be negative"),
					 errhint("Use 0 to disable the circuit breaker, NULL for ratebucket.breaker_failures.")));
	}

	rb_storage_begin(&session);

	now = GetCurrentTimestamp();
	rb_new_bucket(&fresh, config.rate, config.capacity, now);
	rb_set_config(&fresh, &config, now);
	if (rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
	{
		RbPolicy	policy;

		/* bank what the old limits (and feedback) earned up to now */
		now = GetCurrentTimestamp();
		rb_bucket_policy(&bucket, bucket.rate, &policy);
		rb_advance(&bucket.state,
				   bucket.rate * rb_factor_now(&bucket.adapt, &policy, now),
				   bucket.capacity, now);
		rb_set_config(&bucket, &config, now);
		if (rb_is_stripe_parent(&bucket))
		{
			/* the row holds no tokens: the stripes take the new limits / k */
			bucket.state.tokens = 0.0;
			rb_stripe_sync(endpoint, &bucket, RB_SYNC_CONFIG);
		}
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
	PG_RETURN_VOID();
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
}

/*
 * bucket_configure_quota(endpoint text, quota float8, period text,
 *						  time_zone text)
 *		Make the endpoint's bucket a calendar quota: "quota" tokens per hour,
 *		day, week or month of the named time zone, all of them again at
 *		each boundary.  Everything is checked before any row is touched.
 */
Datum
ratebucket_configure_quota(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		quota;
	RbQuotaPeriod period;
	pg_tz	   *tz;
	char		zone[RB_TEXT_LEN];
	RbStorageSession session;
	RbBucket	bucket;
	RbBucket	fresh;
	TimestampTz now;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("quota, period and time_zone must not be null")));
	quota = PG_GETARG_FLOAT8(1);
	if (isnan(quota) || isinf(quota) || quota <= 0.0 || quota > RB_MAX_CAPACITY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("quota must be greater than 0 and at most %g", RB_MAX_CAPACITY),
				 errdetail("The value given was %s.", float8out_internal(quota))));

	period = rb_check_quota_period(text_to_cstring(PG_GETARG_TEXT_PP(2)));
	tz = rb_check_quota_zone(text_to_cstring(PG_GETARG_TEXT_PP(3)));
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
	PG_RETURN_VOID();
}

/*
 * bucket_reset(endpoint text) returns boolean
 *		Fill the bucket to its capacity and forget what feedback taught (rate
 *		factor, cooldown, pause, breaker).  False if there is no such bucket.
 *
 * The refill time is set to the clock even if it was ahead (a cooldown, or
 * a clock that stepped back): that is the point of a reset, and it cannot
 * grant more than a full bucket.
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
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
		rb_stripe_drop(endpoint);
	found = rb_storage_delete(endpoint);
	rb_storage_end(&session);
	PG_RETURN_BOOL(found);
}

/*
 * Set the bucket's pause to end at "until" (RB_NO_TIME: no pause).  False
 * if there is no such bucket.
 */
static bool
rb_set_pause(text *endpoint, TimestampTz until)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
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
 * bucket_pause(endpoint text, duration interval) returns boolean
 *		Refuse every take for duration, or until bucket_resume when NULL.
 */
Datum
ratebucket_pause(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	TimestampTz until = RB_FOREVER;

	if (!PG_ARGISNULL(1))
	{
		TimestampTz now = GetCurrentTimestamp();

		until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														TimestampTzGetDatum(now),
														PG_GETARG_DATUM(1)));
		if (until <= now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("duration must be positive"),
					 errhint("Pass NULL to pause until bucket_resume.")));
	}
	PG_RETURN_BOOL(rb_set_pause(endpoint, until));
}

/*
 * bucket_resume(endpoint text) returns boolean
 *		End a pause.
 */
Datum
ratebucket_resume(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);

	PG_RETURN_BOOL(rb_set_pause(endpoint, RB_NO_TIME));
}
