/*-------------------------------------------------------------------------
 *
 * inflight.c
 *	  SQL-callable in-flight caps: inflight_configure, inflight_acquire,
 *	  inflight_release, inflight_renew and inflight_drop.  Arguments are
 *	  checked here; the rows are bucket/inflight.c's.
 *
 * The functions are SECURITY DEFINER in SQL, so they run as the
 * extension's owner and no role needs privileges on the tables.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "bucket/inflight.h"

PG_FUNCTION_INFO_V1(ratebucket_inflight_configure);
PG_FUNCTION_INFO_V1(ratebucket_inflight_acquire);
PG_FUNCTION_INFO_V1(ratebucket_inflight_release);
PG_FUNCTION_INFO_V1(ratebucket_inflight_renew);
PG_FUNCTION_INFO_V1(ratebucket_inflight_drop);

/* A lease must be a positive interval. */
static void
rb_check_lease(Interval *lease)
{
	Interval	zero;

	memset(&zero, 0, sizeof(zero));
	if (DatumGetBool(DirectFunctionCall2(interval_le, IntervalPGetDatum(lease),
										 IntervalPGetDatum(&zero))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be a positive interval")));
}

/* Arguments 0 to n - 1 must not be NULL; "what" names them for the error. */
static void
rb_check_not_null(FunctionCallInfo fcinfo, int n, const char *what)
{
	int			i;

	for (i = 0; i < n; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", what)));
}

/*
 * inflight_configure(key text, cap int, lease interval) returns void
 *		Allow at most cap slots of key in flight at once, each held for at
 *		most lease unless renewed (cap 0 holds everything back).
 */
Datum
ratebucket_inflight_configure(PG_FUNCTION_ARGS)
{
	text	   *key;
	int32		cap;
	Interval   *lease;

	rb_check_not_null(fcinfo, 3, "key, cap and lease");
	key = PG_GETARG_TEXT_PP(0);
	cap = PG_GETARG_INT32(1);
	lease = PG_GETARG_INTERVAL_P(2);
	if (VARSIZE_ANY_EXHDR(key) == 0 ||
		VARSIZE_ANY_EXHDR(key) > RB_MAX_INFLIGHT_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must be 1 to %d bytes", RB_MAX_INFLIGHT_KEY_BYTES)));
	if (cap < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cap must not be negative"),
				 errdetail("The value given was %d.", cap)));
	rb_check_lease(lease);

	rb_inflight_configure(key, cap, lease);
	PG_RETURN_VOID();
}

/*
 * inflight_acquire(key text, n int) returns bigint[]
 *		Acquire up to n slots of key, as many as its cap leaves free; their
 *		ids, an empty array if none is free.
 */
Datum
ratebucket_inflight_acquire(PG_FUNCTION_ARGS)
{
	int32		n;
	int64	   *slots;
	Datum	   *elems;
	int			got;
	int			i;

	rb_check_not_null(fcinfo, 2, "key and n");
	n = PG_GETARG_INT32(1);
	if (n < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("n must be at least 1"),
				 errdetail("The value given was %d.", n)));

	got = rb_inflight_acquire(PG_GETARG_TEXT_PP(0), n, CurrentMemoryContext,
							  &slots);
	elems = palloc(sizeof(Datum) * Max(got, 1));
	for (i = 0; i < got; i++)
		elems[i] = Int64GetDatum(slots[i]);
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, got, INT8OID, 8,
										  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/*
 * inflight_release(key text, slots bigint[]) returns int
 *		Release slots of key; how many were still held.
 */
Datum
ratebucket_inflight_release(PG_FUNCTION_ARGS)
{
	rb_check_not_null(fcinfo, 2, "key and slots");
	PG_RETURN_INT32(rb_inflight_release(PG_GETARG_TEXT_PP(0),
										PG_GETARG_ARRAYTYPE_P(1)));
}

/*
 * inflight_renew(key text, slots bigint[], lease interval) returns int
 *		Extend the lease of slots of key still held, by lease from now
 *		(NULL: the cap's lease); how many were renewed.
 */
Datum
ratebucket_inflight_renew(PG_FUNCTION_ARGS)
{
	Interval   *lease = NULL;

	rb_check_not_null(fcinfo, 2, "key and slots");
	if (!PG_ARGISNULL(2))
	{
		lease = PG_GETARG_INTERVAL_P(2);
		rb_check_lease(lease);
	}
	PG_RETURN_INT32(rb_inflight_renew(PG_GETARG_TEXT_PP(0),
									  PG_GETARG_ARRAYTYPE_P(1), lease));
}

/*
 * inflight_drop(key text) returns boolean
 *		Forget the cap of key and every slot it holds; false if there was
 *		none (a NULL key names none).
 */
Datum
ratebucket_inflight_drop(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(rb_inflight_drop(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0)));
}
