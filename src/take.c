/*-------------------------------------------------------------------------
 *
 * take.c
 *	  SQL-callable takes and peeks: bucket_take (both forms), bucket_ready.
 *
 * A take locks the endpoint's row, then reads the clock, refills, takes if
 * it can, and writes the row back, all before the caller's transaction ends:
 * every taker of one bucket shares one clock and one order, and a take that
 * rolls back gives its tokens back.  A denied take writes nothing (unless
 * it changes the limits, see rb_decide_take): its refill is a function of
 * time alone and is recomputed by the next reader.
 * A take refused by the committed state of a row that another transaction
 * holds does not even wait for that transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "arith.h"
#include "ratebucket.h"
#include "storage.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_take);
PG_FUNCTION_INFO_V1(ratebucket_take_configured);
PG_FUNCTION_INFO_V1(ratebucket_ready);

/* Record a grant of "want" tokens at "now" in the row's counters. */
static void
rb_count_grant(RbBucket *bucket, double want, TimestampTz now)
{
	bucket->last_granted_at = now;
	bucket->takes_granted++;
	bucket->tokens_granted += want;
}

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
	bucket->state.tokens = capacity;
	bucket->state.refilled_at = now;
	rb_adapt_init(&bucket->adapt);
	bucket->conf_rate = get_float8_nan();
	bucket->conf_capacity = get_float8_nan();
	bucket->conf_floor_rate = get_float8_nan();
	bucket->conf_throttle_factor = get_float8_nan();
	bucket->conf_recovery_factor = get_float8_nan();
	bucket->conf_breaker_failures = -1;
	bucket->configured_at = RB_NO_TIME;
	bucket->created_at = now;
	bucket->last_granted_at = RB_NO_TIME;
	bucket->last_status = -1;
	bucket->last_observed_at = RB_NO_TIME;
}

/* The error for a configured take of an endpoint that was not configured. */
static void
rb_not_configured(text *endpoint)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("endpoint \"%s\" is not configured", text_to_cstring(endpoint)),
			 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first, "
					 "or pass rate and capacity to bucket_take.")));
}

/*
 * rb_decide
 *		Decide a take from a bucket row at "now" with the take's limits
 *		(rb_decide_take, with the policy in force).  Sets *write when the row
 *		must be written back; the caller does that, with the new limits.
 */
static RbTakeResult
rb_decide(RbBucket *bucket, double rate, double capacity, double want,
		  TimestampTz now, bool *write)
{
	RbPolicy	policy;

	rb_bucket_policy(bucket, rate, &policy);
	return rb_decide_take(&bucket->state, &bucket->adapt, &policy,
						  bucket->rate, bucket->capacity,
						  rate, capacity, want, now, write);
}

/*
 * rb_limits_for
 *		The limits a take uses.  The configured form uses the configuration
 *		(false if there is none).  The explicit form uses the call's limits,
 *		but on a configured endpoint they can only tighten the configured
 *		ones: a role allowed to take cannot loosen an operator's limit.
 */
