/*-------------------------------------------------------------------------
 *
 * take.c
 *	  SQL-callable takes and peeks: bucket_take and bucket_take_upto (both
 *	  forms of each), bucket_take_all, and the peeks bucket_ready and
 *	  bucket_wait.
 *
 * A calendar quota (bucket_configure_quota) is a bucket too: every take and
 * peek here decides it by rb_quota_take instead of the token arithmetic,
 * so it can be taken alone, in a bucket_take_all with rate buckets, or
 * peeked by a claim.
 *
 * A take locks the endpoint's row, then reads the clock, refills, takes if
 * it can, and writes the row back, all before the caller's transaction ends:
 * every taker of one bucket shares one clock and one order, and a take that
 * rolls back gives its tokens back.  A denied take writes nothing (unless
 * it changes the limits, see rb_decide_take): its refill is a function of
 * time alone and is recomputed by the next reader.
 * A take refused by the committed state of a row that another transaction
 * holds does not even wait for that transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "adapt.h"
#include "arith.h"
#include "quota.h"
#include "ratebucket.h"
#include "storage.h"
#include "stripe.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_take);
PG_FUNCTION_INFO_V1(ratebucket_take_configured);
PG_FUNCTION_INFO_V1(ratebucket_take_upto);
PG_FUNCTION_INFO_V1(ratebucket_take_upto_configured);
PG_FUNCTION_INFO_V1(ratebucket_take_all);
PG_FUNCTION_INFO_V1(ratebucket_ready);
PG_FUNCTION_INFO_V1(ratebucket_wait);

/* Record a grant of "want" tokens at "now" in the row's counters. */
static void
rb_count_grant(RbBucket *bucket, double want, TimestampTz now)
{
	bucket->last_granted_at = now;
	bucket->takes_granted++;
	bucket->tokens_granted += want;
}

/*
 * rb_new_bucket
 *		A bucket seen for the first time: full, refilled at "now".
 */
void
rb_new_bucket(RbBucket *bucket, double rate, double capacity, TimestampTz now)
{
	memset(bucket, 0, sizeof(*bucket));
	ItemPointerSetInvalid(&bucket->tid);
	bucket->rate = rate;
	bucket->capacity = capacity;
	bucket->state.tokens = capacity;
	bucket->state.refilled_at = now;
	rb_adapt_init(&bucket->adapt);
	bucket->conf_rate = get_float8_nan();
	bucket->conf_capacity = get_float8_nan();
	bucket->conf_floor_rate = get_float8_nan();
	bucket->conf_throttle_factor = get_float8_nan();
	bucket->conf_recovery_factor = get_float8_nan();
	bucket->conf_breaker_failures = -1;
	bucket->configured_at = RB_NO_TIME;
	bucket->created_at = now;
	bucket->last_granted_at = RB_NO_TIME;
	bucket->last_status = -1;
	bucket->last_observed_at = RB_NO_TIME;
}

/*
 * The error for a configured take of an endpoint that was not configured;
 * "explicit" says whether the caller has a form taking limits instead.
 */
void
rb_not_configured(text *endpoint, bool explicit)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("endpoint \"%s\" is not configured", text_to_cstring(endpoint)),
			 explicit ?
			 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first, "
					 "or pass rate and capacity to the take.") :
			 errhint("Call ratebucket.bucket_configure(endpoint, rate, capacity) first.")));
}

/*
 * rb_bucket_quota_window
 *		The window of a quota bucket's period and zone that contains "at".
 *		The zone was checked when the quota was configured; one that the
 *		time zone database no longer knows is an error, not a guess.
 */
void
rb_bucket_quota_window(const RbBucket *bucket, TimestampTz at,
					   TimestampTz *start, TimestampTz *end)
{
	RbQuotaPeriod period = rb_quota_period(bucket->quota_period);
	pg_tz	   *tz = rb_quota_zone(bucket->quota_time_zone);

	if (period == RB_QUOTA_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("quota period \"%s\" is not one of %s",
						bucket->quota_period, RB_QUOTA_PERIODS),
				 errhint("Configure the quota again with ratebucket.bucket_configure_quota.")));
	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" not recognized", bucket->quota_time_zone),
				 errhint("Configure the quota again with ratebucket.bucket_configure_quota.")));
	rb_quota_window(period, tz, at, start, end);
}

