/*-------------------------------------------------------------------------
 *
 * headers.c
 *	  SQL-callable header parsers: parse_retry_after and parse_rate_limit,
 *	  and rb_response_from_jsonb for bucket_observe.
 *
 * The parsing itself is the core's (core/headers.h, core/feedback.c); this
 * file only finds the fields in a jsonb object of response headers, as a
 * worker received them, and turns times into seconds from the caller's
 * "at".  The functions are pure given
 * "at": callers pass clock_timestamp() by default, evaluated at the call.
 *
 * Header names match case-insensitively.  A value may be a string or a
 * number; an array is a field sent on several lines: RateLimit and
 * RateLimit-Policy, being lists, combine the lines with ", " (RFC 9110
 * section 5.3), and every other field takes the first.  So do two keys that
 * differ only in case, in jsonb's key order.  A JSON null is an absent field;
 * a boolean or an object is a malformed one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "api/headers.h"
#include "api/result.h"

/* The fields looked for, by their lower-case names. */
typedef enum RbHeaderField
{
	RB_F_RATELIMIT,
	RB_F_POLICY,
	RB_F_RL_LIMIT,
	RB_F_RL_REMAINING,
	RB_F_RL_RESET,
	RB_F_X_LIMIT,
	RB_F_X_REMAINING,
	RB_F_X_RESET,
	RB_F_RETRY_AFTER,
	RB_F_COUNT
} RbHeaderField;

static const char *const rb_field_names[RB_F_COUNT] = {
	"ratelimit",
	"ratelimit-policy",
	"ratelimit-limit",
	"ratelimit-remaining",
	"ratelimit-reset",
	"x-ratelimit-limit",
	"x-ratelimit-remaining",
	"x-ratelimit-reset",
	"retry-after"
};

/* What was found for one field. */
typedef struct RbFieldSlot
{
	bool		present;		/* a value (or a bad one) was given */
	bool		bad;			/* a value was not a string or a number */
	StringInfoData value;		/* the value; lines of a list joined */
} RbFieldSlot;

/* What one JSON value is, as a header value. */
typedef enum RbJsonText
{
	RB_JT_NONE,					/* null: no value */
	RB_JT_TEXT,					/* a string or a number */
	RB_JT_BAD					/* a boolean, an array or an object */
} RbJsonText;

PG_FUNCTION_INFO_V1(ratebucket_parse_retry_after);
PG_FUNCTION_INFO_V1(ratebucket_parse_rate_limit);

/*
 * rb_unix_from_timestamptz
 *		Unix seconds of a TimestampTz (microseconds since 2000-01-01 UTC).
 */
double
rb_unix_from_timestamptz(TimestampTz ts)
{
	return (double) ts / USECS_PER_SEC +
		(double) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

/*
 * rb_seconds_until
 *		Seconds from "at" until the Unix time unix_seconds, negative if that
 *		time is before "at".
 *
 * Computed in microseconds from 2000, where both are exact for any date of
 * the next few centuries, so that a date 30 seconds after "at" gives 30,
 * not 29.999999762.
 */
double
rb_seconds_until(double unix_seconds, TimestampTz at)
{
	double		pg_usecs;

	pg_usecs = (unix_seconds -
				(double) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY) *
		USECS_PER_SEC;
	return (pg_usecs - (double) at) / USECS_PER_SEC;
}

/*
 * rb_arg_at
 *		Fetch argument "argno" as the reference time: not NULL, finite.
 */
static TimestampTz
rb_arg_at(FunctionCallInfo fcinfo, int argno)
{
	TimestampTz at;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("at must not be null")));
	at = PG_GETARG_TIMESTAMPTZ(argno);
	if (TIMESTAMP_NOT_FINITE(at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("at must be a finite timestamp")));
	return at;
}

/*
 * rb_json_text
 *		A scalar JSON value as header text: a string as it is, a number as
 *		numeric_out writes it (never with an exponent).
 */
static RbJsonText
rb_json_text(JsonbValue *v, const char **s, int *len)
{
	switch (v->type)
	{
		case jbvNull:
			return RB_JT_NONE;
		case jbvString:
			*s = v->val.string.val;
			*len = v->val.string.len;
			return RB_JT_TEXT;
		case jbvNumeric:
			*s = DatumGetCString(DirectFunctionCall1(numeric_out,
													 NumericGetDatum(v->val.numeric)));
			*len = strlen(*s);
			return RB_JT_TEXT;
		default:
			return RB_JT_BAD;
	}
}

