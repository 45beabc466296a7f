/*-------------------------------------------------------------------------
 *
 * status.c
 *	  SQL-callable arithmetic for monitoring: refill_tokens, bucket_now,
 *	  and for calendar quotas quota_window and quota_now.
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

#include "api/args.h"
#include "api/result.h"
#include "bucket/calendar.h"
#include "bucket/storage.h"

PG_FUNCTION_INFO_V1(ratebucket_refill_tokens);
PG_FUNCTION_INFO_V1(ratebucket_bucket_now);
PG_FUNCTION_INFO_V1(ratebucket_quota_window);
PG_FUNCTION_INFO_V1(ratebucket_quota_now);

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
	RbBucketNow now;
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8] = {false, false, false, false, false, false, false, false};

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	at = PG_ARGISNULL(1) ? GetCurrentTimestamp() : PG_GETARG_TIMESTAMPTZ(1);
	rb_storage_from_row(PG_GETARG_HEAPTUPLEHEADER(0), &bucket);
	tupdesc = rb_result_tupdesc(fcinfo);

	rb_bucket_now(&bucket, at, &now);
	values[0] = Float8GetDatum(now.tokens);
	values[1] = Float8GetDatum(now.effective_rate);
	values[2] = Float8GetDatum(now.cooldown_seconds);
	values[3] = BoolGetDatum(now.paused);
	values[4] = CStringGetTextDatum(rb_breaker_name(now.breaker));
	values[5] = Float8GetDatum(now.breaker_seconds);
	if (now.at_floor)
		values[6] = TimestampTzGetDatum(now.at_floor_since);
	else
		nulls[6] = true;
	values[7] = BoolGetDatum(now.expirable);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * quota_window(period text, time_zone text, at timestamptz)
 *		returns (window_start timestamptz, resets_at timestamptz)
 *		The window of a quota's period in the zone that contains "at": what
 *		the takes of a quota use, for checking the calendar arithmetic at
 *		an explicit time.  The same checks as bucket_configure_quota.
 */
Datum
ratebucket_quota_window(PG_FUNCTION_ARGS)
{
	RbQuotaPeriod period;
	pg_tz	   *tz;
	TimestampTz at;
	TimestampTz start;
	TimestampTz end;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	period = rb_check_quota_period(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	tz = rb_check_quota_zone(text_to_cstring(PG_GETARG_TEXT_PP(1)));
	at = PG_GETARG_TIMESTAMPTZ(2);
	rb_quota_window(period, tz, at, &start, &end);

	tupdesc = rb_result_tupdesc(fcinfo);
	values[0] = TimestampTzGetDatum(start);
	values[1] = TimestampTzGetDatum(end);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * quota_now(b ratebucket.buckets, at timestamptz)
 *		returns (used float8, remaining float8, window_start timestamptz,
 *				 resets_at timestamptz)
 *		A quota bucket's window at "at": what was used of it, what is left,
 *		when it started and when it resets.  All NULL for a rate bucket.
 */
Datum
ratebucket_quota_now(PG_FUNCTION_ARGS)
{
	TimestampTz at;
	RbBucket	bucket;
	TupleDesc	tupdesc;
	Datum		values[4] = {0, 0, 0, 0};
	bool		nulls[4] = {true, true, true, true};
	bool		rate_bucket;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	tupdesc = rb_result_tupdesc(fcinfo);

	/*
	 * A rate bucket, the usual row of the status view (and of the claim
	 * recipe's look-ups through it): no need to read the whole row.
	 */
	(void) GetAttributeByName(PG_GETARG_HEAPTUPLEHEADER(0), "quota_period",
							  &rate_bucket);
	if (rate_bucket)
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));

	at = PG_ARGISNULL(1) ? GetCurrentTimestamp() : PG_GETARG_TIMESTAMPTZ(1);
	rb_storage_from_row(PG_GETARG_HEAPTUPLEHEADER(0), &bucket);

	{
		TimestampTz start;
		TimestampTz end;
		double		used;
		double		left;

		if (rb_bucket_quota_now(&bucket, at, &used, &left, &start, &end))
		{
			values[0] = Float8GetDatum(used);
			values[1] = Float8GetDatum(left);
			values[2] = TimestampTzGetDatum(start);
			values[3] = TimestampTzGetDatum(end);
			nulls[0] = nulls[1] = nulls[2] = nulls[3] = false;
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