/*
 * rb_decide
 *		Decide a take from a bucket row at "now" with the take's limits
 *		(rb_decide_take, with the policy in force): of "want" tokens, or with
 *		upto > 0 of as many whole tokens as it can grant up to that many
 *		(rb_decide_take_upto).  Sets *granted to the tokens granted and
 *		*write when the row must be written back; the caller does that, with
 *		the new limits.
 */
static RbTakeResult
rb_decide(RbBucket *bucket, double rate, double capacity, double want,
		  int64 upto, TimestampTz now, bool *write, double *granted)
{
	RbPolicy	policy;
	RbTakeResult result;

	if (rb_is_quota(bucket))
	{
		TimestampTz start;
		TimestampTz end;

		/* a quota: "capacity" is the quota, nothing refills at a rate */
		rb_bucket_policy(bucket, rb_bucket_ceiling(bucket), &policy);
		rb_bucket_quota_window(bucket, Max(now, bucket->state.refilled_at),
							   &start, &end);
		return rb_quota_take(&bucket->state, &bucket->adapt, &policy,
							 capacity, start, end, want, upto, now,
							 write, granted);
	}

	rb_bucket_policy(bucket, rate, &policy);
	if (upto > 0)
	{
		int64		n;

		result = rb_decide_take_upto(&bucket->state, &bucket->adapt, &policy,
									 bucket->rate, bucket->capacity,
									 rate, capacity, upto, now, write, &n);
		*granted = (double) n;
	}
	else
	{
		result = rb_decide_take(&bucket->state, &bucket->adapt, &policy,
								bucket->rate, bucket->capacity,
								rate, capacity, want, now, write);
		*granted = result.allowed ? want : 0.0;
	}
	return result;
}

/*
 * rb_limits_for
 *		The limits a take uses.  The configured form uses the configuration
 *		(false if there is none).  The explicit form uses the call's limits,
 *		but on a configured endpoint they can only tighten the configured
 *		ones: a role allowed to take cannot loosen an operator's limit.
 *		A calendar quota has no rate to tighten: the explicit form is an
 *		error there rather than a silent change of meaning.
 */
static bool
rb_limits_for(const RbBucket *bucket, bool use_config,
			  double *rate, double *capacity)
{
	if (!use_config && rb_is_quota(bucket))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("bucket is a calendar quota (%g per %s, %s): it takes no rate and capacity",
						bucket->conf_capacity, bucket->quota_period,
						bucket->quota_time_zone),
				 errhint("Take from it with bucket_take(endpoint, tokens), bucket_take_upto(endpoint, max_tokens) or bucket_take_all.")));
	if (use_config)
	{
		if (!rb_is_configured(bucket))
			return false;
		*rate = bucket->conf_rate;
		*capacity = bucket->conf_capacity;
	}
	else if (rb_is_configured(bucket))
	{
		*rate = Min(*rate, bucket->conf_rate);
		*capacity = Min(*capacity, bucket->conf_capacity);
	}
	return true;
}

/*
 * RbTakeRequest
 *		What a take asks for: the limits (use_config: those stored by
 *		bucket_configure; otherwise rate and capacity, capped by them), and
 *		either "want" tokens or, with upto > 0, as many whole tokens as the
 *		bucket grants up to that many.  With nowait, a take that would have
 *		to wait for another transaction's row is refused instead (wait 0).
 */
typedef struct RbTakeRequest
{
	bool		use_config;
	double		rate;
	double		capacity;
	double		want;
	int64		upto;
	bool		nowait;			/* never wait for a row another holds */
} RbTakeRequest;

/*
 * rb_decide_request
 *		rb_decide with the request's limits resolved against the row (false,
 *		deciding nothing, if a configured take meets no configuration).
 */
