/*-------------------------------------------------------------------------
 *
 * bucket.c
 *	  The bucket row in memory: a new bucket, the policy and the limits in
 *	  force for it, and the decision of a take on it at a given time.
 *
 * A calendar quota (bucket_configure_quota) is a bucket too: its takes are
 * decided by rb_quota_take over the window its period and zone give,
 * instead of the token arithmetic, so that it can be taken alone, with
 * rate buckets, or peeked by a claim through the same calls.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/float.h"

#include "bucket/bucket.h"
#include "bucket/calendar.h"
#include "bucket/settings.h"
#include "core/quota.h"

/*
 * rb_new_bucket
 *		A bucket seen for the first time: full, refilled at "now".
 */
void
rb_new_bucket(RbBucket *bucket, double rate, double capacity, TimestampTz now)
{
	memset(bucket, 0, sizeof(*bucket));
	ItemPointerSetInvalid(&bucket->tid);
	bucket->rate = rate;
	bucket->capacity = capacity;
	rb_start(&bucket->state, &bucket->adapt, capacity, now);
	bucket->conf_rate = get_float8_nan();
	bucket->conf_capacity = get_float8_nan();
	bucket->reserve_batch = -1;
	bucket->conf_floor_rate = get_float8_nan();
	bucket->conf_throttle_factor = get_float8_nan();
	bucket->conf_recovery_factor = get_float8_nan();
	bucket->conf_breaker_failures = -1;
	bucket->configured_at = RB_NO_TIME;
	bucket->created_at = now;
	bucket->last_granted_at = RB_NO_TIME;
	bucket->feedback.last_status = -1;
	bucket->feedback.last_observed_at = RB_NO_TIME;
}

/*
 * rb_bucket_configure
 *		Store a configuration in a bucket (bucket_configure's, or that of the
 *		template named, "" for none) and make its limits the ones in force.
 *		Tokens above the new capacity are cut; the caller banked what the
 *		old limits earned (rb_bucket_bank).  A quota becomes a rate bucket.
 */
void
rb_bucket_configure(RbBucket *bucket, const RbConfig *config,
					const char *template_name, TimestampTz now)
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
	bucket->quota_period[0] = '\0';
	bucket->quota_time_zone[0] = '\0';
	strlcpy(bucket->template_name, template_name, RB_TEXT_LEN);
}

/* rb_bucket_ceiling: the rate a bucket's feedback is measured against. */
double
rb_bucket_ceiling(const RbBucket *bucket)
{
	return rb_is_configured(bucket) ? bucket->conf_rate : bucket->rate;
}

/*
 * rb_bucket_policy
 *		The feedback policy in force for a bucket whose ceiling (the rate its
 *		takes use) is "ceiling": the settings, overridden by its
 *		configuration.
 */
void
rb_bucket_policy(const RbBucket *bucket, double ceiling, RbPolicy *policy)
{
	RbOverrides overrides;

	overrides.floor_rate = bucket->conf_floor_rate;
	overrides.throttle_factor = bucket->conf_throttle_factor;
	overrides.recovery_factor = bucket->conf_recovery_factor;
	overrides.breaker_failures = bucket->conf_breaker_failures;
	rb_policy_resolve(&rb_settings, &overrides, ceiling, policy);
}

/*
 * rb_bucket_bank
 *		Bank what the limits the row stores (and its feedback) earned up to
 *		"now", before something changes them: new limits then apply from now
 *		on, never backwards.
 */
void
rb_bucket_bank(RbBucket *bucket, TimestampTz now)
{
	RbPolicy	policy;

	rb_bucket_policy(bucket, bucket->rate, &policy);
	rb_advance(&bucket->state,
			   bucket->rate * rb_factor_now(&bucket->adapt, &policy, now),
			   rb_capacity_now(&bucket->adapt, &policy, bucket->capacity, 0.0,
							   now),
			   now);
}

/*
 * rb_bucket_capacity_now
 *		The capacity the row's limits (and its feedback) hold at "now".
 */
double
rb_bucket_capacity_now(const RbBucket *bucket, TimestampTz now)
{
	RbPolicy	policy;

	rb_bucket_policy(bucket, bucket->rate, &policy);
	return rb_capacity_now(&bucket->adapt, &policy, bucket->capacity, 0.0, now);
}

/*
 * rb_bucket_rate_now
 *		The rate the row's limits (and its feedback) refill it at, at "now":
 *		for the take that last wrote the row, its own rate times the
 *		feedback's factor, with the policy resolved against that rate as
 *		rb_bucket_decide resolves it (not against the configured ceiling,
 *		which a take with lower limits of its own does not refill at).
 */
double
rb_bucket_rate_now(const RbBucket *bucket, TimestampTz now)
{
	RbPolicy	policy;

	rb_bucket_policy(bucket, bucket->rate, &policy);
	return bucket->rate * rb_factor_now(&bucket->adapt, &policy, now);
}

