/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  bucket_take_batch: the grants of a claimed batch whose events answer
 *	  to several limits each (their endpoint, their account's rate, a lane,
 *	  a daily quota, an in-flight cap), in one call.
 *
 * A request is one group of events of a claim: the buckets every one of
 * them takes a token from, how many events there are, and optionally the
 * in-flight cap each holds a slot of.  Requests share buckets (two endpoints
 * of one account), so they cannot be granted one bucket_take_all at a time
 * without locking rows in an order no other taker follows.  Instead:
 *
 *   1. Every bucket named anywhere in the batch is locked, once, in the byte
 *      order of its key: the order bucket_take_all and the claim recipe lock
 *      in, so none of them can deadlock with another.
 *   2. The clock is read once.  The requests are granted in the order given,
 *      each as many whole tokens as every one of its buckets still holds
 *      after the requests before it, up to what it asked (decided in memory:
 *      nothing is written yet).
 *   3. Each in-flight cap, in byte order of its key, acquires as many slots
 *      as the requests holding it were granted (inflight_acquire, as the
 *      caller); the cap may grant fewer, and its requests, in order, keep
 *      only as many as they got slots.
 *   4. The grants are decided again from the rows as locked: the capped
 *      requests' final counts first, then the other requests, in order, as
 *      much as is left (so tokens a cap gave back go to them), and once more
 *      in order to count each request's take once.  Then the buckets are
 *      written: one row update per bucket for the whole batch.  A request
 *      never spends a token it did not keep, and never holds a slot it has
 *      no token for.
 *
 * Requests are granted in order, so put the best first (the claim passes
 * them in walk order, the order of their endpoints' best due events; one
 * request per endpoint is the usual case).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

#include "ratebucket.h"
#include "stripe.h"
#include "validate.h"

PG_FUNCTION_INFO_V1(ratebucket_take_batch);

/* Most requests, and most distinct buckets, one batch may name. */
#define RB_MAX_BATCH 10000
/* Most buckets one request may name (as bucket_take_all). */
#define RB_MAX_BATCH_KEYS 64

/* One bucket of the batch. */
typedef struct RbBatchBucket
{
	text	   *endpoint;
	char	   *key;			/* the lock order */
	RbBucket	row;			/* as locked */
	RbBucket	work;			/* what the grants so far leave */
	bool		granted;		/* some request took from it: write it */
	bool		striped;		/* taken alone, after the others */
	bool		alone;			/* every request naming it names nothing else */
} RbBatchBucket;

/* One in-flight cap of the batch. */
typedef struct RbBatchCap
{
	char	   *key;
	int64		wanted;			/* slots its requests were granted tokens for */
	int64	   *slots;			/* what inflight_acquire gave */
	int			nslots;
	int			used;			/* slots handed to requests so far */
} RbBatchCap;

/* One request. */
typedef struct RbBatchRequest
{
	int			nkeys;
	int		   *buckets;		/* indexes into the batch's buckets */
	int64		tokens;			/* asked */
	int			cap;			/* index into the batch's caps, or -1 */
	int64		granted;
	double		wait;
	int			first_slot;		/* of its cap's slots */
} RbBatchRequest;

typedef struct RbBatch
{
	RbBatchRequest *requests;
	int			nrequests;
	RbBatchBucket *buckets;
	int			nbuckets;
	RbBatchCap *caps;
	int			ncaps;
} RbBatch;

/* Is this request that of a striped endpoint, taken after the others? */
#define rb_request_striped(batch, req) \
	((batch)->buckets[(req)->buckets[0]].striped)

static int
rb_cstring_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Sort and deduplicate an array of strings in place; returns the count. */
static int
rb_sort_unique(char **keys, int n)
{
	int			out = 0;
	int			i;

	qsort(keys, n, sizeof(char *), rb_cstring_cmp);
	for (i = 0; i < n; i++)
		if (out == 0 || strcmp(keys[out - 1], keys[i]) != 0)
			keys[out++] = keys[i];
	return out;
}

/* Where "key" is in sorted, unique "keys". */
static int
rb_find_key(char **keys, int n, const char *key)
{
	char	  **hit = bsearch(&key, keys, n, sizeof(char *), rb_cstring_cmp);

	Assert(hit != NULL);
	return (int) (hit - keys);
}

static void
rb_batch_null(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", what)));
}