static bool
rb_decide_request(RbBucket *bucket, const RbTakeRequest *req, TimestampTz now,
				  RbTakeResult *result, bool *write, double *granted,
				  double *rate, double *capacity)
{
	*rate = req->rate;
	*capacity = req->capacity;
	if (!rb_limits_for(bucket, req->use_config, rate, capacity))
		return false;
	*result = rb_decide(bucket, *rate, *capacity, req->want, req->upto, now,
						write, granted);
	return true;
}

/*
 * rb_peek_refuses
 *		Does the bucket's last committed state already refuse the take?
 *
 * Used only when another transaction holds the row.  That holder can take
 * tokens away, or change limits; a refusal judged from the state it started
 * from is the answer this take gets when ordered before it, so there is no
 * point queueing behind the holder's commit for it.  Anything else (enough
 * tokens, no configuration, a take larger than the configured capacity) is
 * decided under the lock, after waiting.
 */
static bool
rb_peek_refuses(RbBucket *peeked, const RbTakeRequest *req,
				RbTakeResult *result)
{
	bool		write;
	double		granted;
	double		rate;
	double		capacity;

	if (!rb_decide_request(peeked, req, GetCurrentTimestamp(), result, &write,
						   &granted, &rate, &capacity))
		return false;
	if (req->upto > 0 ? capacity < 1.0 : req->want > capacity)
		return false;			/* an error, raised under the lock */
	return !result->allowed;
}

/* A take must fit the capacity: "want", or one whole token for an upto. */
static void
rb_check_request_fits(const RbTakeRequest *req, double capacity)
{
	if (req->upto > 0 && capacity < 1.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capacity (%g) is less than one token", capacity),
				 errdetail("bucket_take_upto grants whole tokens only.")));
	rb_check_tokens_fit(req->want, capacity);
}

/*
 * rb_take_peeked
 *		The usual take, on a row just read by rb_storage_peek (without a
 *		lock): read the clock, decide, and write only if no other
 *		transaction has touched the row since it was read
 *		(rb_storage_update_unchanged).  Then no write came between our read
 *		and ours, and none can come before we commit: the take is the one it
 *		would have been under the lock, with one row operation instead of
 *		two.  A refusal writes nothing and locks nothing, so its answer is
 *		the one a take ordered before any holder's commit gets (see
 *		rb_peek_refuses).
 *
 *		Returns false, having written nothing, when the take must go the
 *		locked way: the row was held or written meanwhile, or the limits or
 *		the request need the checks made under the lock.
 */
static bool
rb_take_peeked(RbBucket *bucket, const RbTakeRequest *req,
			   RbTakeResult *result, double *granted)
{
	TimestampTz now;
	bool		write;
	double		rate;
	double		capacity;

	now = GetCurrentTimestamp();
	if (!rb_decide_request(bucket, req, now, result, &write, granted,
						   &rate, &capacity))
		return false;
	if (req->upto > 0 ? capacity < 1.0 : req->want > capacity)
		return false;			/* an error, raised under the lock */
	if (!write)
		return true;			/* a refusal, or a take that changes nothing */

	bucket->rate = rate;
	bucket->capacity = capacity;
	if (result->allowed)
		rb_count_grant(bucket, *granted, now);
	return rb_storage_update_unchanged(bucket);
}

/*
 * rb_take_optimistic
 *		rb_take_peeked of the endpoint's row.  Returns false, having written
 *		nothing, when the row is missing or the take must go the locked way;
 *		then *striped says whether the row is that of a striped endpoint.
 */
static bool
rb_take_optimistic(text *endpoint, const RbTakeRequest *req,
				   RbTakeResult *result, double *granted, bool *striped)
{
	RbBucket	bucket;

	*striped = false;
	if (!rb_storage_peek(endpoint, &bucket))
		return false;
	if (rb_is_stripe_parent(&bucket))
	{
		*striped = true;
		return false;
	}
	return rb_take_peeked(&bucket, req, result, granted);
}

/*
 * rb_take_stripe
 *		rb_take_request's decision on one stripe its caller has locked, of an
 *		endpoint striped over k: the request's limits were already divided by
 *		k, and the take must fit in one stripe.
 */
