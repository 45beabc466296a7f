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
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/jsonb.h"

#include "api/args.h"
#include "api/headers.h"
#include "api/result.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_observe);

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
	RbResponse	response;
	RbObservation obs;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	response.has_status = !PG_ARGISNULL(1);
	response.status = response.has_status ? PG_GETARG_INT32(1) : 0;
	if (response.has_status && response.status != 0 &&
		(response.status < 100 || response.status > 999))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status %d is not an HTTP status code", response.status),
				 errhint("Pass 0 or NULL when no response arrived (a connection failure or a timeout).")));
	if (headers != NULL && !JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
	tupdesc = rb_result_tupdesc(fcinfo);

	rb_response_from_jsonb(headers, &response);
	if (PG_NARGS() > 4 && !PG_ARGISNULL(4))
	{
		TimestampTz sent_at = PG_GETARG_TIMESTAMPTZ(4);

		if (TIMESTAMP_NOT_FINITE(sent_at))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("sent_at must be a finite time"),
					 errhint("Pass when the request was sent, or NULL if that is not known.")));
		response.sent_at = sent_at;
	}
	if (!PG_ARGISNULL(2))
	{
		text	   *ra = PG_GETARG_TEXT_PP(2);

		/* the argument wins over a Retry-After in headers */
		response.retry_after = VARDATA_ANY(ra);
		response.retry_after_len = VARSIZE_ANY_EXHDR(ra);
		response.retry_after_bad = false;
	}

	if (!rb_engine_observe(endpoint, &response, &obs))
	{
		/* no bucket: nothing to adapt */
		values[0] = CStringGetTextDatum(rb_outcome_name(obs.outcome));
		values[1] = Float8GetDatum(0.0);
		nulls[2] = nulls[3] = true;
	}
	else
	{
		values[0] = CStringGetTextDatum(rb_outcome_name(obs.outcome));
		values[1] = Float8GetDatum(obs.cooldown_seconds);
		values[2] = Float8GetDatum(obs.effective_rate);
		values[3] = CStringGetTextDatum(rb_breaker_name(obs.breaker));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
