/*-------------------------------------------------------------------------
 *
 * observe.c
 *	  SQL-callable bucket_observe: what the destination answered, read from
 *	  the arguments, applied by the engine (engine/observe.c), reported.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"
#include "utils/timestamp.h"
#include "utils/jsonb.h"

#include "api/args.h"
#include "api/headers.h"
#include "api/result.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_observe);
PG_FUNCTION_INFO_V1(ratebucket_observe_batch);

/*
 * rb_response_check
 *		The checks bucket_observe makes of a status, headers and a send
 *		time, before any row is touched.
 */
static void
rb_response_check(bool has_status, int32 status, Jsonb *headers,
				  bool has_sent_at, TimestampTz sent_at)
{
	if (has_status && status != 0 && (status < 100 || status > 999))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status code", status),
				 errhint("Pass 0 or NULL when no response arrived (a connection failure or a timeout).")));
	if (headers != NULL && !JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
	if (has_sent_at && TIMESTAMP_NOT_FINITE(sent_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sent_at must be a finite time"),
				 errhint("Pass when the request was sent, or NULL if that is not known.")));
}

/*
 * rb_response_build
 *		An RbResponse from bucket_observe's arguments, already checked.
 */
static void
rb_response_build(bool has_status, int32 status, text *retry_after,
				  Jsonb *headers, bool has_sent_at, TimestampTz sent_at,
				  RbResponse *response)
{
	response->has_status = has_status;
	response->status = has_status ? status : 0;
	rb_response_from_jsonb(headers, response);
	if (has_sent_at)
		response->sent_at = sent_at;
	if (retry_after != NULL)
	{
		/* the argument wins over a Retry-After in headers */
		response->retry_after = VARDATA_ANY(retry_after);
		response->retry_after_len = VARSIZE_ANY_EXHDR(retry_after);
		response->retry_after_bad = false;
	}
}

/*
 * rb_observation_values
 *		bucket_observe's four result columns from an observation.
 */
static void
rb_observation_values(bool found, const RbObservation *obs, Datum *values,
					  bool *nulls)
{
	values[0] = CStringGetTextDatum(rb_outcome_name(obs->outcome));
	nulls[0] = false;
	values[1] = Float8GetDatum(found ? obs->cooldown_seconds : 0.0);
	nulls[1] = false;
	/* no bucket: nothing adapted */
	nulls[2] = nulls[3] = !found;
	values[2] = found ? Float8GetDatum(obs->effective_rate) : (Datum) 0;
	values[3] = found ? CStringGetTextDatum(rb_breaker_name(obs->breaker)) : (Datum) 0;
}

/*
 * bucket_observe(endpoint text, status int, retry_after text, headers jsonb,
 *				  sent_at timestamptz)
 *		returns (outcome text, cooldown_seconds float8, effective_rate float8,
 *				 breaker text)
 *		The last two are NULL for an endpoint that has no bucket.  sent_at
 *		came with 1.5: the SQL declaration of an older version has four
 *		arguments.
 */
Datum
ratebucket_observe(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	Jsonb	   *headers = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	bool		has_sent_at = PG_NARGS() > 4 && !PG_ARGISNULL(4);
	TimestampTz sent_at = has_sent_at ? PG_GETARG_TIMESTAMPTZ(4) : 0;
	int32		status = PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1);
	RbResponse	response;
	RbObservation obs;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4];
	bool		found;

	rb_response_check(!PG_ARGISNULL(1), status, headers, has_sent_at, sent_at);
	tupdesc = rb_result_tupdesc(fcinfo);
	rb_response_build(!PG_ARGISNULL(1), status,
					  PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2),
					  headers, has_sent_at, sent_at, &response);
	found = rb_engine_observe(endpoint, &response, &obs);
	rb_observation_values(found, &obs, values, nulls);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* One argument array of bucket_observe_batch, deconstructed. */
typedef struct RbColumn
{
	Datum	   *values;			/* NULL: the whole argument was NULL */
	bool	   *nulls;
} RbColumn;

/*
 * rb_batch_column
 *		Argument "argno", an array of "elemtype" that must hold n elements,
 *		or be NULL when "optional".
 */
static void
rb_batch_column(FunctionCallInfo fcinfo, int argno, Oid elemtype,
				const char *name, bool optional, int n, RbColumn *col)
{
	ArrayType  *arr;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			count;

	col->values = NULL;
	col->nulls = NULL;
	if (PG_ARGISNULL(argno))
	{
		if (!optional)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", name)));
		return;
	}
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  &col->values, &col->nulls, &count);
	if (count != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s has %d elements, endpoints %d", name, count, n),
				 errhint("Every array of a batch is as long as endpoints; the optional ones may be NULL.")));
}

static bool
rb_column_null(const RbColumn *col, int i)
{
	return col->values == NULL || col->nulls[i];
}

/* Order of the batch's elements: by endpoint in byte order, then given. */
typedef struct RbBatchItem
{
	text	   *endpoint;
	int			ord;
} RbBatchItem;