static void
rb_take_stripe(text *endpoint, int k, RbBucket *stripe,
			   const RbTakeRequest *req, RbTakeResult *result, double *granted)
{
	TimestampTz now = GetCurrentTimestamp();
	double		rate = req->rate;
	double		capacity = req->capacity;
	bool		write;

	if (!rb_limits_for(stripe, req->use_config, &rate, &capacity))
		elog(ERROR, "a stripe of endpoint \"%s\" has no configuration",
			 text_to_cstring(endpoint));
	if (req->upto > 0 ? capacity < 1.0 : req->want > capacity)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a take of %g tokens does not fit in one stripe of endpoint \"%s\"",
						req->upto > 0 ? 1.0 : req->want, text_to_cstring(endpoint)),
				 errdetail("The endpoint is striped over %d stripes of %g tokens each, and a take is granted by one stripe.",
						   k, capacity),
				 errhint("Take at most %g tokens at once, or use fewer stripes (ratebucket.bucket_stripe).",
						 floor(capacity))));

	*result = rb_decide(stripe, rate, capacity, req->want, req->upto, now,
						&write, granted);
	if (write)
	{
		stripe->rate = rate;
		stripe->capacity = capacity;
		if (result->allowed)
			rb_count_grant(stripe, *granted, now);
		rb_storage_update(stripe);
	}
}

/*
 * rb_take_striped
 *		A take of an endpoint striped over k stripes (see stripe.c).
 *
 * Starting at the stripe that last granted to this backend, each stripe is
 * read without a lock and taken from optimistically (rb_take_peeked): a
 * stripe whose committed state refuses is passed over, holding nothing; one
 * that grants is written if nobody touched it since the read.  If somebody
 * did, the stripe is locked, unless another transaction holds it (then it
 * is skipped), and the take is decided under the lock.  The first stripe
 * that grants ends the take.  If a stripe refused, and none granted, the
 * take is refused with the shortest wait; if every stripe that could grant
 * was held by another transaction, the take waits for the first of them.
 * Returns false, having changed nothing, if the stripes are not there (k is
 * out of date).
 */
static bool
rb_take_striped(text *endpoint, int k, const RbTakeRequest *req,
				RbTakeResult *result, double *granted)
{
	RbTakeRequest sreq = *req;
	int			start = rb_stripe_start(k);
	bool		refused = false;
	int			held = -1;
	RbTakeResult best = {false, 0.0, 0.0};
	RbBucket	stripe;
	int			j;

	if (!req->use_config)
	{
		sreq.rate = req->rate / k;
		sreq.capacity = req->capacity / k;
	}

	for (j = 0; j < k; j++)
	{
		int			s = (start + j) % k;
		text	   *key = rb_stripe_key(endpoint, s, k);

		if (!rb_storage_peek(key, &stripe))
		{
			pfree(key);
			continue;			/* restriped meanwhile */
		}
		if (!rb_take_peeked(&stripe, &sreq, result, granted))
		{
			/* written or held since the read: the locked way */
			if (!rb_storage_lock_skip(key, &stripe))
			{
				if (held < 0)
					held = s;
				pfree(key);
				continue;
			}
			rb_take_stripe(endpoint, k, &stripe, &sreq, result, granted);
		}
		pfree(key);
		if (result->allowed)
		{
			rb_stripe_used(s);
			return true;
		}
		if (!refused || result->wait_seconds < best.wait_seconds)
			best = *result;
		refused = true;
	}
	if (refused)
	{
		*result = best;
		*granted = 0.0;
		return true;
	}
	if (held < 0)
		return false;

	/* Every stripe that could grant is held by another transaction. */
	if (req->nowait)
	{
		result->allowed = false;
		result->remaining = 0.0;
		result->wait_seconds = 0.0;
		*granted = 0.0;
		return true;
	}
	if (!rb_storage_lock(rb_stripe_key(endpoint, held, k), &stripe))
		return false;
	rb_take_stripe(endpoint, k, &stripe, &sreq, result, granted);
	if (result->allowed)
		rb_stripe_used(held);
	return true;
}

/*
 * rb_take_striped_now
 *		rb_take_striped for an endpoint whose row says it is striped: with
 *		its stripe count as committed.
 */
