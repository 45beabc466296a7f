/*-------------------------------------------------------------------------
 *
 * feedback.c
 *	  SQL-callable bucket_observe: what the destination answered, applied to
 *	  the endpoint's bucket under its row lock; and the policy in force for
 *	  a bucket (the ratebucket.* settings, overridden by its configuration).
 *
 * The outcome table (README, "Feedback"):
 *	  2xx						success: ends a run of failures, closes a
 *								half-open breaker
 *	  429						throttled: a cooldown (Retry-After, else a
 *								rate-limit reset, else the default) and the
 *								effective rate times throttle_factor, never
 *								below the floor
 *	  503 with Retry-After		unavailable: a cooldown
 *	  5xx, 408, 0 or NULL		failure: counts toward the breaker
 *	  anything else				neutral: the request's own fault
 * Whatever the status, rate-limit headers apply: remaining 0 means a
 * cooldown until the reset, and a published limit below the rate lowers the
 * effective rate.  A malformed header is the destination's fault, not the
 * caller's: it is counted and ignored (a 429 then gets the default
 * cooldown).
 * A calendar quota takes cooldowns, pauses and the breaker (they refuse
 * its takes without spending its quota), but no rate adaptation: it has no
 * rate, and its count is the provider's own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "guc.h"
#include "headers.h"
#include "headers_sql.h"
#include "ratebucket.h"
#include "storage.h"
#include "stripe.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_observe);

/*
 * rb_bucket_policy
 *		The feedback policy in force for a bucket whose ceiling (the rate its
 *		takes use) is "ceiling".
 */
void
rb_bucket_policy(const RbBucket *bucket, double ceiling, RbPolicy *policy)
{
	policy->throttle_factor = isnan(bucket->conf_throttle_factor) ?
		rb_throttle_factor : bucket->conf_throttle_factor;
	if (isnan(bucket->conf_floor_rate))
		policy->floor_factor = rb_floor_fraction;
	else
		policy->floor_factor = Min(1.0, bucket->conf_floor_rate / ceiling);
	policy->recovery_factor = isnan(bucket->conf_recovery_factor) ?
		rb_recovery_factor : bucket->conf_recovery_factor;
	policy->recovery_interval = rb_recovery_interval_s;
	policy->default_cooldown = (int64) rb_default_cooldown_ms * 1000;
	policy->min_cooldown = (int64) rb_min_cooldown_ms * 1000;
	policy->max_cooldown = (int64) rb_max_cooldown_ms * 1000;
	if (policy->min_cooldown > policy->max_cooldown)
		policy->min_cooldown = policy->max_cooldown;
	policy->breaker_failures = bucket->conf_breaker_failures >= 0 ?
		bucket->conf_breaker_failures : rb_breaker_failures;
	policy->breaker_open = (int64) rb_breaker_open_ms * 1000;
	policy->breaker_max_open = (int64) rb_breaker_max_open_ms * 1000;
	if (policy->breaker_max_open < policy->breaker_open)
		policy->breaker_max_open = policy->breaker_open;
}

/* rb_bucket_ceiling: the rate a bucket's feedback is measured against. */
double
rb_bucket_ceiling(const RbBucket *bucket)
{
	return rb_is_configured(bucket) ? bucket->conf_rate : bucket->rate;
}

/*
 * Seconds until the retry time a Retry-After value names, or NaN when it
 * names none.  A date is measured from "now" (it may be in the past).
 */
static double
rb_retry_after_seconds(RbRetryAfterKind kind, double value, TimestampTz now)
{
	switch (kind)
	{
		case RB_RA_DELAY:
			return value;
		case RB_RA_DATE:
			return value - rb_unix_from_timestamptz(now);
		case RB_RA_ABSENT:
		case RB_RA_MALFORMED:
			break;
	}
	return get_float8_nan();
}

/*
 * bucket_observe(endpoint text, status int, retry_after text, headers jsonb)
 *		returns (outcome text, cooldown_seconds float8, effective_rate float8,
 *				 breaker text)
 */