/* True if (s, len) holds nothing but SP and HTAB. */
static bool
rb_is_blank(const char *s, int len)
{
	int			i;

	for (i = 0; i < len; i++)
	{
		if (s[i] != ' ' && s[i] != '\t')
			return false;
	}
	return true;
}

/*
 * rb_slot_add_line
 *		Add one field line to a slot: a list field appends it after ", ", any
 *		other field keeps only the first line it is given.  Blank lines add
 *		nothing to a list.
 */
static void
rb_slot_add_line(RbFieldSlot *slot, bool is_list, JsonbValue *v)
{
	const char *s = NULL;
	int			len = 0;

	switch (rb_json_text(v, &s, &len))
	{
		case RB_JT_NONE:
			return;
		case RB_JT_BAD:
			if (!slot->present || is_list)
				slot->bad = true;
			slot->present = true;
			return;
		case RB_JT_TEXT:
			break;
	}
	if (!is_list)
	{
		if (!slot->present)
			appendBinaryStringInfo(&slot->value, s, len);
	}
	else if (!rb_is_blank(s, len))
	{
		if (slot->value.len > 0)
			appendStringInfoString(&slot->value, ", ");
		appendBinaryStringInfo(&slot->value, s, len);
	}
	slot->present = true;
}

/*
 * rb_slot_add_value
 *		Add the value of a header key to its slot: an array is one line per
 *		element (only the first matters to a field that is not a list), any
 *		other value one line.  An object is a malformed value.
 */
static void
rb_slot_add_value(RbFieldSlot *slot, bool is_list, JsonbValue *v)
{
	if (v->type == jbvBinary && JsonContainerIsArray(v->val.binary.data))
	{
		JsonbContainer *array = v->val.binary.data;
		uint32		n = JsonContainerSize(array);
		uint32		i;

		if (!is_list && n > 1)
			n = 1;
		for (i = 0; i < n; i++)
		{
			JsonbValue *elem = getIthJsonbValueFromContainer(array, i);

			rb_slot_add_line(slot, is_list, elem);
		}
	}
	else
		rb_slot_add_line(slot, is_list, v);
}

/*
 * rb_slot_use
 *		Point (*s, *len) at the text to parse for a slot: NULL if the field
 *		is absent, or if its value was neither a string nor a number (*bad).
 */
static void
rb_slot_use(RbFieldSlot *slot, const char **s, size_t *len, bool *bad)
{
	*s = NULL;
	*len = 0;
	*bad = slot->present && slot->bad;
	if (!slot->present || slot->bad)
		return;
	*s = slot->value.data;
	*len = slot->value.len;
}

/* Gather the values of the fields looked for, from the keys of "headers". */
static void
rb_slots_from_jsonb(Jsonb *headers, RbFieldSlot *slots)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		const char *key;
		int			key_len;
		int			f;

		if (tok != WJB_KEY)
			continue;
		key = v.val.string.val;
		key_len = v.val.string.len;
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);
		for (f = 0; f < RB_F_COUNT; f++)
		{
			if (key_len == (int) strlen(rb_field_names[f]) &&
				pg_strncasecmp(key, rb_field_names[f], key_len) == 0)
			{
				rb_slot_add_value(&slots[f],
								  f == RB_F_RATELIMIT || f == RB_F_POLICY,
								  &v);
				break;
			}
		}
	}
}

/*
 * rb_response_from_jsonb
 *		Find the rate-limit fields and Retry-After in a jsonb object of
 *		response headers, as the text the core's parsers read
 *		(core/feedback.h, RbResponse); status is left alone.  The text lives
 *		in the current memory context.
 *
 * RateLimit-Limit, -Remaining and -Reset (drafts -00 to -06) are read
 * only when the X-RateLimit- field of the same meaning is absent.  A field
 * given, but neither as a string nor as a number, counts in bad_fields (or
 * sets retry_after_bad).  headers NULL is no headers at all.
 */