static RbTakeResult
rb_take_striped_now(text *endpoint, const RbTakeRequest *req, double *granted)
{
	RbTakeResult result;
	int			k = rb_stripe_lookup(endpoint);

	if (k < 2 || !rb_take_striped(endpoint, k, req, &result, granted))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not take from endpoint \"%s\": its stripes changed concurrently",
						text_to_cstring(endpoint)),
				 errhint("Retry the transaction.")));
	return result;
}

/*
 * rb_take_request
 *		The take itself.  Sets *granted to the tokens granted (0 if refused).
 *
 * First optimistically (rb_take_optimistic).  Otherwise: lock the row
 * (skipping it if another transaction holds it), read the clock, decide,
 * write.  If the row is held, a take its committed state already refuses
 * returns at once; any other waits for the holder.  A missing row is
 * created full, unless use_config.
 */
static RbTakeResult
rb_take_request(text *endpoint, const RbTakeRequest *req, double *granted)
{
	RbStorageSession session;
	RbBucket	bucket;
	RbTakeResult result;
	TimestampTz now;
	bool		write;
	double		rate;
	double		capacity;
	int			k;
	bool		striped;

	rb_storage_begin(&session);

	/* A striped endpoint this backend has met: straight to its stripes. */
	k = rb_stripe_cached(endpoint);
	if (k > 1)
	{
		if (rb_take_striped(endpoint, k, req, &result, granted))
		{
			rb_storage_end(&session);
			return result;
		}
		rb_stripe_forget(endpoint);
	}

	if (rb_take_optimistic(endpoint, req, &result, granted, &striped))
	{
		rb_storage_end(&session);
		return result;
	}
	if (striped)
	{
		result = rb_take_striped_now(endpoint, req, granted);
		rb_storage_end(&session);
		return result;
	}

	if (!rb_storage_lock_skip(endpoint, &bucket))
	{
		RbBucket	peeked;
		bool		exists = rb_storage_peek(endpoint, &peeked);

		if (exists && rb_is_stripe_parent(&peeked))
		{
			result = rb_take_striped_now(endpoint, req, granted);
			rb_storage_end(&session);
			return result;
		}
		if (exists && rb_peek_refuses(&peeked, req, &result))
		{
			rb_storage_end(&session);
			*granted = 0.0;
			return result;
		}

		if (exists && req->nowait)
		{
			/* held by another transaction: refused, not waited for */
			rb_storage_end(&session);
			*granted = 0.0;
			result.allowed = false;
			result.remaining = 0.0;
			result.wait_seconds = 0.0;
			return result;
		}
		if (req->use_config)
		{
			if (!exists || !rb_storage_lock(endpoint, &bucket))
				rb_not_configured(endpoint, true);
		}
		else
		{
			RbBucket	fresh;

			/* this clock is used only if the row is new: no lock to wait on */
			now = GetCurrentTimestamp();
			rb_new_bucket(&fresh, req->rate, req->capacity, now);
			result = rb_decide(&fresh, req->rate, req->capacity, req->want,
							   req->upto, now, &write, granted);
			Assert(result.allowed);
			rb_count_grant(&fresh, *granted, now);
			if (!rb_storage_lock_or_insert(endpoint, &bucket, &fresh))
			{
				rb_storage_end(&session);
				return result;
			}
		}
	}

	/* The endpoint's row, of a bucket striped since this backend last met it */
	if (rb_is_stripe_parent(&bucket))
	{
		result = rb_take_striped_now(endpoint, req, granted);
		rb_storage_end(&session);
		return result;
	}

	/* We hold the row lock: only now read the clock. */
	now = GetCurrentTimestamp();

	rate = req->rate;
	capacity = req->capacity;
	if (!rb_limits_for(&bucket, req->use_config, &rate, &capacity))
		rb_not_configured(endpoint, true);
	rb_check_request_fits(req, capacity);

	result = rb_decide(&bucket, rate, capacity, req->want, req->upto, now,
					   &write, granted);
	if (write)
	{
		bucket.rate = rate;
		bucket.capacity = capacity;
		if (result.allowed)
			rb_count_grant(&bucket, *granted, now);
		rb_storage_update(&bucket);
	}

	rb_storage_end(&session);
	return result;
}

