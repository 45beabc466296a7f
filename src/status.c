/*-------------------------------------------------------------------------
 *
 * status.c
 *	  SQL-callable arithmetic for monitoring: refill_tokens and bucket_now.
 *
 * The status view computes "tokens now", the effective rate, the cooldown
 * and the breaker with the very functions the takes use, so what an
 * operator sees is what the next take would find.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "arith.h"
#include "ratebucket.h"
#include "storage.h"

PG_FUNCTION_INFO_V1(ratebucket_refill_tokens);
PG_FUNCTION_INFO_V1(ratebucket_bucket_now);

/*
 * refill_tokens(tokens, rate, capacity, refilled_at, at) returns float8
 *		Tokens held at "at" by a bucket that held "tokens" at "refilled_at".
 *		Pure and STRICT; it checks nothing, since it changes nothing.
 */
Datum
ratebucket_refill_tokens(PG_FUNCTION_ARGS)
{
	double		tokens = PG_GETARG_FLOAT8(0);
	double		rate = PG_GETARG_FLOAT8(1);
	double		capacity = PG_GETARG_FLOAT8(2);
	TimestampTz refilled_at = PG_GETARG_TIMESTAMPTZ(3);
	TimestampTz at = PG_GETARG_TIMESTAMPTZ(4);

	PG_RETURN_FLOAT8(rb_refill(tokens, rate, capacity, refilled_at, at));
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
 * bucket_now(b ratebucket.buckets, at timestamptz)
 *		returns (tokens, effective_rate, cooldown_seconds, paused, breaker,
 *				 breaker_seconds, at_floor_since, expirable)
 *
 * The limits are those a configured take uses if the endpoint is
 * configured, else those of its last granted take.
 */
Datum
ratebucket_bucket_now(PG_FUNCTION_ARGS)
{
	TimestampTz at;
	RbBucket	bucket;
	RbPolicy	policy;
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8] = {false, false, false, false, false, false, false, false};
	double		ceiling;
	double		capacity;
	double		tokens;
	RbBreakerState breaker;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	at = PG_ARGISNULL(1) ? GetCurrentTimestamp() : PG_GETARG_TIMESTAMPTZ(1);
	rb_storage_from_row(PG_GETARG_HEAPTUPLEHEADER(0), &bucket);
	tupdesc = rb_result_tupdesc(fcinfo);

	ceiling = rb_bucket_ceiling(&bucket);
	capacity = rb_is_configured(&bucket) ? bucket.conf_capacity : bucket.capacity;
	rb_bucket_policy(&bucket, ceiling, &policy);
	tokens = rb_refill(bucket.state.tokens,
					   ceiling * rb_factor_now(&bucket.adapt, &policy, at),
					   capacity, bucket.state.refilled_at, at);
	breaker = rb_breaker_state(&bucket.adapt, at);

	values[0] = Float8GetDatum(tokens);
	values[1] = Float8GetDatum(ceiling * rb_factor_now(&bucket.adapt, &policy, at));
	values[2] = Float8GetDatum(rb_secs_until(bucket.adapt.cooldown_until, at));
	values[3] = BoolGetDatum(bucket.adapt.paused_until != RB_NO_TIME &&
							 at < bucket.adapt.paused_until);
	values[4] = CStringGetTextDatum(rb_breaker_name(breaker));
	values[5] = Float8GetDatum(breaker == RB_BREAKER_OPEN ?
							   rb_secs_until(bucket.adapt.open_until, at) : 0.0);
	if (rb_at_floor(&bucket.adapt, &policy, at))
		values[6] = TimestampTzGetDatum(bucket.adapt.at_floor_since);
	else
		nulls[6] = true;
	values[7] = BoolGetDatum(tokens >= capacity &&
							 rb_adapt_is_idle(&bucket.adapt, &policy, at));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