/*
 * rb_batch_parse
 *		The requests of a ratebucket.batch_request[], checked, with their
 *		buckets and caps gathered in lock order.
 */
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
	char	  **all_keys;
	int			nall = 0;
	char	  **cap_keys;
	int			ncap = 0;
	text	  **req_cap;
	ArrayType **req_keys;
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

	batch->nrequests = n;
	batch->requests = palloc0(sizeof(RbBatchRequest) * Max(n, 1));
	req_cap = palloc0(sizeof(text *) * Max(n, 1));
	req_keys = palloc0(sizeof(ArrayType *) * Max(n, 1));
	all_keys = palloc(sizeof(char *) * Max(n, 1) * RB_MAX_BATCH_KEYS);
	cap_keys = palloc(sizeof(char *) * Max(n, 1));

	for (i = 0; i < n; i++)
	{
		RbBatchRequest *req = &batch->requests[i];
		HeapTupleHeader tup;
		bool		isnull;
		Datum		d;
		Datum	   *kd;
		bool	   *kn;
		int			nk;
		int			j;

		if (elemnulls[i])
			rb_batch_null("a request");
		tup = DatumGetHeapTupleHeader(elems[i]);

		d = GetAttributeByNum(tup, 1, &isnull);
		if (isnull)
			rb_batch_null("a request's buckets");
		req_keys[i] = DatumGetArrayTypeP(d);
		if (ARR_NDIM(req_keys[i]) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a request's buckets must be a one-dimensional array")));
		deconstruct_array(req_keys[i], TEXTOID, -1, false, TYPALIGN_INT,
						  &kd, &kn, &nk);
		if (nk < 1 || nk > RB_MAX_BATCH_KEYS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a request must name 1 to %d buckets", RB_MAX_BATCH_KEYS),
					 errdetail("Request %d names %d.", i + 1, nk)));
		req->nkeys = nk;
		req->buckets = palloc(sizeof(int) * nk);
		for (j = 0; j < nk; j++)
		{
			text	   *key;
			int			m;

			if (kn[j])
				rb_batch_null("a request's bucket");
			key = DatumGetTextPP(kd[j]);
			rb_check_endpoint(key);
			all_keys[nall] = text_to_cstring(key);
			for (m = nall - j; m < nall; m++)
				if (strcmp(all_keys[m], all_keys[nall]) == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("request %d names bucket \"%s\" twice",
									i + 1, all_keys[nall])));
			nall++;
		}

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
		req->cap = -1;
		if (!isnull)
		{
			req_cap[i] = DatumGetTextPP(d);
			if (VARSIZE_ANY_EXHDR(req_cap[i]) < 1 ||
				VARSIZE_ANY_EXHDR(req_cap[i]) > RB_MAX_ENDPOINT_BYTES)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("a request's inflight_key must be 1 to %d bytes",
								RB_MAX_ENDPOINT_BYTES),
						 errdetail("Request %d names a key of %d bytes.", i + 1,
								   (int) VARSIZE_ANY_EXHDR(req_cap[i]))));
			cap_keys[ncap++] = text_to_cstring(req_cap[i]);
		}
	}

	/* the buckets, in lock order */
	{
		char	  **sorted = palloc(sizeof(char *) * Max(nall, 1));
		int			nb;
		int			pos = 0;

		memcpy(sorted, all_keys, sizeof(char *) * nall);
		nb = rb_sort_unique(sorted, nall);
		if (nb > RB_MAX_BATCH)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("a batch may name at most %d buckets", RB_MAX_BATCH),
					 errdetail("%d were named.", nb)));
		batch->nbuckets = nb;
		batch->buckets = palloc0(sizeof(RbBatchBucket) * Max(nb, 1));
		for (i = 0; i < nb; i++)
		{
			batch->buckets[i].key = sorted[i];
			batch->buckets[i].endpoint = cstring_to_text(sorted[i]);
		}
		for (i = 0; i < n; i++)
		{
			RbBatchRequest *req = &batch->requests[i];
			int			j;

			for (j = 0; j < req->nkeys; j++)
				req->buckets[j] = rb_find_key(sorted, nb, all_keys[pos++]);
		}
	}

	/* which buckets only requests of their own name, without a cap */
	for (i = 0; i < batch->nbuckets; i++)
		batch->buckets[i].alone = true;
	for (i = 0; i < n; i++)
	{
		RbBatchRequest *req = &batch->requests[i];
		int			j;

		if (req->nkeys > 1 || req_cap[i] != NULL)
			for (j = 0; j < req->nkeys; j++)
				batch->buckets[req->buckets[j]].alone = false;
	}

	/* the caps, in lock order */
	batch->ncaps = rb_sort_unique(cap_keys, ncap);
	batch->caps = palloc0(sizeof(RbBatchCap) * Max(batch->ncaps, 1));
	for (i = 0; i < batch->ncaps; i++)
		batch->caps[i].key = cap_keys[i];
	for (i = 0; i < n; i++)
		if (req_cap[i] != NULL)
		{
			char	   *key = text_to_cstring(req_cap[i]);

			batch->requests[i].cap = rb_find_key(cap_keys, batch->ncaps, key);
		}
}