/*
 * rb_take_result_datum
 *		Build the (allowed, remaining, wait_seconds) record.
 */
static Datum
rb_take_result_datum(FunctionCallInfo fcinfo, const RbTakeResult *result)
{
	TupleDesc	tupdesc = rb_result_tupdesc(fcinfo);
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	values[0] = BoolGetDatum(result->allowed);
	values[1] = Float8GetDatum(result->remaining);
	values[2] = Float8GetDatum(result->wait_seconds);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * rb_upto_result_datum
 *		Build the (granted, remaining, wait_seconds) record.
 */
static Datum
rb_upto_result_datum(FunctionCallInfo fcinfo, const RbTakeResult *result,
					 double granted)
{
	TupleDesc	tupdesc = rb_result_tupdesc(fcinfo);
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
	result = rb_take_request(endpoint, &req, &granted);
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
	result = rb_take_request(endpoint, &req, &granted);
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
	result = rb_take_request(endpoint, &req, &granted);
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
	result = rb_take_request(endpoint, &req, &granted);
	PG_RETURN_DATUM(rb_upto_result_datum(fcinfo, &result, granted));
}

/*
 * rb_take_upto_held
 *		A take of up to "upto" whole tokens (upto >= 1) from a configured
 *		bucket whose row the caller holds, decided at "now" with its
 *		configuration, on the RbBucket in memory: its state is what the take
 *		leaves, its counters count the grant, and the caller writes it back
 *		(rb_storage_update).  Called twice at the same "now", the second take
 *		finds what the first left.  Sets *granted; an endpoint without a
 *		configuration, or of less than one token of capacity, is an error.
 */
RbTakeResult
rb_take_upto_held(RbBucket *bucket, text *endpoint, int64 upto,
				  TimestampTz now, int64 *granted)
{
	RbTakeRequest req = {true, 0.0, 0.0, 0.0, 0, false};
	RbTakeResult result;
	double		rate = 0.0;
	double		capacity = 0.0;
	double		g;
	bool		write;

	Assert(upto >= 1);
	req.upto = upto;
	if (!rb_limits_for(bucket, true, &rate, &capacity))
		rb_not_configured(endpoint, false);
	rb_check_request_fits(&req, capacity);
	result = rb_decide(bucket, rate, capacity, 1.0, upto, now, &write, &g);
	if (result.allowed && g > 0)
	{
		bucket->rate = rate;
		bucket->capacity = capacity;
		rb_count_grant(bucket, g, now);
	}
	*granted = result.allowed ? (int64) g : 0;
	return result;
}

/*
 * rb_take_upto_configured
 *		bucket_take_upto(endpoint, max_tokens) from C, striped endpoints
 *		included, in a storage session of its own.  Sets *granted.  With
 *		nowait, a take that would wait for another transaction's row (every
 *		stripe that could grant held) is refused instead, with wait 0.
 */
RbTakeResult
rb_take_upto_configured(text *endpoint, int64 upto, bool nowait, int64 *granted)
{
	RbTakeRequest req = {true, 0.0, 0.0, 0.0, 0, false};
	RbTakeResult result;
	double		g;

	req.upto = upto;
	req.nowait = nowait;
	result = rb_take_request(endpoint, &req, &g);
	*granted = (int64) g;
	return result;
}

/* Most buckets one bucket_take_all may name. */
#define RB_MAX_TAKE_ALL 64

/* One bucket of a bucket_take_all. */
typedef struct RbAllItem
{
	text	   *endpoint;
	char	   *key;			/* endpoint as a C string: the lock order */
	int			pos;			/* where the caller named it */
	double		want;
	RbBucket	bucket;			/* the row, then what the take leaves */
	RbTakeResult result;
} RbAllItem;

static int
rb_all_item_cmp(const void *a, const void *b)
{
	return strcmp(((const RbAllItem *) a)->key, ((const RbAllItem *) b)->key);
}

/*
 * rb_all_items
 *		The buckets a bucket_take_all names, checked, in lock order: the
 *		endpoints' bytes, the same order for every caller whatever order they
 *		named them in, so that two takers of the same buckets cannot
 *		deadlock.  Sets *n.
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

	qsort(items, count, sizeof(RbAllItem), rb_all_item_cmp);
	for (i = 1; i < count; i++)
		if (strcmp(items[i - 1].key, items[i].key) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("endpoint \"%s\" is named twice", items[i].key),
					 errhint("Take the sum of its tokens once.")));
	*n = count;
	return items;
}

/*
 * bucket_take_all(endpoints text[], tokens float8[]) returns
 *		(allowed boolean, wait_seconds float8, remaining float8[])
 *		Take from several configured buckets at once, all or nothing.
 *
 * Every row is locked first, in lock order (waiting for holders), then the
 * clock is read once and each bucket decides its take as bucket_take would.
 * If all grant, every row is written; if one refuses, none is, and
 * wait_seconds is the longest of the refusals' waits: the time until all of
 * them could grant, each refilling on its own.  remaining is per endpoint,
 * in the caller's order: what each holds after the take (or, refused, now).
 */
Datum
ratebucket_take_all(PG_FUNCTION_ARGS)
{
	int			n;
	RbAllItem  *items = rb_all_items(fcinfo, &n);
	RbStorageSession session;
	TimestampTz now;
	bool		allowed = true;
	double		wait = 0.0;
	Datum	   *remaining;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			i;

	PreventCommandIfReadOnly("bucket_take_all");

	rb_storage_begin(&session);
	for (i = 0; i < n; i++)
	{
		if (!rb_storage_lock(items[i].endpoint, &items[i].bucket))
			rb_not_configured(items[i].endpoint, false);
		if (rb_is_stripe_parent(&items[i].bucket))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("bucket_take_all cannot take from striped endpoint \"%s\"",
							items[i].key),
					 errhint("Take from a striped endpoint with bucket_take, or put it back in one row with ratebucket.bucket_stripe(endpoint, 1).")));
	}

	/* Every row is held: only now read the clock, once for all. */
	now = GetCurrentTimestamp();

	for (i = 0; i < n; i++)
	{
		RbAllItem  *it = &items[i];
		double		rate = 0.0;
		double		capacity = 0.0;
		double		granted;
		bool		write;

		if (!rb_limits_for(&it->bucket, true, &rate, &capacity))
			rb_not_configured(it->endpoint, false);
		rb_check_tokens_fit(it->want, capacity);
		it->result = rb_decide(&it->bucket, rate, capacity, it->want, 0, now,
							   &write, &granted);
		if (!it->result.allowed)
		{
			allowed = false;
			wait = Max(wait, it->result.wait_seconds);
		}
	}

	for (i = 0; i < n; i++)
	{
		RbAllItem  *it = &items[i];

		if (allowed)
		{
			it->bucket.rate = it->bucket.conf_rate;
			it->bucket.capacity = it->bucket.conf_capacity;
			rb_count_grant(&it->bucket, it->want, now);
			rb_storage_update(&it->bucket);
		}
		else if (it->result.allowed)
			it->result.remaining += it->want;	/* not taken after all */
	}
	rb_storage_end(&session);

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