static bool
rb_same_endpoint(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

static int
rb_batch_item_cmp(const void *a, const void *b)
{
	const RbBatchItem *x = (const RbBatchItem *) a;
	const RbBatchItem *y = (const RbBatchItem *) b;
	int			lx = VARSIZE_ANY_EXHDR(x->endpoint);
	int			ly = VARSIZE_ANY_EXHDR(y->endpoint);
	int			c = memcmp(VARDATA_ANY(x->endpoint), VARDATA_ANY(y->endpoint),
						   Min(lx, ly));

	if (c != 0)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x->ord - y->ord;
}

/*
 * rb_batch_read
 *		bucket_observe_batch's arguments, every element checked: the
 *		responses in the order given, and the elements sorted by endpoint
 *		in byte order (then in the order given).  Returns how many.
 */
static int
rb_batch_read(FunctionCallInfo fcinfo, RbBatchItem **items_out,
			  RbResponse **responses_out)
{
	RbColumn	endpoints;
	RbColumn	statuses;
	RbColumn	retry_afters;
	RbColumn	headers;
	RbColumn	sent_ats;
	RbBatchItem *items;
	RbResponse *responses;
	int			n;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("endpoints must not be null")));
	n = ArrayGetNItems(ARR_NDIM(PG_GETARG_ARRAYTYPE_P(0)),
					   ARR_DIMS(PG_GETARG_ARRAYTYPE_P(0)));
	rb_batch_column(fcinfo, 0, TEXTOID, "endpoints", false, n, &endpoints);
	rb_batch_column(fcinfo, 1, INT4OID, "statuses", false, n, &statuses);
	rb_batch_column(fcinfo, 2, TEXTOID, "retry_afters", true, n, &retry_afters);
	rb_batch_column(fcinfo, 3, JSONBOID, "headers", true, n, &headers);
	rb_batch_column(fcinfo, 4, TIMESTAMPTZOID, "sent_ats", true, n, &sent_ats);

	items = palloc(sizeof(RbBatchItem) * Max(n, 1));
	responses = palloc0(sizeof(RbResponse) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		bool		has_status = !statuses.nulls[i];
		int32		status = has_status ? DatumGetInt32(statuses.values[i]) : 0;
		Jsonb	   *hd = rb_column_null(&headers, i) ? NULL :
			DatumGetJsonbP(headers.values[i]);
		bool		has_sent_at = !rb_column_null(&sent_ats, i);
		TimestampTz sent_at = has_sent_at ?
			DatumGetTimestampTz(sent_ats.values[i]) : 0;

		if (endpoints.nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("endpoints must not hold a NULL"),
					 errdetail("Element %d is NULL.", i + 1)));
		items[i].endpoint = DatumGetTextPP(endpoints.values[i]);
		items[i].ord = i;
		rb_check_endpoint(items[i].endpoint);
		rb_response_check(has_status, status, hd, has_sent_at, sent_at);
		rb_response_build(has_status, status,
						  rb_column_null(&retry_afters, i) ? NULL :
						  DatumGetTextPP(retry_afters.values[i]),
						  hd, has_sent_at, sent_at, &responses[i]);
	}
	qsort(items, n, sizeof(RbBatchItem), rb_batch_item_cmp);
	*items_out = items;
	*responses_out = responses;
	return n;
}

/*
 * bucket_observe_batch(endpoints text[], statuses int[], retry_afters text[],
 *						headers jsonb[], sent_ats timestamptz[])
 *		returns setof (ord int, outcome text, cooldown_seconds float8,
 *					   effective_rate float8, breaker text)
 *		What n calls of bucket_observe would do, each endpoint's bucket
 *		locked once, in byte order of the endpoints (the order every batch
 *		of ratebucket locks in), its answers applied in the order given and
 *		its row written once.  Every element is checked before any lock.
 *		One row per element, in the order given (ord from 1).
 */
Datum
ratebucket_observe_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	RbBatchItem *items;
	RbResponse *responses;
	RbObservation *obs;
	RbResponse *group;
	RbObservation *out;
	bool	   *found;
	int			n = rb_batch_read(fcinfo, &items, &responses);

	obs = palloc0(sizeof(RbObservation) * Max(n, 1));
	found = palloc0(sizeof(bool) * Max(n, 1));

	/* each endpoint once, its answers in the order given */
	group = palloc(sizeof(RbResponse) * Max(n, 1));
	out = palloc(sizeof(RbObservation) * Max(n, 1));
	for (int i = 0; i < n;)
	{
		int			j = i;
		bool		ok;

		while (j < n && rb_same_endpoint(items[i].endpoint, items[j].endpoint))
		{
			group[j - i] = responses[items[j].ord];
			j++;
		}
		ok = rb_engine_observe_many(items[i].endpoint, group, j - i, out);
		for (int k = i; k < j; k++)
		{
			obs[items[k].ord] = out[k - i];
			found[items[k].ord] = ok;
		}
		i = j;
	}

	InitMaterializedSRF(fcinfo, 0);
	for (int i = 0; i < n; i++)
	{
		Datum		values[5];
		bool		nulls[5];

		values[0] = Int32GetDatum(i + 1);
		nulls[0] = false;
		rb_observation_values(found[i], &obs[i], values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
