/*-------------------------------------------------------------------------
 *
 * take.c
 *	  SQL-callable takes and peeks: bucket_take and bucket_take_upto (both
 *	  forms of each), bucket_take_all, and the peeks bucket_ready and
 *	  bucket_wait.  Each checks its arguments, calls the engine, and builds
 *	  its result.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "api/args.h"
#include "api/result.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_take);
PG_FUNCTION_INFO_V1(ratebucket_take_configured);
PG_FUNCTION_INFO_V1(ratebucket_take_upto);
PG_FUNCTION_INFO_V1(ratebucket_take_upto_configured);
PG_FUNCTION_INFO_V1(ratebucket_take_all);
PG_FUNCTION_INFO_V1(ratebucket_ready);
PG_FUNCTION_INFO_V1(ratebucket_wait);

/* Most buckets one bucket_take_all may name. */
#define RB_MAX_TAKE_ALL 64

/*
 * rb_take_result_datum
 *		Build the (allowed, remaining, wait_seconds) row, a take_result.
 */
static Datum
rb_take_result_datum(FunctionCallInfo fcinfo, const RbTakeResult *result)
{
	static const Oid types[3] = {BOOLOID, FLOAT8OID, FLOAT8OID};
	TupleDesc	tupdesc = rb_result_tupdesc_of(fcinfo, 3, types);
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = BoolGetDatum(result->allowed);
	values[1] = Float8GetDatum(result->remaining);
	values[2] = Float8GetDatum(result->wait_seconds);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * rb_upto_result_datum
 *		Build the (granted, remaining, wait_seconds) row, a take_upto_result.
 */
static Datum
rb_upto_result_datum(FunctionCallInfo fcinfo, const RbTakeResult *result,
					 double granted)
{
	static const Oid types[3] = {INT4OID, FLOAT8OID, FLOAT8OID};
	TupleDesc	tupdesc = rb_result_tupdesc_of(fcinfo, 3, types);
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = Int32GetDatum((int32) granted);
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
	RbTakeRequest req = {false, 0.0, 0.0, 0.0, 0, false};
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbTakeResult result;
	double		granted;

	PreventCommandIfReadOnly("bucket_take");

	req.rate = rb_arg_rate(fcinfo, 1);
	req.capacity = rb_arg_capacity(fcinfo, 2);
	req.want = rb_arg_tokens(fcinfo, 3);
	rb_check_request_fits(&req, req.capacity);
	result = rb_engine_take(endpoint, &req, &granted);
	PG_RETURN_DATUM(rb_take_result_datum(fcinfo, &result));
}

/*
 * bucket_take(endpoint text, tokens float8)
 *		Take with the limits stored by bucket_configure.
 */
Datum
ratebucket_take_configured(PG_FUNCTION_ARGS)
{
	RbTakeRequest req = {true, 0.0, 0.0, 0.0, 0, false};
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbTakeResult result;
	double		granted;

	PreventCommandIfReadOnly("bucket_take");

	req.want = rb_arg_tokens(fcinfo, 1);
	result = rb_engine_take(endpoint, &req, &granted);
	PG_RETURN_DATUM(rb_take_result_datum(fcinfo, &result));
}

/*
 * bucket_take_upto(endpoint text, rate float8, capacity float8,
 *					max_tokens int)
 *		Take as many whole tokens as the bucket holds, up to max_tokens, in
 *		one row update: a claim's batch for one endpoint.
 */
Datum
ratebucket_take_upto(PG_FUNCTION_ARGS)
{
	RbTakeRequest req = {false, 0.0, 0.0, 0.0, 0, false};
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbTakeResult result;
	double		granted;

	PreventCommandIfReadOnly("bucket_take_upto");

	req.rate = rb_arg_rate(fcinfo, 1);
	req.capacity = rb_arg_capacity(fcinfo, 2);
	req.upto = rb_arg_count(fcinfo, 3, "max_tokens");
	rb_check_request_fits(&req, req.capacity);
	result = rb_engine_take(endpoint, &req, &granted);
	PG_RETURN_DATUM(rb_upto_result_datum(fcinfo, &result, granted));
}

/*
 * bucket_take_upto(endpoint text, max_tokens int)
 *		The same with the limits stored by bucket_configure.
 */
Datum
ratebucket_take_upto_configured(PG_FUNCTION_ARGS)
{
	RbTakeRequest req = {true, 0.0, 0.0, 0.0, 0, false};
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbTakeResult result;
	double		granted;

	PreventCommandIfReadOnly("bucket_take_upto");

	req.upto = rb_arg_count(fcinfo, 1, "max_tokens");
	result = rb_engine_take(endpoint, &req, &granted);
	PG_RETURN_DATUM(rb_upto_result_datum(fcinfo, &result, granted));
}

/*
 * rb_all_items
 *		The buckets a bucket_take_all names, checked, in lock order
 *		(rb_engine_sort_items).  Sets *n.
 */
static RbAllItem *
rb_all_items(FunctionCallInfo fcinfo, int *n)
{
	ArrayType  *endpoints;
	Datum	   *ep_datums;
	bool	   *ep_nulls;
	Datum	   *tk_datums = NULL;
	bool	   *tk_nulls = NULL;
	int			count;
	int			tk_count = 0;
	RbAllItem  *items;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("endpoints must not be null")));
	endpoints = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(endpoints) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("endpoints must be a one-dimensional array")));
	deconstruct_array(endpoints, TEXTOID, -1, false, TYPALIGN_INT,
					  &ep_datums, &ep_nulls, &count);
	if (count < 1 || count > RB_MAX_TAKE_ALL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("endpoints must name 1 to %d buckets", RB_MAX_TAKE_ALL),
				 errdetail("%d were given.", count)));

	if (!PG_ARGISNULL(1))
	{
		ArrayType  *tokens = PG_GETARG_ARRAYTYPE_P(1);

		if (ARR_NDIM(tokens) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("tokens must be a one-dimensional array")));
		deconstruct_array(tokens, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL,
						  TYPALIGN_DOUBLE, &tk_datums, &tk_nulls, &tk_count);
		if (tk_count != count)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("tokens must have one element per endpoint"),
					 errdetail("%d endpoints, %d tokens.", count, tk_count)));
	}

	items = palloc0(sizeof(RbAllItem) * count);
	for (i = 0; i < count; i++)
	{
		if (ep_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("endpoint must not be null")));
		items[i].endpoint = DatumGetTextPP(ep_datums[i]);
		rb_check_endpoint(items[i].endpoint);
		items[i].key = text_to_cstring(items[i].endpoint);
		items[i].pos = i;
		items[i].want = 1.0;
		if (tk_datums != NULL)
		{
			if (tk_nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("tokens must not be null")));
			items[i].want = DatumGetFloat8(tk_datums[i]);
			rb_check_tokens_value(items[i].want);
		}
	}

	rb_engine_sort_items(items, count);
	*n = count;
	return items;
}