/* rb_peek_take's decision on one row, with the limits it stores. */
static RbTakeResult
rb_peek_row(RbBucket *bucket, double want, int64 upto, TimestampTz now,
			double *granted)
{
	bool		configured = rb_is_configured(bucket);
	bool		write;

	return rb_decide(bucket,
					 configured ? bucket->conf_rate : bucket->rate,
					 configured ? bucket->conf_capacity : bucket->capacity,
					 want, upto, now, &write, granted);
}

/*
 * rb_peek_striped
 *		rb_peek_take of a striped endpoint: what the best of its stripes
 *		would answer, since a take tries every stripe.  Granted if one
 *		grants (as many as the best grants); else refused with the shortest
 *		wait.
 */
static RbTakeResult
rb_peek_striped(text *endpoint, double want, int64 upto, double *granted)
{
	RbTakeResult best = {false, 0.0, 0.0};
	TimestampTz now = GetCurrentTimestamp();
	int			attempt;

	*granted = 0.0;
	for (attempt = 0; attempt < 2; attempt++)
	{
		int			k = attempt == 0 ? rb_stripe_cached(endpoint) : 0;
		int			seen = 0;
		int			s;

		if (k < 2)
			k = rb_stripe_lookup(endpoint);
		for (s = 0; s < k; s++)
		{
			RbBucket	stripe;
			RbTakeResult r;
			double		g;

			if (!rb_storage_peek(rb_stripe_key(endpoint, s, k), &stripe))
				continue;
			r = rb_peek_row(&stripe, want, upto, now, &g);
			if (seen++ == 0 ||
				(r.allowed && (!best.allowed || g > *granted)) ||
				(!r.allowed && !best.allowed && r.wait_seconds < best.wait_seconds))
			{
				best = r;
				*granted = r.allowed ? g : 0.0;
			}
		}
		if (seen > 0)
			return best;
		rb_stripe_forget(endpoint);
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not read endpoint \"%s\": its stripes changed concurrently",
					text_to_cstring(endpoint)),
			 errhint("Retry the transaction.")));
	return best;				/* keep the compiler quiet */
}

