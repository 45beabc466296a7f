/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  SQL-callable administration: bucket_configure,
 *	  bucket_configure_quota, bucket_reset, bucket_drop, bucket_pause and
 *	  bucket_resume.  Arguments are checked here, before any row is
 *	  touched; the work under the row lock is engine/admin.c's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/timestamp.h"

#include "api/args.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_configure);
PG_FUNCTION_INFO_V1(ratebucket_configure_quota);
PG_FUNCTION_INFO_V1(ratebucket_reset);
PG_FUNCTION_INFO_V1(ratebucket_drop);
PG_FUNCTION_INFO_V1(ratebucket_pause);
PG_FUNCTION_INFO_V1(ratebucket_resume);

/*
 * bucket_configure(endpoint text, rate float8, capacity float8,
 *					floor_rate float8, throttle_factor float8,
 *					recovery_factor float8, breaker_failures int)
 *		Store the endpoint's limits and feedback policy
 *		(rb_engine_configure).
 */
Datum
ratebucket_configure(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbConfig	config;

	rb_arg_config(fcinfo, 1, &config);
	rb_engine_configure(endpoint, &config);
	PG_RETURN_VOID();
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
	rb_engine_configure_quota(endpoint, quota, period, tz);
	PG_RETURN_VOID();
}

/*
 * bucket_reset(endpoint text) returns boolean
 *		Fill the bucket and forget what feedback taught (rb_engine_reset).
 */
Datum
ratebucket_reset(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);

	PG_RETURN_BOOL(rb_engine_reset(endpoint));
}

/*
 * bucket_drop(endpoint text) returns boolean
 *		Delete the bucket and its configuration.  False if there was none.
 */
Datum
ratebucket_drop(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);

	PG_RETURN_BOOL(rb_engine_drop(endpoint));
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
	PG_RETURN_BOOL(rb_engine_pause(endpoint, until));
}

/*
 * bucket_resume(endpoint text) returns boolean
 *		End a pause.
 */
Datum
ratebucket_resume(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);

	PG_RETURN_BOOL(rb_engine_pause(endpoint, RB_NO_TIME));
}