static bool
rb_limits_for(const RbBucket *bucket, bool use_config,
			  double *rate, double *capacity)
{
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
static bool
rb_peek_refuses(RbBucket *peeked, bool use_config, double rate,
				double capacity, double want, RbTakeResult *result)
{
	bool		write;

	if (!rb_limits_for(peeked, use_config, &rate, &capacity) ||
		want > capacity)
		return false;
	*result = rb_decide(peeked, rate, capacity, want, GetCurrentTimestamp(),
						&write);
	return !result->allowed;
}

/*
 * rb_take_with_limits
 *		The take itself.  With use_config, the limits are those stored by
 *		bucket_configure and rate/capacity are ignored; without, they are
 *		the call's, capped by a configuration (see rb_limits_for).
 *
 * The usual path is one statement: lock the row (skipping it if another
 * transaction holds it), read the clock, decide, write.  If the row is held,
 * a take its committed state already refuses returns at once; any other
 * waits for the holder.  A missing row is created full, unless use_config.
 */
static RbTakeResult
rb_take_with_limits(text *endpoint, bool use_config,
					double rate, double capacity, double want)
{
	RbStorageSession session;
	RbBucket	bucket;
	RbTakeResult result;
	TimestampTz now;
	bool		write;

	rb_storage_begin(&session);

	if (!rb_storage_lock_skip(endpoint, &bucket))
	{
		RbBucket	peeked;
		bool		exists = rb_storage_peek(endpoint, &peeked);

		if (exists &&
			rb_peek_refuses(&peeked, use_config, rate, capacity, want, &result))
		{
			rb_storage_end(&session);
			return result;
		}

		if (use_config)
		{
			if (!exists || !rb_storage_lock(endpoint, &bucket))
				rb_not_configured(endpoint);
		}
		else
		{
			RbBucket	fresh;

			/* this clock is used only if the row is new: no lock to wait on */
			now = GetCurrentTimestamp();
			rb_new_bucket(&fresh, rate, capacity, now);
			result = rb_take(&fresh.state, rate, capacity, want, now);
			Assert(result.allowed);
			rb_count_grant(&fresh, want, now);
			if (!rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
			{
				rb_storage_end(&session);
				return result;
			}
		}
	}

	/* We hold the row lock: only now read the clock. */
	now = GetCurrentTimestamp();

	if (!rb_limits_for(&bucket, use_config, &rate, &capacity))
		rb_not_configured(endpoint);
	rb_check_tokens_fit(want, capacity);

	result = rb_decide(&bucket, rate, capacity, want, now, &write);
	if (write)
	{
		bucket.rate = rate;
		bucket.capacity = capacity;
		if (result.allowed)
			rb_count_grant(&bucket, want, now);
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
	return result;
}

/*
 * rb_take_result_datum
 *		Build the (allowed, remaining, wait_seconds) record.
 */
static Datum
rb_take_result_datum(FunctionCallInfo fcinfo, const RbTakeResult *result)
{
	TupleDesc	tupdesc = rb_result_tupdesc(fcinfo);
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = BoolGetDatum(result->allowed);
	values[1] = Float8GetDatum(result->remaining);
	values[2] = Float8GetDatum(result->wait_seconds);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * bucket_take(endpoint text, rate float8, capacity float8, tokens float8)
 *		Take with the limits given: they can change from one call to the next.
 */
Datum
ratebucket_take(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		rate = rb_arg_rate(fcinfo, 1);
	double		capacity = rb_arg_capacity(fcinfo, 2);
	double		want = rb_arg_tokens(fcinfo, 3);
	RbTakeResult result;

	rb_check_tokens_fit(want, capacity);
	result = rb_take_with_limits(endpoint, false, rate, capacity, want);
	PG_RETURN_DATUM(rb_take_result_datum(fcinfo, &result));
}

/*
 * bucket_take(endpoint text, tokens float8)
 *		Take with the limits stored by bucket_configure.
 */
Datum
ratebucket_take_configured(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		want = rb_arg_tokens(fcinfo, 1);
	RbTakeResult result;

	result = rb_take_with_limits(endpoint, true, 0.0, 0.0, want);
	PG_RETURN_DATUM(rb_take_result_datum(fcinfo, &result));
}

/*
 * bucket_ready(endpoint text, tokens float8) returns boolean
 *		Would a take of "tokens" be granted now?  Judged from the last
 *		committed row with the limits it stores (its configuration, if it has
 *		one), including a cooldown, a pause or an open breaker, without
 *		locking: a peek for
 *		a claim's WHERE clause, which the take itself then confirms.  An
 *		unknown endpoint is ready, since its bucket would start full.
 */
Datum
ratebucket_ready(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		want = rb_arg_tokens(fcinfo, 1);
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;
	bool		ready = true;

	rb_storage_begin(&session);
	found = rb_storage_peek(endpoint, &bucket);
	rb_storage_end(&session);

	if (found)
	{
		bool		configured = rb_is_configured(&bucket);
		RbTakeResult result;

		bool		write;

		result = rb_decide(&bucket,
						   configured ? bucket.conf_rate : bucket.rate,
						   configured ? bucket.conf_capacity : bucket.capacity,
						   want, GetCurrentTimestamp(), &write);
		ready = result.allowed;
	}
	PG_RETURN_BOOL(ready);
}