/*
 * rb_bucket_hold_out
 *		"held" of the bucket's tokens are kept outside its row (a reserve,
 *		bucket/reserve.c): bank the row up to "now", then cap its tokens so
 *		that row and reserve together hold no more than the capacity.
 */
void
rb_bucket_hold_out(RbBucket *bucket, double held, TimestampTz now)
{
	double		room;

	rb_bucket_bank(bucket, now);
	room = Max(0.0, rb_bucket_capacity_now(bucket, now) - held);
	if (bucket->state.tokens > room)
		bucket->state.tokens = room;
}

/*
 * rb_bucket_quota_window
 *		The window of a quota bucket's period and zone that contains "at".
 *		The zone was checked when the quota was configured; one that the
 *		time zone database no longer knows is an error, not a guess.
 */
void
rb_bucket_quota_window(const RbBucket *bucket, TimestampTz at,
					   TimestampTz *start, TimestampTz *end)
{
	RbQuotaPeriod period = rb_quota_period(bucket->quota_period);
	pg_tz	   *tz = rb_quota_zone(bucket->quota_time_zone);

	if (period == RB_QUOTA_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("quota period \"%s\" is not one of %s",
						bucket->quota_period, RB_QUOTA_PERIODS),
				 errhint("Configure the quota again with ratebucket.bucket_configure_quota.")));
	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" not recognized", bucket->quota_time_zone),
				 errhint("Configure the quota again with ratebucket.bucket_configure_quota.")));
	rb_quota_window(period, tz, at, start, end);
}

/*
 * rb_bucket_limits
 *		The limits a take uses.  The configured form (use_config) uses the
 *		configuration (false if there is none).  The explicit form uses the
 *		call's limits (*rate, *capacity on entry), but on a configured
 *		endpoint they can only tighten the configured ones: a role allowed
 *		to take cannot loosen an operator's limit.  A calendar quota has no
 *		rate to tighten: the explicit form is an error there rather than a
 *		silent change of meaning.
 */
bool
rb_bucket_limits(const RbBucket *bucket, bool use_config,
				 double *rate, double *capacity)
{
	if (!use_config && rb_is_quota(bucket))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("bucket is a calendar quota (%g per %s, %s): it takes no rate and capacity",
						bucket->conf_capacity, bucket->quota_period,
						bucket->quota_time_zone),
				 errhint("Take from it with bucket_take(endpoint, tokens), bucket_take_upto(endpoint, max_tokens) or bucket_take_all.")));
	if (use_config)
	{
		if (!rb_is_configured(bucket))
			return false;
		*rate = bucket->conf_rate;
		*capacity = bucket->conf_capacity;
	}
	else if (rb_is_configured(bucket))
	{
		*rate = Min(*rate, bucket->conf_rate);
		*capacity = Min(*capacity, bucket->conf_capacity);
	}
	return true;
}

/*
 * rb_bucket_decide
 *		Decide a take from a bucket row at "now" with the take's limits
 *		(rb_decide_take, with the policy in force): of "want" tokens, or with
 *		upto > 0 of as many whole tokens as it can grant up to that many
 *		(rb_decide_take_upto).  Sets *granted to the tokens granted and
 *		*write when the row must be written back; the caller does that, with
 *		the new limits.
 */
RbTakeResult
rb_bucket_decide(RbBucket *bucket, double rate, double capacity, double want,
				 int64 upto, TimestampTz now, bool *write, double *granted)
{
	RbPolicy	policy;
	RbTakeResult result;

	if (rb_is_quota(bucket))
	{
		TimestampTz start;
		TimestampTz end;

		/* a quota: "capacity" is the quota, nothing refills at a rate */
		rb_bucket_policy(bucket, rb_bucket_ceiling(bucket), &policy);
		rb_bucket_quota_window(bucket, Max(now, bucket->state.refilled_at),
							   &start, &end);
		result = rb_quota_take(&bucket->state, &bucket->adapt, &policy,
							   capacity, start, end, want, upto, now,
							   write, granted);
	}
	else
	{
		rb_bucket_policy(bucket, rate, &policy);
		if (upto > 0)
		{
			int64		n;

			result = rb_decide_take_upto(&bucket->state, &bucket->adapt,
										 &policy, bucket->rate,
										 bucket->capacity, rate, capacity,
										 upto, now, write, &n);
			*granted = (double) n;
		}
		else
		{
			result = rb_decide_take(&bucket->state, &bucket->adapt, &policy,
									bucket->rate, bucket->capacity,
									rate, capacity, want, now, write);
			*granted = result.allowed ? want : 0.0;
		}
	}
	/* what time has ended is written with it */
	if (*write)
		rb_bucket_settle(bucket, now);
	return result;
}

/*
 * rb_bucket_settle
 *		Before a row is written at "now": clear a pause that has ended and a
 *		floor the rate has left (rb_adapt_settle), judged as bucket_status
 *		judges them, against the bucket's ceiling whatever the rate of the
 *		take that writes.  Changes no decision; what the events watch
 *		(bucket/events.c) then says so.
 */
