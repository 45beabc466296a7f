/*-------------------------------------------------------------------------
 *
 * reserve.c
 *	  SQL-callable bucket_reserve and bucket_reserves (token reserves in
 *	  shared memory: see bucket/reserve.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "api/args.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_reserve);
PG_FUNCTION_INFO_V1(ratebucket_reserves);

/*
 * bucket_reserve(endpoint text, batch int) returns int
 *		Give a configured endpoint a token reserve, refilled up to "batch"
 *		tokens at a time; NULL takes it away.  Returns the batch it had
 *		(NULL if none).
 */
Datum
ratebucket_reserve(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	int32		batch = -1;
	int32		old;

	if (!PG_ARGISNULL(1))
	{
		int32		b = PG_GETARG_INT32(1);

		if (b < 1 || b > RB_RESERVE_MAX_BATCH)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("batch must be between 1 and %d", RB_RESERVE_MAX_BATCH),
					 errdetail("%d was given.", b),
					 errhint("Use NULL to take the reserve away.")));
		batch = b;
	}
	old = rb_engine_reserve(endpoint, batch);
	if (old < 1)
		PG_RETURN_NULL();
	PG_RETURN_INT32(old);
}

#define RB_RESERVES_COLUMNS 13

/* One reserve as a row of bucket_reserves. */
static void
rb_reserve_row(const RbReserveInfo *r, Datum *values, bool *nulls)
{
	memset(nulls, 0, sizeof(bool) * RB_RESERVES_COLUMNS);
	values[0] = CStringGetTextDatum(r->endpoint);
	values[1] = Float8GetDatum(r->tokens);
	values[2] = Float8GetDatum(r->pending);
	values[3] = Float8GetDatum(r->drawn);
	values[4] = Int32GetDatum((int32) r->batch);
	values[5] = Float8GetDatum(r->rate);
	values[6] = Float8GetDatum(r->capacity);
	values[7] = Int64GetDatum(r->draws);
	values[8] = Float8GetDatum(r->tokens_drawn);
	values[9] = Int64GetDatum(r->refills);
	values[10] = Int64GetDatum(r->drains);
	values[11] = TimestampTzGetDatum(r->created_at);
	values[12] = TimestampTzGetDatum(r->last_refill_at);
}

/*
 * bucket_reserves() returns setof record
 *		The token reserves of this database's endpoints, as they are now.
 */
Datum
ratebucket_reserves(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	RbReserveInfo *infos;
	Datum		values[RB_RESERVES_COLUMNS];
	bool		nulls[RB_RESERVES_COLUMNS];
	int			n;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	n = rb_engine_reserves(&infos);
	for (i = 0; i < n; i++)
	{
		rb_reserve_row(&infos[i], values, nulls);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
