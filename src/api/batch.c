/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  SQL-callable bucket_take_batch: its requests read and checked, the
 *	  engine's decision (engine/batch.c), and one result row per request.
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
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

#include "api/args.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_take_batch);

static void
rb_batch_null(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", what)));
}

/*
 * The buckets request i names (a text[] of 1 to RB_MAX_BATCH_KEYS
 * endpoints, none named twice), into req->keys.
 */
static void
rb_batch_read_keys(Datum d, int i, RbBatchRequest *req)
{
	ArrayType  *arr = DatumGetArrayTypeP(d);
	Datum	   *kd;
	bool	   *kn;
	int			nk;
	int			j;
	int			m;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a request's buckets must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &kd, &kn, &nk);
	if (nk < 1 || nk > RB_MAX_BATCH_KEYS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a request must name 1 to %d buckets", RB_MAX_BATCH_KEYS),
				 errdetail("Request %d names %d.", i + 1, nk)));
	req->nkeys = nk;
	req->keys = palloc(sizeof(char *) * nk);
	for (j = 0; j < nk; j++)
	{
		text	   *key;

		if (kn[j])
			rb_batch_null("a request's bucket");
		key = DatumGetTextPP(kd[j]);
		rb_check_endpoint(key);
		req->keys[j] = text_to_cstring(key);
		for (m = 0; m < j; m++)
			if (strcmp(req->keys[m], req->keys[j]) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("request %d names bucket \"%s\" twice",
								i + 1, req->keys[j])));
	}
}

/*
 * One ratebucket.batch_request (buckets text[], tokens int, inflight_key
 * text), request i of the batch, checked.
 */
static void
rb_batch_read_request(Datum elem, int i, RbBatchRequest *req)
{
	HeapTupleHeader tup = DatumGetHeapTupleHeader(elem);
	bool		isnull;
	Datum		d;

	d = GetAttributeByNum(tup, 1, &isnull);
	if (isnull)
		rb_batch_null("a request's buckets");
	rb_batch_read_keys(d, i, req);

	d = GetAttributeByNum(tup, 2, &isnull);
	if (isnull)
		rb_batch_null("a request's tokens");
	req->tokens = DatumGetInt32(d);
	if (req->tokens < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a request's tokens must not be negative"),
				 errdetail("Request %d asks for %lld.", i + 1,
						   (long long) req->tokens)));

	d = GetAttributeByNum(tup, 3, &isnull);
	req->cap_key = NULL;
	if (!isnull)
	{
		text	   *cap = DatumGetTextPP(d);

		if (VARSIZE_ANY_EXHDR(cap) < 1 ||
			VARSIZE_ANY_EXHDR(cap) > RB_MAX_ENDPOINT_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a request's inflight_key must be 1 to %d bytes",
							RB_MAX_ENDPOINT_BYTES),
					 errdetail("Request %d names a key of %d bytes.", i + 1,
							   (int) VARSIZE_ANY_EXHDR(cap))));
		req->cap_key = text_to_cstring(cap);
	}
}

/* The requests of a ratebucket.batch_request[], checked. */
static void
rb_batch_parse(ArrayType *arr, RbBatch *batch)
{
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int16		elemlen;
	bool		elembyval;
	char		elemalign;
	Datum	   *elems;
	bool	   *elemnulls;
	int			n;
	int			i;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("requests must be a one-dimensional array")));
	get_typlenbyvalalign(elemtype, &elemlen, &elembyval, &elemalign);
	deconstruct_array(arr, elemtype, elemlen, elembyval, elemalign,
					  &elems, &elemnulls, &n);
	if (n > RB_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a batch may hold at most %d requests", RB_MAX_BATCH),
				 errdetail("%d were given.", n)));

	memset(batch, 0, sizeof(*batch));
	batch->nrequests = n;
	batch->requests = palloc0(sizeof(RbBatchRequest) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (elemnulls[i])
			rb_batch_null("a request");
		rb_batch_read_request(elems[i], i, &batch->requests[i]);
	}
}

/* The slots a request holds, as a bigint[]. */
static Datum
rb_batch_slots_datum(const RbBatch *batch, const RbBatchRequest *req)
{
	int64	   *slots = rb_batch_slots(batch, req);
	Datum	   *elems = palloc(sizeof(Datum) * Max(req->granted, 1));
	int			k;

	for (k = 0; k < req->granted; k++)
		elems[k] = Int64GetDatum(slots[k]);
	return PointerGetDatum(construct_array(elems, (int) req->granted,
										   INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

/*
 * bucket_take_batch(requests ratebucket.batch_request[]) returns
 *		setof (request int, granted int, wait_seconds float8, slots bigint[])
 *		One row per request, in the order given: its 1-based position, the
 *		tokens granted (taken from every one of its buckets), the seconds
 *		until its buckets could grant one more (0 if they could now), and the
 *		slots it holds (NULL without a cap).
 */
Datum
ratebucket_take_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext oldcxt;
	RbBatch		batch;
	int			i;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("bucket_take_batch must be called in FROM")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	PreventCommandIfReadOnly("bucket_take_batch");

	rb_batch_parse(PG_GETARG_ARRAYTYPE_P(0), &batch);
	rb_engine_take_batch(&batch);

	oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTupleDescCopy(tupdesc);
	store = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(oldcxt);
	for (i = 0; i < batch.nrequests; i++)
	{
		RbBatchRequest *req = &batch.requests[i];
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = Int32GetDatum((int32) req->granted);
		values[2] = Float8GetDatum(req->wait);
		if (req->cap < 0)
			nulls[3] = true;
		else
			values[3] = rb_batch_slots_datum(&batch, req);
		tuplestore_putvalues(store, tupdesc, values, nulls);
	}
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;
	return (Datum) 0;
}
