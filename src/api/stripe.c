/*-------------------------------------------------------------------------
 *
 * stripe.c
 *	  SQL-callable bucket_stripe and stripe_key (striped buckets: see
 *	  bucket/stripe.c for the layout, engine/striped.c for the take).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "api/args.h"
#include "bucket/stripe.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_stripe);
PG_FUNCTION_INFO_V1(ratebucket_stripe_key);

/*
 * bucket_stripe(endpoint text, stripes int) returns int
 *		Split a configured endpoint's bucket over "stripes" rows (1: back to
 *		one row).  Returns the stripe count it had (rb_engine_stripe).
 */
Datum
ratebucket_stripe(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	int32		stripes;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("stripes must not be null")));
	stripes = PG_GETARG_INT32(1);
	if (stripes < 1 || stripes > RB_MAX_STRIPES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stripes must be between 1 and %d", RB_MAX_STRIPES),
				 errdetail("%d was given.", stripes),
				 errhint("Use 1 to put the bucket back in one row.")));

	PG_RETURN_INT32(rb_engine_stripe(endpoint, stripes));
}

/*
 * stripe_key(endpoint text, stripe int, stripes int) returns text
 *		The key of a stripe's row in ratebucket.buckets, for the status view
 *		and for operators looking at the rows.  Pure.
 */
Datum
ratebucket_stripe_key(PG_FUNCTION_ARGS)
{
	text	   *endpoint = PG_GETARG_TEXT_PP(0);
	int32		stripe = PG_GETARG_INT32(1);
	int32		stripes = PG_GETARG_INT32(2);

	if (stripes < 1 || stripes > RB_MAX_STRIPES || stripe < 0 || stripe >= stripes)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stripe %d of %d does not exist", stripe, stripes),
				 errhint("Stripes are numbered from 0 to stripes - 1, with 1 to %d stripes.",
						 RB_MAX_STRIPES)));
	PG_RETURN_TEXT_P(rb_stripe_key(endpoint, stripe, stripes));
}