/* Start again from the rows as locked. */
static void
rb_batch_reset(RbBatch *batch)
{
	int			i;

	for (i = 0; i < batch->nbuckets; i++)
	{
		batch->buckets[i].work = batch->buckets[i].row;
		batch->buckets[i].granted = false;
	}
}

/*
 * rb_batch_take
 *		Grant one request as many tokens as every one of its buckets holds
 *		now (their "work" state), up to "limit", and take them from each.
 *		Returns what it granted.
 */
static int64
rb_batch_take(RbBatch *batch, const RbBatchRequest *req, int64 limit,
			  TimestampTz now)
{
	int64		g = limit;
	int			j;

	/* what every bucket would grant, judged on copies */
	for (j = 0; j < req->nkeys && g > 0; j++)
	{
		RbBatchBucket *b = &batch->buckets[req->buckets[j]];
		RbBucket	probe = b->work;
		int64		got;

		(void) rb_take_upto_held(&probe, b->endpoint, g, now, &got);
		g = Min(g, got);
	}

	/* take it from each */
	for (j = 0; j < req->nkeys && g > 0; j++)
	{
		RbBatchBucket *b = &batch->buckets[req->buckets[j]];
		int64		got;

		(void) rb_take_upto_held(&b->work, b->endpoint, g, now, &got);
		if (got != g)
			elog(ERROR, "bucket \"%s\" granted %lld of the %lld it held",
				 b->key, (long long) got, (long long) g);
		b->granted = true;
	}
	return g;
}

/*
 * rb_batch_wait
 *		The wait before one more token for a request that did not get all
 *		it asked: the longest of its buckets' waits, as the batch leaves
 *		them (0 if every one could grant one more, as when only its cap
 *		stopped it).
 */
static double
rb_batch_wait(RbBatch *batch, const RbBatchRequest *req, TimestampTz now)
{
	double		wait = 0.0;
	int			j;

	for (j = 0; j < req->nkeys; j++)
	{
		RbBatchBucket *b = &batch->buckets[req->buckets[j]];
		RbBucket	probe = b->work;
		int64		got;
		RbTakeResult r;

		r = rb_take_upto_held(&probe, b->endpoint, 1, now, &got);
		if (!r.allowed)
			wait = Max(wait, r.wait_seconds);
	}
	return wait;
}

/*
 * rb_batch_acquire
 *		Acquire, for each cap in lock order, the slots its requests were
 *		granted tokens for, by ratebucket.inflight_acquire as the caller,
 *		into memory of resultcxt.
 */
static void
rb_batch_acquire(RbBatch *batch, MemoryContext resultcxt)
{
	Oid			argtypes[2] = {TEXTOID, INT4OID};
	int			c;

	if (batch->ncaps == 0)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	for (c = 0; c < batch->ncaps; c++)
	{
		RbBatchCap *cap = &batch->caps[c];
		Datum		values[2];
		bool		isnull;
		Datum		d;

		if (cap->wanted == 0)
			continue;
		values[0] = PointerGetDatum(cstring_to_text(cap->key));
		values[1] = Int32GetDatum((int32) Min(cap->wanted, PG_INT32_MAX));
		if (SPI_execute_with_args("SELECT ratebucket.inflight_acquire($1, $2)",
								  2, argtypes, values, NULL, false, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "ratebucket.inflight_acquire did not return a row");
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (isnull)
			elog(ERROR, "ratebucket.inflight_acquire returned NULL");
		{
			ArrayType  *arr = DatumGetArrayTypeP(d);
			Datum	   *slots;
			bool	   *nulls;
			int			ns;
			int			k;

			deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
							  &slots, &nulls, &ns);
			/* the slots outlive SPI (and the storage session's SPI) */
			cap->slots = (int64 *) MemoryContextAlloc(resultcxt,
													  sizeof(int64) * Max(ns, 1));
			for (k = 0; k < ns; k++)
				cap->slots[k] = DatumGetInt64(slots[k]);
			cap->nslots = ns;
		}
	}
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/*
 * rb_batch_check_caps
 *		Every cap the batch names exists, whether or not slots of it will be
 *		wanted: a misspelt key is an error, not a cap that looks full.  Run
 *		in the storage session, as the owner of the caps' table, with a
 *		fresh snapshot (as inflight_acquire will look), not the statement's.
 */
static void
rb_batch_check_caps(const RbBatch *batch)
{
	Oid			argtypes[1] = {TEXTARRAYOID};
	Datum	   *keys;
	Datum		values[1];
	int			c;

	if (batch->ncaps == 0)
		return;
	keys = palloc(sizeof(Datum) * batch->ncaps);
	for (c = 0; c < batch->ncaps; c++)
		keys[c] = PointerGetDatum(cstring_to_text(batch->caps[c].key));
	values[0] = PointerGetDatum(construct_array(keys, batch->ncaps, TEXTOID,
												-1, false, TYPALIGN_INT));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT k FROM pg_catalog.unnest($1) AS k "
							  "WHERE NOT EXISTS (SELECT FROM ratebucket.inflight_caps AS c "
							  "WHERE c.key OPERATOR(pg_catalog.=) k) LIMIT 1",
							  1, argtypes, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up in-flight caps");
	if (SPI_processed > 0)
	{
		char	   *missing = SPI_getvalue(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1);

		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("key \"%s\" has no in-flight cap", missing),
				 errhint("Call ratebucket.inflight_configure(key, cap) first.")));
	}
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/*
 * rb_batch_check_stripes
 *		A striped endpoint is taken as bucket_take_upto takes it, from one
 *		stripe, skipping stripes other sessions hold: only alone, in requests
 *		naming no other bucket and no cap.  With other buckets, the take
 *		would have to choose and lock a stripe in the batch's one order.
 */