/*
 * bucket_take_all(endpoints text[], tokens float8[]) returns
 *		(allowed boolean, wait_seconds float8, remaining float8[])
 *		Take from several configured buckets at once, all or nothing
 *		(engine/take_all.c).  remaining is per endpoint, in the caller's
 *		order: what each holds after the take (or, refused, now).
 */
Datum
ratebucket_take_all(PG_FUNCTION_ARGS)
{
	int			n;
	RbAllItem  *items;
	bool		allowed;
	double		wait;
	Datum	   *remaining;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			i;

	items = rb_all_items(fcinfo, &n);
	PreventCommandIfReadOnly("bucket_take_all");
	allowed = rb_engine_take_all(items, n, &wait);

	remaining = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
		remaining[items[i].pos] = Float8GetDatum(items[i].result.remaining);
	tupdesc = rb_result_tupdesc(fcinfo);
	values[0] = BoolGetDatum(allowed);
	values[1] = Float8GetDatum(allowed ? 0.0 : wait);
	values[2] = PointerGetDatum(construct_array(remaining, n, FLOAT8OID,
												sizeof(float8), FLOAT8PASSBYVAL,
												TYPALIGN_DOUBLE));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * bucket_ready(endpoint text, tokens float8) returns boolean
 *		Would a take of "tokens" be granted now?  A peek (rb_engine_peek) for a
 *		claim's WHERE clause, which the take itself then confirms.
 */
Datum
ratebucket_ready(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		want = rb_arg_tokens(fcinfo, 1);
	double		granted;

	PG_RETURN_BOOL(rb_engine_peek(endpoint, want, 0, &granted).allowed);
}

/*
 * bucket_wait(endpoint text, tokens float8) returns float8
 *		Seconds until a take of "tokens" would be granted (0: now), by the
 *		same peek: for a worker deciding how long it may sleep.
 */
Datum
ratebucket_wait(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		want = rb_arg_tokens(fcinfo, 1);
	double		granted;
	RbTakeResult result = rb_engine_peek(endpoint, want, 0, &granted);

	PG_RETURN_FLOAT8(result.allowed ? 0.0 : result.wait_seconds);
}
