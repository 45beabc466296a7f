/*-------------------------------------------------------------------------
 *
 * args.c
 *	  Argument checks shared by the SQL-callable functions.
 *
 * The SQL functions are not STRICT: a NULL argument is a caller's mistake
 * (a missing join, a typo) that should be heard, not a silent NULL that a
 * WHERE clause reads as "no".  Every check runs before any row is touched,
 * so a refused call leaves every row as it was.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "utils/builtins.h"
#include "utils/float.h"
#if PG_VERSION_NUM >= 160000
#include "varatt.h"				/* in postgres.h before 18 */
#endif

#include "api/args.h"
#include "bucket/calendar.h"

/* Raise the error for a NULL argument. */
static void
rb_null_arg(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", what)));
}

/*
 * rb_arg_endpoint
 *		Fetch argument "argno" as an endpoint: not NULL, 1 to
 *		RB_MAX_ENDPOINT_BYTES bytes.  Returns it detoasted.
 */
text *
rb_arg_endpoint(FunctionCallInfo fcinfo, int argno)
{
	text	   *endpoint;

	if (PG_ARGISNULL(argno))
		rb_null_arg("endpoint");
	endpoint = PG_GETARG_TEXT_PP(argno);
	rb_check_endpoint(endpoint);
	return endpoint;
}

/*
 * rb_check_endpoint
 *		An endpoint, already detoasted, must be 1 to RB_MAX_ENDPOINT_BYTES
 *		bytes.
 */
void
rb_check_endpoint(text *endpoint)
{
	int			len = VARSIZE_ANY_EXHDR(endpoint);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("endpoint must not be empty")));
	if (len > RB_MAX_ENDPOINT_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("endpoint is too long"),
				 errdetail("The endpoint is %d bytes; at most %d are allowed.",
						   len, RB_MAX_ENDPOINT_BYTES),
				 errhint("Use a shorter key, such as a host name or a hash of the URL.")));
}

/* Fetch a float8 argument that must be a finite number within [lo, hi]. */
static double
rb_arg_bounded(FunctionCallInfo fcinfo, int argno, const char *what,
			   double lo, bool lo_inclusive, double hi)
{
	double		v;

	if (PG_ARGISNULL(argno))
		rb_null_arg(what);
	v = PG_GETARG_FLOAT8(argno);
	if (isnan(v) || isinf(v))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a finite number", what),
				 errdetail("The value given was %s.", float8out_internal(v))));
	if (v < lo || (!lo_inclusive && v == lo) || v > hi)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 lo_inclusive ?
				 errmsg("%s must be at least %g and at most %g", what, lo, hi) :
				 errmsg("%s must be greater than %g and at most %g", what, lo, hi),
				 errdetail("The value given was %s.", float8out_internal(v))));
	return v;
}

/*
 * rb_arg_optional
 *		An optional float8 argument: NULL (use the default) reads as NaN;
 *		anything else must be a finite number within the bounds.
 */
double
rb_arg_optional(FunctionCallInfo fcinfo, int argno, const char *what,
				double lo, bool lo_inclusive, double hi)
{
	if (PG_ARGISNULL(argno))
		return get_float8_nan();
	return rb_arg_bounded(fcinfo, argno, what, lo, lo_inclusive, hi);
}

/* A rate: tokens per second, RB_MIN_RATE to RB_MAX_RATE. */
double
rb_arg_rate(FunctionCallInfo fcinfo, int argno)
{
	return rb_arg_bounded(fcinfo, argno, "rate", RB_MIN_RATE, true, RB_MAX_RATE);
}

/* A capacity: more than 0, at most RB_MAX_CAPACITY. */
double
rb_arg_capacity(FunctionCallInfo fcinfo, int argno)
{
	return rb_arg_bounded(fcinfo, argno, "capacity", 0.0, false, RB_MAX_CAPACITY);
}

/* A number of tokens given as a value, not an argument: as rb_arg_tokens. */
void
rb_check_tokens_value(double v)
{
	if (isnan(v) || isinf(v))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens must be a finite number"),
				 errdetail("The value given was %s.", float8out_internal(v))));
	if (v <= 0.0 || v > RB_MAX_CAPACITY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens must be greater than 0 and at most %g", RB_MAX_CAPACITY),
				 errdetail("The value given was %s.", float8out_internal(v))));
}

/* Tokens to take or test for: more than 0, at most RB_MAX_CAPACITY. */
double
rb_arg_tokens(FunctionCallInfo fcinfo, int argno)
{
	return rb_arg_bounded(fcinfo, argno, "tokens", 0.0, false, RB_MAX_CAPACITY);
}

/*
 * rb_arg_count
 *		An int argument counting whole things (tokens, events): at least 1.
 */
int32
rb_arg_count(FunctionCallInfo fcinfo, int argno, const char *what)
{
	int32		v;

	if (PG_ARGISNULL(argno))
		rb_null_arg(what);
	v = PG_GETARG_INT32(argno);
	if (v < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least 1", what),
				 errdetail("The value given was %d.", v)));
	return v;
}

/*
 * rb_check_quota_period
 *		The calendar period a quota argument names, or an error.
 */
RbQuotaPeriod
rb_check_quota_period(const char *name)
{
	RbQuotaPeriod period = rb_quota_period(name);

	if (period == RB_QUOTA_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("quota period \"%s\" is not recognized", name),
				 errhint("Use one of: %s.", RB_QUOTA_PERIODS)));
	return period;
}

/*
 * rb_check_quota_zone
 *		The time zone a quota argument names, as date_trunc and SET TIME ZONE
 *		look it up, or an error (22023 if unknown, as theirs).
 */
pg_tz *
rb_check_quota_zone(const char *name)
{
	pg_tz	   *tz = rb_quota_zone(name);

	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" not recognized", name),
				 errhint("Name a zone of the time zone database, such as 'America/New_York' or 'UTC' (see pg_timezone_names); an abbreviation such as 'PST' has no calendar of its own.")));
	return tz;
}

/*
 * rb_arg_config
 *		A configuration from the arguments argno (rate), argno + 1
 *		(capacity) and the optional argno + 2 to argno + 5 (floor_rate,
 *		throttle_factor, recovery_factor, breaker_failures): the arguments
 *		of bucket_configure and bucket_template after the key.
 */
void
rb_arg_config(FunctionCallInfo fcinfo, int argno, RbConfig *config)
{
	config->rate = rb_arg_rate(fcinfo, argno);
	config->capacity = rb_arg_capacity(fcinfo, argno + 1);
	config->floor_rate = rb_arg_optional(fcinfo, argno + 2, "floor_rate",
										 RB_MIN_RATE, true, RB_MAX_RATE);
	config->throttle_factor = rb_arg_optional(fcinfo, argno + 3, "throttle_factor",
											  0.0, false, 1.0);
	config->recovery_factor = rb_arg_optional(fcinfo, argno + 4, "recovery_factor",
											  1.0, true, 100.0);
	config->breaker_failures = -1;
	if (!PG_ARGISNULL(argno + 5))
	{
		config->breaker_failures = PG_GETARG_INT32(argno + 5);
		if (config->breaker_failures < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("breaker_failures must not be negative"),
					 errhint("Use 0 to disable the circuit breaker, NULL for ratebucket.breaker_failures.")));
	}
}