void
rb_bucket_settle(RbBucket *bucket, TimestampTz now)
{
	RbPolicy	policy;

	if (bucket->adapt.at_floor_since == RB_NO_TIME &&
		bucket->adapt.paused_until == RB_NO_TIME)
		return;					/* the usual row: nothing to settle */
	rb_bucket_policy(bucket, rb_bucket_ceiling(bucket), &policy);
	rb_adapt_settle(&bucket->adapt, &policy, now);
}

/* rb_bucket_count_grant: record a grant at "now" in the row's counters. */
void
rb_bucket_count_grant(RbBucket *bucket, double granted, TimestampTz now)
{
	bucket->last_granted_at = now;
	bucket->takes_granted++;
	bucket->tokens_granted += granted;
}

/*
 * rb_bucket_check_fits
 *		A take larger than the capacity could never be granted: say so
 *		rather than deny it forever.
 */
void
rb_bucket_check_fits(double tokens, double capacity)
{
	if (tokens > capacity)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens (%g) exceed the bucket's capacity (%g)",
						tokens, capacity),
				 errdetail("A take larger than the capacity can never be granted.")));
}

/*
 * rb_bucket_not_configured
 *		The error for a configured take of an endpoint that was not
 *		configured; "explicit" says whether the caller has a form taking
 *		limits instead.
 */
void
rb_bucket_not_configured(text *endpoint, bool explicit)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("endpoint \"%s\" is not configured", text_to_cstring(endpoint)),
			 errdetail("It has no configuration, and no template matches it."),
			 explicit ?
			 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first, "
					 "give it a template with ratebucket.bucket_template(pattern, rate, capacity), "
					 "or pass rate and capacity to the take.") :
			 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first, "
					 "or give it a template with ratebucket.bucket_template(pattern, rate, capacity).")));
}

/* Seconds from "now" until "until", 0 if it is not later. */
static double
rb_secs_until(TimestampTz until, TimestampTz now)
{
	if (until == RB_NO_TIME || until <= now)
		return 0.0;
	return ((double) until - (double) now) / RB_USECS_PER_SEC;
}

/*
 * rb_bucket_now
 *		What a row holds and says at "at", computed with the very functions
 *		the takes use, so that what an operator sees is what the next take
 *		would find.  The limits are those a configured take uses if the
 *		endpoint is configured, else those of its last granted take.
 */
void
rb_bucket_now(const RbBucket *bucket, TimestampTz at, RbBucketNow *now)
{
	RbPolicy	policy;
	double		ceiling = rb_bucket_ceiling(bucket);
	double		capacity = rb_is_configured(bucket) ?
		bucket->conf_capacity : bucket->capacity;

	rb_bucket_policy(bucket, ceiling, &policy);
	if (rb_is_quota(bucket))
	{
		TimestampTz start;
		TimestampTz end;

		/* a quota: what is left of the window "at" falls in */
		rb_bucket_quota_window(bucket, Max(at, bucket->state.refilled_at),
							   &start, &end);
		now->tokens = rb_quota_tokens(&bucket->state, capacity, start);
	}
	else
		now->tokens = rb_refill(bucket->state.tokens,
								ceiling * rb_factor_now(&bucket->adapt, &policy, at),
								rb_capacity_now(&bucket->adapt, &policy,
												capacity, 0.0, at),
								bucket->state.refilled_at, at);
	now->breaker = rb_breaker_state(&bucket->adapt, at);
	now->effective_rate = ceiling * rb_factor_now(&bucket->adapt, &policy, at);
	now->cooldown_seconds = rb_secs_until(bucket->adapt.cooldown_until, at);
	now->paused = bucket->adapt.paused_until != RB_NO_TIME &&
		at < bucket->adapt.paused_until;
	now->breaker_seconds = now->breaker == RB_BREAKER_OPEN ?
		rb_secs_until(bucket->adapt.open_until, at) : 0.0;
	now->at_floor = rb_at_floor(&bucket->adapt, &policy, at);
	now->at_floor_since = bucket->adapt.at_floor_since;
	now->expirable = now->tokens >= capacity &&
		rb_adapt_is_idle(&bucket->adapt, &policy, at);
}

/*
 * rb_bucket_quota_now
 *		A quota bucket's window at "at": what was used of it, what is left,
 *		when it started and when it resets.  False for a rate bucket.
 */
bool
rb_bucket_quota_now(const RbBucket *bucket, TimestampTz at,
					double *used, double *left,
					TimestampTz *start, TimestampTz *end)
{
	if (!rb_is_quota(bucket) || isnan(bucket->conf_capacity))
		return false;
	rb_bucket_quota_window(bucket, Max(at, bucket->state.refilled_at),
						   start, end);
	*left = rb_quota_tokens(&bucket->state, bucket->conf_capacity, *start);
	*used = bucket->conf_capacity - *left;
	return true;
}
