/*-------------------------------------------------------------------------
 *
 * status.c
 *	  SQL-callable arithmetic for monitoring: refill_tokens.
 *
 * The status view computes "tokens now" with the very function the takes
 * use, so what an operator sees is what the next take would find.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/timestamp.h"

#include "arith.h"

PG_FUNCTION_INFO_V1(ratebucket_refill_tokens);

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
