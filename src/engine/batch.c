/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  bucket_take_batch's decision: the grants of a claimed batch whose
 *	  events answer to several limits each (their endpoint, their account's
 *	  rate, a lane, a daily quota, an in-flight cap), in one call.
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
 *      as the requests holding it were granted (bucket/inflight.c, for a
 *      caller allowed to call inflight_acquire); the cap may grant fewer,
 *      and its requests, in order, keep only as many as they got slots.
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

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "bucket/inflight.h"
#include "bucket/storage.h"
#include "bucket/stripe.h"
#include "engine/decide.h"
#include "engine/engine.h"

/* One bucket of the batch. */
struct RbBatchBucket
{
	text	   *endpoint;
	char	   *key;			/* the lock order */
	RbBucket	row;			/* as locked */
	RbBucket	work;			/* what the grants so far leave */
	bool		granted;		/* some request took from it: write it */
	bool		striped;		/* taken alone, after the others */
	bool		alone;			/* every request naming it names nothing else */
};

/* One in-flight cap of the batch. */
struct RbBatchCap
{
	char	   *key;
	int64		wanted;			/* slots its requests were granted tokens for */
	int64	   *slots;			/* what inflight_acquire gave */
	int			nslots;
	int			used;			/* slots handed to requests so far */
};

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

/*
 * rb_batch_index
 *		Gather the buckets and the caps the requests name, each once, in
 *		lock order (the byte order of their keys), and point every request
 *		at its own.  A bucket is "alone" if every request naming it names
 *		nothing else and no cap.
 */
static void
rb_batch_index(RbBatch *batch)
{
	char	  **keys;
	char	  **caps;
	int			nkeys = 0;
	int			ncaps = 0;
	int			i;
	int			j;

	for (i = 0; i < batch->nrequests; i++)
		nkeys += batch->requests[i].nkeys;
	keys = palloc(sizeof(char *) * Max(nkeys, 1));
	caps = palloc(sizeof(char *) * Max(batch->nrequests, 1));
	nkeys = 0;
	for (i = 0; i < batch->nrequests; i++)
	{
		for (j = 0; j < batch->requests[i].nkeys; j++)
			keys[nkeys++] = batch->requests[i].keys[j];
		if (batch->requests[i].cap_key != NULL)
			caps[ncaps++] = batch->requests[i].cap_key;
	}

	batch->nbuckets = rb_sort_unique(keys, nkeys);
	if (batch->nbuckets > RB_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a batch may name at most %d buckets", RB_MAX_BATCH),
				 errdetail("%d were named.", batch->nbuckets)));
	batch->buckets = palloc0(sizeof(RbBatchBucket) * Max(batch->nbuckets, 1));
	for (i = 0; i < batch->nbuckets; i++)
	{
		batch->buckets[i].key = keys[i];
		batch->buckets[i].endpoint = cstring_to_text(keys[i]);
		batch->buckets[i].alone = true;
	}

	batch->ncaps = rb_sort_unique(caps, ncaps);
	batch->caps = palloc0(sizeof(RbBatchCap) * Max(batch->ncaps, 1));
	for (i = 0; i < batch->ncaps; i++)
		batch->caps[i].key = caps[i];

	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];

		req->buckets = palloc(sizeof(int) * Max(req->nkeys, 1));
		for (j = 0; j < req->nkeys; j++)
		{
			req->buckets[j] = rb_find_key(keys, batch->nbuckets, req->keys[j]);
			if (req->nkeys > 1 || req->cap_key != NULL)
				batch->buckets[req->buckets[j]].alone = false;
		}
		req->cap = req->cap_key == NULL ? -1 :
			rb_find_key(caps, batch->ncaps, req->cap_key);
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
 *		granted tokens for (bucket/inflight.c), into memory of resultcxt,
 *		once the caller is known to hold EXECUTE on inflight_acquire: the
 *		batch acquires on the caller's behalf.
 */
static void
rb_batch_acquire(RbBatch *batch, Oid caller, MemoryContext resultcxt)
{
	bool		checked = false;
	int			c;

	for (c = 0; c < batch->ncaps; c++)
	{
		RbBatchCap *cap = &batch->caps[c];

		if (cap->wanted == 0)
			continue;
		if (!checked)
			rb_inflight_check_acquire(caller);
		checked = true;
		cap->nslots = rb_inflight_acquire(cstring_to_text(cap->key),
										  (int32) Min(cap->wanted, PG_INT32_MAX),
										  resultcxt, &cap->slots);
	}
}

/*
 * rb_batch_check_caps
 *		Every cap the batch names exists, whether or not slots of it will be
 *		wanted: a misspelt key is an error, not a cap that looks full.
 */
static void
rb_batch_check_caps(const RbBatch *batch)
{
	char	  **keys;
	char	   *missing;
	int			c;

	if (batch->ncaps == 0)
		return;
	keys = palloc(sizeof(char *) * batch->ncaps);
	for (c = 0; c < batch->ncaps; c++)
		keys[c] = batch->caps[c].key;
	missing = rb_inflight_missing(keys, batch->ncaps);
	if (missing != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("key \"%s\" has no in-flight cap", missing),
				 errhint("Call ratebucket.inflight_configure(key, cap) first.")));
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
 * rb_batch_lock
 *		Lock every bucket, in byte order.  A striped endpoint taken alone is
 *		taken from its stripes after the others (rb_batch_take_striped), and
 *		its own row is not waited for: not locked at all once this backend
 *		knows it is striped (holding it would queue every other claim of
 *		it), and when another transaction holds it (a bucket_observe
 *		carrying a cooldown to the stripes holds it and them, and may wait
 *		for a bucket this batch holds), only peeked.  Named with other
 *		buckets, it is locked and read, so that the error of
 *		rb_batch_check_stripes is never from a stale memory.
 */