/*
 * rb_peek_take
 *		What a take would be told now, judged from the last committed row
 *		with the limits it stores (its configuration, if it has one),
 *		including a cooldown, a pause or an open breaker, without locking:
 *		a take of "want" tokens, or with upto > 0 of as many whole tokens as
 *		it would grant up to that many (*granted).  An unknown endpoint's
 *		bucket would start full: granted, all of it.
 */
static RbTakeResult
rb_peek_take(text *endpoint, double want, int64 upto, double *granted)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;
	RbTakeResult result = {true, 0.0, 0.0};

	rb_storage_begin_peek(&session);
	found = rb_storage_peek(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
	{
		result = rb_peek_striped(endpoint, want, upto, granted);
		rb_storage_end(&session);
		return result;
	}
	rb_storage_end(&session);

	*granted = upto > 0 ? (double) upto : want;
	if (found)
		result = rb_peek_row(&bucket, want, upto, GetCurrentTimestamp(),
							 granted);
	return result;
}

/*
 * rb_peek_grantable
 *		How many whole tokens, up to "upto", would a take of the endpoint be
 *		granted now?  The peek of rb_peek_take, for bucket_claimable.
 */
int64
rb_peek_grantable(text *endpoint, int64 upto)
{
	double		granted;

	(void) rb_peek_take(endpoint, 1.0, upto, &granted);
	return (int64) granted;
}

/*
 * rb_peek_grantable_configured
 *		rb_peek_grantable of a configured bucket: false, setting nothing, if
 *		the endpoint has no row or no configuration (a take would be an
 *		error, not a grant).  For bucket_grantable.
 */
bool
rb_peek_grantable_configured(text *endpoint, int64 upto, int64 *granted)
{
	RbStorageSession session;
	RbBucket	bucket;
	bool		found;
	double		g = 0.0;

	rb_storage_begin_peek(&session);
	found = rb_storage_peek(endpoint, &bucket);
	if (found && rb_is_stripe_parent(&bucket))
	{
		(void) rb_peek_striped(endpoint, 1.0, upto, &g);
		rb_storage_end(&session);
		*granted = (int64) g;
		return true;
	}
	rb_storage_end(&session);

	if (!found || !rb_is_configured(&bucket))
		return false;
	(void) rb_peek_row(&bucket, 1.0, upto, GetCurrentTimestamp(), &g);
	*granted = (int64) g;
	return true;
}

/*
 * bucket_ready(endpoint text, tokens float8) returns boolean
 *		Would a take of "tokens" be granted now?  A peek (rb_peek_take) for a
 *		claim's WHERE clause, which the take itself then confirms.
 */
Datum
ratebucket_ready(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	double		want = rb_arg_tokens(fcinfo, 1);
	double		granted;

	PG_RETURN_BOOL(rb_peek_take(endpoint, want, 0, &granted).allowed);
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
	RbTakeResult result = rb_peek_take(endpoint, want, 0, &granted);

	PG_RETURN_FLOAT8(result.allowed ? 0.0 : result.wait_seconds);
}