static void
rb_batch_check_stripes(const RbBatch *batch)
{
	int			i;

	for (i = 0; i < batch->nrequests; i++)
	{
		const RbBatchRequest *req = &batch->requests[i];
		int			j;

		for (j = 0; j < req->nkeys; j++)
			if (batch->buckets[req->buckets[j]].striped &&
				(req->nkeys > 1 || req->cap >= 0))
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("bucket_take_batch cannot take from striped endpoint \"%s\" with other limits",
								batch->buckets[req->buckets[j]].key),
						 errdetail("Request %d names %s.", i + 1,
								   req->cap >= 0 ? "an in-flight cap" : "other buckets"),
						 errhint("Stripe only endpoints taken alone, or put it back in one row with ratebucket.bucket_stripe(endpoint, 1).")));
	}
}

/*
 * bucket_take_batch(requests ratebucket.batch_request[]) returns
 *		setof (request int, granted int, wait_seconds float8, slots bigint[])
 *		See the file header.  One row per request, in the order given:
 *		its 1-based position, the tokens granted (taken from every one of
 *		its buckets), the seconds until its buckets could grant one more
 *		(0 if they could now), and the slots it holds (NULL without a cap).
 */
Datum
ratebucket_take_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext oldcxt;
	RbBatch		batch;
	RbStorageSession session;
	TimestampTz now;
	MemoryContext callcxt = CurrentMemoryContext;
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

	/*
	 * 1. Lock every bucket, in byte order.  A striped endpoint taken alone
	 * is taken from its stripes after the others (below), and its own row
	 * is not waited for: not locked at all once this backend knows it is
	 * striped (holding it would queue every other claim of it), and when
	 * another transaction holds it (a bucket_observe carrying a cooldown to
	 * the stripes holds it and them, and may wait for a bucket this batch
	 * holds), only peeked.  Named with other buckets, it is locked and
	 * read, so that the error below is never from a stale memory.
	 */
	rb_storage_begin(&session);
	for (i = 0; i < batch.nbuckets; i++)
	{
		RbBatchBucket *b = &batch.buckets[i];
		bool		have = false;

		if (b->alone)
		{
			RbBucket	peeked;

			if (rb_stripe_cached(b->endpoint) > 1)
			{
				b->striped = true;
				continue;
			}
			have = rb_storage_lock_skip(b->endpoint, &b->row);
			/* held by another: a striped endpoint's row is not waited for */
			if (!have && rb_storage_peek(b->endpoint, &peeked) &&
				rb_is_stripe_parent(&peeked))
			{
				b->striped = true;
				continue;
			}
		}
		if ((!have && !rb_storage_lock(b->endpoint, &b->row)) ||
			!rb_is_configured(&b->row))
			rb_not_configured(b->endpoint, false);
		if (rb_is_stripe_parent(&b->row))
			b->striped = true;
	}
	rb_batch_check_stripes(&batch);
	rb_batch_check_caps(&batch);

	/* 2. every row is held: read the clock once, grant in order */
	now = GetCurrentTimestamp();
	rb_batch_reset(&batch);
	for (i = 0; i < batch.nrequests; i++)
		if (!rb_request_striped(&batch, &batch.requests[i]))
			batch.requests[i].granted = rb_batch_take(&batch, &batch.requests[i],
													  batch.requests[i].tokens, now);

	if (batch.ncaps > 0)
	{
		/* 3. the slots for what was granted; a request keeps what it gets */
		for (i = 0; i < batch.nrequests; i++)
			if (batch.requests[i].cap >= 0)
				batch.caps[batch.requests[i].cap].wanted += batch.requests[i].granted;
		{
			/* as the caller, whose EXECUTE on inflight_acquire counts */
			Oid			owner;
			int			owner_context;

			GetUserIdAndSecContext(&owner, &owner_context);
			SetUserIdAndSecContext(session.save_userid, session.save_sec_context);
			rb_batch_acquire(&batch, callcxt);
			SetUserIdAndSecContext(owner, owner_context);
		}
		for (i = 0; i < batch.nrequests; i++)
		{
			RbBatchRequest *req = &batch.requests[i];
			RbBatchCap *cap;

			if (req->cap < 0)
				continue;
			cap = &batch.caps[req->cap];
			req->first_slot = cap->used;
			req->granted = Min(req->granted, cap->nslots - cap->used);
			cap->used += (int) req->granted;
		}

		/*
		 * 4. The tokens capped requests gave back go to the others: first
		 * the capped requests' final counts, which fit (each is no more than
		 * it was granted above, after no more than the requests before it
		 * took), then every other request, in order, as much as is left.
		 */
		rb_batch_reset(&batch);
		for (i = 0; i < batch.nrequests; i++)
		{
			RbBatchRequest *req = &batch.requests[i];

			if (req->cap >= 0 &&
				rb_batch_take(&batch, req, req->granted, now) != req->granted)
				elog(ERROR, "a capped request's tokens were not there the second time");
		}
		for (i = 0; i < batch.nrequests; i++)
		{
			RbBatchRequest *req = &batch.requests[i];

			if (req->cap < 0 && !rb_request_striped(&batch, req))
				req->granted = rb_batch_take(&batch, req, req->tokens, now);
		}

		/* the takes once more, in order, each once: the counters as they are */
		rb_batch_reset(&batch);
		for (i = 0; i < batch.nrequests; i++)
		{
			RbBatchRequest *req = &batch.requests[i];

			if (!rb_request_striped(&batch, req) &&
				rb_batch_take(&batch, req, req->granted, now) != req->granted)
				elog(ERROR, "a request's tokens were not there the third time");
		}
	}

	/* the wait of each request that did not get all it asked */
	for (i = 0; i < batch.nrequests; i++)
	{
		RbBatchRequest *req = &batch.requests[i];

		req->wait = 0.0;
		if (!rb_request_striped(&batch, req) && req->granted < req->tokens)
			req->wait = rb_batch_wait(&batch, req, now);
	}

	/* write each bucket taken from, once */
	for (i = 0; i < batch.nbuckets; i++)
		if (batch.buckets[i].granted)
			rb_storage_update(&batch.buckets[i].work);
	rb_storage_end(&session);

	/*
	 * Striped endpoints, each alone, as bucket_take_upto takes them, but
	 * never waiting: every other bucket of the batch is held now, out of
	 * the byte order, and a transaction holding all of a stripe's rows (a
	 * bucket_observe carrying a cooldown to every stripe) may be waiting
	 * for one of them.  Every stripe held is a refusal with no wait.
	 */
	for (i = 0; i < batch.nrequests; i++)
	{
		RbBatchRequest *req = &batch.requests[i];
		RbTakeResult r;

		if (!rb_request_striped(&batch, req) || req->tokens == 0)
			continue;
		r = rb_take_upto_configured(batch.buckets[req->buckets[0]].endpoint,
									req->tokens, true, &req->granted);
		req->wait = req->granted < req->tokens ? r.wait_seconds : 0.0;
	}

	/* the rows */
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
		{
			RbBatchCap *cap = &batch.caps[req->cap];
			Datum	   *slots = palloc(sizeof(Datum) * Max(req->granted, 1));
			int			k;

			for (k = 0; k < req->granted; k++)
				slots[k] = Int64GetDatum(cap->slots[req->first_slot + k]);
			values[3] = PointerGetDatum(construct_array(slots, (int) req->granted,
														INT8OID, 8, FLOAT8PASSBYVAL,
														TYPALIGN_DOUBLE));
		}
		tuplestore_putvalues(store, tupdesc, values, nulls);
	}
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;
	return (Datum) 0;
}