static void
rb_batch_lock(RbBatch *batch)
{
	int			i;

	/* the templates' lock before any row, if a first use may need it */
	for (i = 0; i < batch->nbuckets &&
		 !rb_template_prelock(batch->buckets[i].endpoint); i++)
		;
	for (i = 0; i < batch->nbuckets; i++)
	{
		RbBatchBucket *b = &batch->buckets[i];
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
		/* configured by now, or by its template at this first use */
		if (have ? !rb_is_configured(&b->row) &&
			!rb_template_adopt_held(b->endpoint, &b->row) :
			!rb_lock_configured(b->endpoint, &b->row))
			rb_bucket_not_configured(b->endpoint, false);
		if (rb_is_stripe_parent(&b->row))
			b->striped = true;
	}
}

/*
 * rb_batch_apply_caps
 *		Steps 3 and 4 of the file header: the slots for what was granted (a
 *		request keeps only as many tokens as it gets slots), then the grants
 *		decided again from the rows as locked, so that the tokens capped
 *		requests gave back go to the others.
 */
static void
rb_batch_apply_caps(RbBatch *batch, const RbStorageSession *session,
					MemoryContext callcxt, TimestampTz now)
{
	int			i;

	for (i = 0; i < batch->nrequests; i++)
		if (batch->requests[i].cap >= 0)
			batch->caps[batch->requests[i].cap].wanted += batch->requests[i].granted;
	rb_batch_acquire(batch, session->save_userid, callcxt);

	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];
		RbBatchCap *cap;

		if (req->cap < 0)
			continue;
		cap = &batch->caps[req->cap];
		req->first_slot = cap->used;
		req->granted = Min(req->granted, cap->nslots - cap->used);
		cap->used += (int) req->granted;
	}

	/*
	 * The capped requests' final counts first, which fit (each is no more
	 * than it was granted before, after no more than the requests before it
	 * took), then every other request, in order, as much as is left.
	 */
	rb_batch_reset(batch);
	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];

		if (req->cap >= 0 &&
			rb_batch_take(batch, req, req->granted, now) != req->granted)
			elog(ERROR, "a capped request's tokens were not there the second time");
	}
	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];

		if (req->cap < 0 && !rb_request_striped(batch, req))
			req->granted = rb_batch_take(batch, req, req->tokens, now);
	}

	/* the takes once more, in order, each once: the counters as they are */
	rb_batch_reset(batch);
	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];

		if (!rb_request_striped(batch, req) &&
			rb_batch_take(batch, req, req->granted, now) != req->granted)
			elog(ERROR, "a request's tokens were not there the third time");
	}
}

/*
 * rb_batch_take_striped
 *		Striped endpoints, each alone, as bucket_take_upto takes them, but
 *		never waiting: every other bucket of the batch is held now, out of
 *		the byte order, and a transaction holding all of a stripe's rows (a
 *		bucket_observe carrying a cooldown to every stripe) may be waiting
 *		for one of them.  Every stripe held is a refusal with no wait.
 */
static void
rb_batch_take_striped(RbBatch *batch)
{
	int			i;

	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];
		RbTakeRequest take = {true, 0.0, 0.0, 0.0, 0, true};
		RbTakeResult r;
		double		granted;

		if (!rb_request_striped(batch, req) || req->tokens == 0)
			continue;
		take.upto = req->tokens;
		r = rb_engine_take(batch->buckets[req->buckets[0]].endpoint, &take,
						   &granted);
		req->granted = (int64) granted;
		req->wait = req->granted < req->tokens ? r.wait_seconds : 0.0;
	}
}

/*
 * rb_engine_take_batch
 *		Grant the batch (see the file header): sets each request's granted,
 *		wait and slots (rb_batch_slots).
 */
void
rb_engine_take_batch(RbBatch *batch)
{
	RbStorageSession session;
	TimestampTz now;
	MemoryContext callcxt = CurrentMemoryContext;
	int			i;

	rb_batch_index(batch);

	/* 1. lock every bucket, in byte order */
	rb_storage_begin(&session);
	rb_batch_lock(batch);
	rb_batch_check_stripes(batch);
	rb_batch_check_caps(batch);

	/* 2. every row is held: read the clock once, grant in order */
	now = GetCurrentTimestamp();
	rb_batch_reset(batch);
	for (i = 0; i < batch->nrequests; i++)
		if (!rb_request_striped(batch, &batch->requests[i]))
			batch->requests[i].granted =
				rb_batch_take(batch, &batch->requests[i],
							  batch->requests[i].tokens, now);

	/* 3 and 4. the caps, and the grants again */
	if (batch->ncaps > 0)
		rb_batch_apply_caps(batch, &session, callcxt, now);

	/* the wait of each request that did not get all it asked */
	for (i = 0; i < batch->nrequests; i++)
	{
		RbBatchRequest *req = &batch->requests[i];

		req->wait = 0.0;
		if (!rb_request_striped(batch, req) && req->granted < req->tokens)
			req->wait = rb_batch_wait(batch, req, now);
	}

	/* write each bucket taken from, once */
	for (i = 0; i < batch->nbuckets; i++)
		if (batch->buckets[i].granted)
			rb_storage_update(&batch->buckets[i].work);
	rb_storage_end(&session);

	rb_batch_take_striped(batch);
}

/*
 * rb_batch_slots
 *		The slots a request of a granted batch holds (req->granted of them),
 *		or NULL for a request without a cap.
 */
int64 *
rb_batch_slots(const RbBatch *batch, const RbBatchRequest *req)
{
	if (req->cap < 0 || batch->caps[req->cap].slots == NULL)
		return NULL;			/* no cap, or no slot was wanted of it */
	return batch->caps[req->cap].slots + req->first_slot;
}