void
rb_response_from_jsonb(Jsonb *headers, RbResponse *response)
{
	RbFieldSlot slots[RB_F_COUNT];
	RbHeaderField limit_field;
	RbHeaderField remaining_field;
	RbHeaderField reset_field;
	bool		bad;
	int			i;

	response->ratelimit = response->policy = response->limit = NULL;
	response->remaining = response->reset = response->retry_after = NULL;
	response->ratelimit_len = response->policy_len = response->limit_len = 0;
	response->remaining_len = response->reset_len = response->retry_after_len = 0;
	response->retry_after_bad = false;
	response->bad_fields = 0;
	response->sent_at = RB_NO_TIME;
	if (headers == NULL)
		return;
	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("Pass the response headers as {\"name\": \"value\", ...}.")));

	for (i = 0; i < RB_F_COUNT; i++)
	{
		slots[i].present = false;
		slots[i].bad = false;
		initStringInfo(&slots[i].value);
	}

	rb_slots_from_jsonb(headers, slots);

	limit_field = slots[RB_F_X_LIMIT].present ? RB_F_X_LIMIT : RB_F_RL_LIMIT;
	remaining_field = slots[RB_F_X_REMAINING].present ?
		RB_F_X_REMAINING : RB_F_RL_REMAINING;
	reset_field = slots[RB_F_X_RESET].present ? RB_F_X_RESET : RB_F_RL_RESET;

	rb_slot_use(&slots[RB_F_RATELIMIT], &response->ratelimit,
				&response->ratelimit_len, &bad);
	response->bad_fields += bad;
	rb_slot_use(&slots[RB_F_POLICY], &response->policy,
				&response->policy_len, &bad);
	response->bad_fields += bad;
	rb_slot_use(&slots[limit_field], &response->limit,
				&response->limit_len, &bad);
	response->bad_fields += bad;
	rb_slot_use(&slots[remaining_field], &response->remaining,
				&response->remaining_len, &bad);
	response->bad_fields += bad;
	rb_slot_use(&slots[reset_field], &response->reset,
				&response->reset_len, &bad);
	response->bad_fields += bad;
	rb_slot_use(&slots[RB_F_RETRY_AFTER], &response->retry_after,
				&response->retry_after_len, &response->retry_after_bad);
}

/*
 * parse_retry_after(value text, at timestamptz) returns float8
 *		Seconds from "at" until a Retry-After value says to retry: the delay,
 *		or the date minus "at" (negative for a date before "at").  NULL when
 *		the value is NULL, blank or malformed.
 */
Datum
ratebucket_parse_retry_after(PG_FUNCTION_ARGS)
{
	TimestampTz at = rb_arg_at(fcinfo, 1);
	text	   *value;
	double		v = 0.0;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	value = PG_GETARG_TEXT_PP(0);
	switch (rb_parse_retry_after_at(VARDATA_ANY(value),
									VARSIZE_ANY_EXHDR(value),
									rb_unix_from_timestamptz(at), &v))
	{
		case RB_RA_DELAY:
			PG_RETURN_FLOAT8(v);
		case RB_RA_DATE:
			PG_RETURN_FLOAT8(rb_seconds_until(v, at));
		case RB_RA_ABSENT:
		case RB_RA_MALFORMED:
			break;
	}
	PG_RETURN_NULL();
}

/*
 * parse_rate_limit(headers jsonb, at timestamptz) returns record
 *		("limit", window_seconds, remaining, reset_seconds,
 *		 retry_after_seconds, malformed)
 *		What a response's headers say about the destination's rate limit,
 *		as received at "at".  Each column is NULL when no field gave it;
 *		malformed counts the fields given that could not be parsed,
 *		Retry-After included.  NULL headers give NULLs and malformed 0.
 */
Datum
ratebucket_parse_rate_limit(PG_FUNCTION_ARGS)
{
	TimestampTz at = rb_arg_at(fcinfo, 1);
	TupleDesc	tupdesc;
	Datum		values[6];
	bool		nulls[6];
	RbRateLimit rl;
	RbRetryAfterKind ra_kind = RB_RA_ABSENT;
	double		ra_value = 0.0;
	RbResponse	response;

	tupdesc = rb_result_tupdesc(fcinfo);

	memset(&rl, 0, sizeof(rl));
	if (!PG_ARGISNULL(0))
	{
		rb_response_from_jsonb(PG_GETARG_JSONB_P(0), &response);
		rb_read_response(&response, rb_unix_from_timestamptz(at),
						 &rl, &ra_kind, &ra_value);
	}

	values[0] = Float8GetDatum(rl.limit);
	nulls[0] = !rl.has_limit;
	values[1] = Float8GetDatum(rl.window_seconds);
	nulls[1] = !rl.has_window;
	values[2] = Float8GetDatum(rl.remaining);
	nulls[2] = !rl.has_remaining;
	values[3] = Float8GetDatum(rl.reset_seconds);
	nulls[3] = !rl.has_reset;
	values[4] = (Datum) 0;
	nulls[4] = true;
	if (ra_kind == RB_RA_DELAY)
	{
		values[4] = Float8GetDatum(ra_value);
		nulls[4] = false;
	}
	else if (ra_kind == RB_RA_DATE)
	{
		values[4] = Float8GetDatum(rb_seconds_until(ra_value, at));
		nulls[4] = false;
	}
	values[5] = Int32GetDatum(rl.malformed);
	nulls[5] = false;

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