Datum
ratebucket_observe(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	bool		has_status = !PG_ARGISNULL(1);
	int			status = has_status ? PG_GETARG_INT32(1) : 0;
	Jsonb	   *headers = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	RbStorageSession session;
	RbBucket	bucket;
	RbPolicy	policy;
	RbRateLimit rl;
	RbRetryAfterKind ra_kind = RB_RA_ABSENT;
	double		ra_value = 0.0;
	double		ra_seconds;
	RbOutcome	outcome;
	TimestampTz now;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	bool		found;

	if (has_status && status != 0 && (status < 100 || status > 999))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status code", status),
				 errhint("Pass 0 or NULL when no response arrived (a connection failure or a timeout).")));
	if (headers != NULL && !JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
	tupdesc = rb_result_tupdesc(fcinfo);

	rb_storage_begin(&session);
	found = rb_storage_lock(endpoint, &bucket);
	now = GetCurrentTimestamp();

	/* What the destination said, read before anything changes. */
	memset(&rl, 0, sizeof(rl));
	rb_headers_from_jsonb(headers, rb_unix_from_timestamptz(now), &rl, &ra_kind, &ra_value);
	if (!PG_ARGISNULL(2))
	{
		text	   *ra = PG_GETARG_TEXT_PP(2);

		/* the argument wins over a Retry-After in headers */
		if (ra_kind == RB_RA_MALFORMED)
			rl.malformed--;
		ra_kind = rb_parse_retry_after_at(VARDATA_ANY(ra), VARSIZE_ANY_EXHDR(ra),
										  rb_unix_from_timestamptz(now),
										  &ra_value);
		if (ra_kind == RB_RA_MALFORMED)
			rl.malformed++;
	}
	ra_seconds = rb_retry_after_seconds(ra_kind, ra_value, now);
	outcome = rb_classify(status, has_status, !isnan(ra_seconds));

	if (!found)
	{
		/* no bucket: nothing to adapt */
		rb_storage_end(&session);
		values[0] = CStringGetTextDatum(rb_outcome_name(outcome));
		values[1] = Float8GetDatum(0.0);
		nulls[2] = nulls[3] = true;
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
	}

	{
		double		ceiling = rb_bucket_ceiling(&bucket);
		int64		before_cooldown = bucket.adapt.cooldown_until;
		int64		before_open = bucket.adapt.open_until;
		double		cooldown = get_float8_nan();
		bool		cool = false;
		RbAdapt		before = bucket.adapt;

		rb_bucket_policy(&bucket, ceiling, &policy);

		/*
		 * Bank the recovery earned so far before anything moves the cooldown:
		 * recovery is measured from the end of the last cooldown.
		 */
		rb_bank_factor(&bucket.adapt, &policy, now);

		/* Cooldowns: Retry-After on 429/503, or a window with nothing left. */
		if (outcome == RB_OUTCOME_THROTTLED || outcome == RB_OUTCOME_UNAVAILABLE)
		{
			cool = true;
			cooldown = ra_seconds;
			if (isnan(cooldown) && rl.has_reset &&
				(!rl.has_remaining || rl.remaining <= 0))
				cooldown = rl.reset_seconds;
		}
		else if (rl.has_remaining && rl.remaining <= 0 && rl.has_reset)
		{
			cool = true;
			cooldown = rl.reset_seconds;
		}
		if (cool)
		{
			int64		until = now + rb_clamp_cooldown(&policy, cooldown);

			/*
			 * A calendar quota keeps what is left of its window: the
			 * cooldown refuses its takes until it ends (rb_quota_take)
			 * without spending the quota.
			 */
			if (!rb_is_quota(&bucket))
				rb_cool_down(&bucket.state, &bucket.adapt, until);
			else if (bucket.adapt.cooldown_until == RB_NO_TIME ||
					 bucket.adapt.cooldown_until < until)
				bucket.adapt.cooldown_until = until;
			if (bucket.adapt.cooldown_until != before_cooldown)
				bucket.cooldowns++;
		}

		/*
		 * The rate: halved (by default) on a 429, cut to a published limit.
		 * Once per congestion: a 429 that arrives while an earlier answer's
		 * cooldown is still running was sent before the destination's
		 * first complaint could slow anyone down (a batch in flight, other
		 * workers), so it lowers nothing more.
		 */
		if (outcome == RB_OUTCOME_THROTTLED)
		{
			/* (a quota has no rate to lower: its count is the provider's) */
			if (!rb_is_quota(&bucket) &&
				(before_cooldown == RB_NO_TIME || before_cooldown <= now))
				rb_lower_factor(&bucket.adapt, &policy,
								rb_factor_now(&bucket.adapt, &policy, now) *
								policy.throttle_factor, now);
			bucket.throttles++;
		}
		if (rl.has_limit && rl.has_window && rl.window_seconds > 0 &&
			!rb_is_quota(&bucket))
			rb_lower_factor(&bucket.adapt, &policy,
							rl.limit / rl.window_seconds / ceiling, now);

		/* The breaker. */
		rb_breaker_observe(&bucket.adapt, &policy, outcome, now);
		if (bucket.adapt.open_until != before_open &&
			rb_breaker_state(&bucket.adapt, now) == RB_BREAKER_OPEN)
			bucket.breaker_opens++;

		if (outcome == RB_OUTCOME_SUCCESS)
			bucket.successes++;
		else if (outcome == RB_OUTCOME_FAILURE)
			bucket.failures++;
		if (rl.malformed > 0)
			bucket.malformed_headers += rl.malformed;
		bucket.last_status = has_status ? status : 0;
		bucket.last_observed_at = now;
		/* a striped bucket: what takes are told changes on every stripe */
		if (rb_is_stripe_parent(&bucket) &&
			rb_stripe_adapt_changed(&before, &bucket.adapt, &policy, now))
			rb_stripe_sync(endpoint, &bucket, RB_SYNC_ADAPT);
		rb_storage_update(&bucket);
		rb_storage_end(&session);

		/* allocate the result only now: SPI_finish freed SPI's memory */
		values[0] = CStringGetTextDatum(rb_outcome_name(outcome));
		values[1] = Float8GetDatum(bucket.adapt.cooldown_until != RB_NO_TIME &&
								   bucket.adapt.cooldown_until > now ?
								   ((double) bucket.adapt.cooldown_until - (double) now) /
								   RB_USECS_PER_SEC : 0.0);
		values[2] = Float8GetDatum(ceiling * rb_factor_now(&bucket.adapt, &policy, now));
		values[3] = CStringGetTextDatum(rb_breaker_name(rb_breaker_state(&bucket.adapt, now)));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
