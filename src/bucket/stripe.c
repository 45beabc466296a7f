/*-------------------------------------------------------------------------
 *
 * stripe.c
 *	  Striped (hot) buckets: the stripes' names, which endpoints are
 *	  striped, laying a bucket out over k rows, and keeping the stripes in
 *	  step with their endpoint's row.
 *
 * A bucket is one row, and every take of it waits for the previous taker's
 * commit: one hot endpoint serialises all its senders.  bucket_stripe splits
 * a configured endpoint's bucket over k rows of ratebucket.buckets, its
 * stripes, each with rate/k and capacity/k.  A take starts at a stripe of
 * its own (by backend), skips stripes another transaction holds, and is
 * granted by the first free stripe that holds its tokens (engine/striped.c).  Each
 * stripe is an ordinary bucket row under its own lock, so each grants at
 * most (rate/k)·T + capacity/k in any window of T seconds, and all of them
 * together at most rate·T + capacity: the bound of the unstriped bucket,
 * exactly, whatever the interleaving.
 *
 * Layout.  The endpoint's own row (the parent) keeps the configuration,
 * the feedback state and the feedback counters; it holds no tokens, and its
 * refill time is infinity, which marks it (see rb_is_stripe_parent).  Stripe
 * i of k is the row keyed rb_stripe_key(endpoint, i, k): longer than any
 * endpoint may be (RB_MAX_ENDPOINT_BYTES), so no caller can name it, and it
 * can never collide with an endpoint.  ratebucket.bucket_stripes records k.
 * A stripe carries its share of the configuration (rate, capacity and floor
 * divided by k) and a copy of the parent's feedback state, so a take reads
 * one row only; whatever changes that state on the parent (bucket_observe,
 * bucket_pause, bucket_resume, bucket_reset, bucket_configure) then locks
 * every stripe, in order, and carries the change over (rb_stripe_sync).
 *
 * Each backend remembers the stripe count of the striped endpoints it has
 * met.  That memory needs no invalidation: k is part of every stripe's key,
 * so after a restripe the remembered keys name no row, and the take falls
 * back to the endpoint's row, which sends it to the current stripes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "bucket/storage.h"
#include "bucket/stripe.h"

/*
 * rb_stripe_key
 *		The key of stripe "stripe" (0-based) of "stripes": the endpoint, a
 *		unit separator, "stripe i/k", another, then dots up to more than
 *		RB_MAX_ENDPOINT_BYTES bytes.  The stripe number comes early, so that
 *		two stripes of one endpoint compare unequal soon.
 */
text *
rb_stripe_key(text *endpoint, int stripe, int stripes)
{
	StringInfoData buf;
	text	   *key;

	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, VARDATA_ANY(endpoint),
						   VARSIZE_ANY_EXHDR(endpoint));
	appendStringInfo(&buf, "\x1f" "stripe %d/%d" "\x1f", stripe, stripes);
	if (buf.len <= RB_MAX_ENDPOINT_BYTES)
	{
		int			pad = RB_MAX_ENDPOINT_BYTES + 1 - buf.len;

		enlargeStringInfo(&buf, pad);
		memset(buf.data + buf.len, '.', pad);
		buf.len += pad;
		buf.data[buf.len] = '\0';
	}
	key = cstring_to_text_with_len(buf.data, buf.len);
	pfree(buf.data);
	return key;
}

/*
 * The striped endpoints this backend has met, with their stripe counts: a
 * handful of hot endpoints, so a small array, replaced round robin.
 */
#define RB_STRIPE_CACHE_SIZE 16

typedef struct RbStripeCacheEntry
{
	char	   *endpoint;		/* in TopMemoryContext; NULL: free */
	int			len;
	int			stripes;
} RbStripeCacheEntry;

static RbStripeCacheEntry stripe_cache[RB_STRIPE_CACHE_SIZE];
static int	stripe_cache_used = 0;
static int	stripe_cache_next = 0;

static RbStripeCacheEntry *
rb_stripe_cache_find(text *endpoint)
{
	int			len = VARSIZE_ANY_EXHDR(endpoint);
	int			i;

	for (i = 0; i < stripe_cache_used; i++)
	{
		RbStripeCacheEntry *e = &stripe_cache[i];

		if (e->endpoint != NULL && e->len == len &&
			memcmp(e->endpoint, VARDATA_ANY(endpoint), len) == 0)
			return e;
	}
	return NULL;
}

/*
 * rb_stripe_cached
 *		The stripe count this backend remembers for the endpoint, 0 if none.
 *		A hint only: the stripes' keys tell whether it is still true.
 */
int
rb_stripe_cached(text *endpoint)
{
	RbStripeCacheEntry *e;

	if (stripe_cache_used == 0)
		return 0;
	e = rb_stripe_cache_find(endpoint);
	return e != NULL ? e->stripes : 0;
}

/* rb_stripe_forget: the endpoint is no longer known to be striped. */
void
rb_stripe_forget(text *endpoint)
{
	RbStripeCacheEntry *e = rb_stripe_cache_find(endpoint);

	if (e != NULL)
	{
		pfree(e->endpoint);
		e->endpoint = NULL;
	}
}

/* rb_stripe_remember: the endpoint has "stripes" stripes (> 1). */
void
rb_stripe_remember(text *endpoint, int stripes)
{
	RbStripeCacheEntry *e = rb_stripe_cache_find(endpoint);

	if (e == NULL)
	{
		int			len = VARSIZE_ANY_EXHDR(endpoint);

		if (stripe_cache_used < RB_STRIPE_CACHE_SIZE)
			e = &stripe_cache[stripe_cache_used++];
		else
		{
			e = &stripe_cache[stripe_cache_next];
			stripe_cache_next = (stripe_cache_next + 1) % RB_STRIPE_CACHE_SIZE;
			if (e->endpoint != NULL)
				pfree(e->endpoint);
		}
		e->endpoint = MemoryContextAlloc(TopMemoryContext, Max(len, 1));
		memcpy(e->endpoint, VARDATA_ANY(endpoint), len);
		e->len = len;
	}
	e->stripes = stripes;
}

/*
 * The stripe a take starts at: the one that last granted to this backend,
 * at first its process id modulo k, so that concurrent takers start apart.
 */
static int	stripe_cursor = -1;

int
rb_stripe_start(int stripes)
{
	if (stripe_cursor < 0)
		stripe_cursor = MyProcPid;
	return stripe_cursor % stripes;
}

/* rb_stripe_used: a take was granted by this stripe; start there next. */
void
rb_stripe_used(int stripe)
{
	stripe_cursor = stripe;
}

/*
 * ratebucket.bucket_stripes, through SPI with saved plans (rb_spi_plan);
 * called between rb_storage_begin and rb_storage_end (as the table owner).
 */
static SPIPlanPtr lookup_plan = NULL;
static SPIPlanPtr upsert_plan = NULL;
static SPIPlanPtr delete_plan = NULL;

/*
 * rb_stripe_lookup
 *		The endpoint's stripe count as committed (0: not striped), which
 *		this backend then remembers.
 */
int
rb_stripe_lookup(text *endpoint)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	int			stripes = 0;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = PointerGetDatum(endpoint);
	rc = SPI_execute_plan(rb_spi_plan(&lookup_plan,
										 "SELECT stripes FROM ratebucket.bucket_stripes"
										 " WHERE endpoint OPERATOR(pg_catalog.=) $1",
										 1, argtypes),
						  values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			stripes = DatumGetInt32(d);
	}
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");

	if (stripes > 1)
		rb_stripe_remember(endpoint, stripes);
	else
		rb_stripe_forget(endpoint);
	return stripes;
}

/*
 * rb_stripe_record
 *		Record (stripes > 1) or erase (stripes <= 1) the endpoint's stripe
 *		count in ratebucket.bucket_stripes.
 */
void
rb_stripe_record(text *endpoint, int stripes, TimestampTz now)
{
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (stripes > 1)
	{
		Oid			argtypes[3] = {TEXTOID, INT4OID, TIMESTAMPTZOID};
		Datum		values[3];

		values[0] = PointerGetDatum(endpoint);
		values[1] = Int32GetDatum(stripes);
		values[2] = TimestampTzGetDatum(now);
		rc = SPI_execute_plan(rb_spi_plan(&upsert_plan,
											 "INSERT INTO ratebucket.bucket_stripes AS s"
											 " (endpoint, stripes, striped_at) VALUES ($1, $2, $3)"
											 " ON CONFLICT (endpoint) DO UPDATE"
											 " SET stripes = excluded.stripes,"
											 " striped_at = excluded.striped_at",
											 3, argtypes),
							  values, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	}
	else
	{
		Oid			argtypes[1] = {TEXTOID};
		Datum		values[1];

		values[0] = PointerGetDatum(endpoint);
		rc = SPI_execute_plan(rb_spi_plan(&delete_plan,
											 "DELETE FROM ratebucket.bucket_stripes"
											 " WHERE endpoint OPERATOR(pg_catalog.=) $1",
											 1, argtypes),
							  values, NULL, false, 0);
		if (rc != SPI_OK_DELETE)
			elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	}
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/* rb_stripe_count: the stripe count of a parent row its caller holds. */
int
rb_stripe_count(text *endpoint)
{
	int			stripes = rb_stripe_lookup(endpoint);

	if (stripes < 2)
		elog(ERROR, "striped endpoint \"%s\" has no stripe count",
			 text_to_cstring(endpoint));
	return stripes;
}

/* Lock stripe i of k (waiting for a holder); complain if it is missing. */
static void
rb_stripe_lock(text *endpoint, int stripe, int stripes, RbBucket *bucket)
{
	if (!rb_storage_lock(rb_stripe_key(endpoint, stripe, stripes), bucket))
		elog(ERROR, "stripe %d of %d of endpoint \"%s\" is missing",
			 stripe, stripes, text_to_cstring(endpoint));
}

/* A stripe's share of the parent's configuration and limits in force. */
static void
rb_stripe_config_from(RbBucket *stripe, const RbBucket *parent, int stripes)
{
	stripe->rate = parent->rate / stripes;
	stripe->capacity = parent->capacity / stripes;
	stripe->conf_rate = parent->conf_rate / stripes;
	stripe->conf_capacity = parent->conf_capacity / stripes;
	stripe->conf_floor_rate = parent->conf_floor_rate / stripes;	/* NaN stays */
	stripe->conf_throttle_factor = parent->conf_throttle_factor;
	stripe->conf_recovery_factor = parent->conf_recovery_factor;
	stripe->conf_breaker_failures = parent->conf_breaker_failures;
	stripe->configured_at = parent->configured_at;
}

/*
 * A stripe takes the parent's feedback state: its cooldown (which empties
 * the stripe, as it emptied an unstriped bucket), pause, rate factor and
 * breaker.  Not the run of failures, which only the parent counts; and the
 * stripe's own half-open probe stays as long as the breaker has not moved.
 */
static void
rb_stripe_adapt_from(RbBucket *stripe, const RbBucket *parent)
{
	int64		probe_at = stripe->adapt.probe_at;
	int64		open_until = stripe->adapt.open_until;

	if (parent->adapt.cooldown_until != RB_NO_TIME)
		rb_cool_down(&stripe->state, &stripe->adapt,
					 parent->adapt.cooldown_until);
	stripe->adapt = parent->adapt;
	stripe->adapt.failure_run = 0;
	if (open_until == parent->adapt.open_until)
		stripe->adapt.probe_at = probe_at;
}

/*
 * rb_stripe_sync
 *		Carry a change of a striped endpoint's row (which the caller has
 *		locked, and is about to write or has written) to every stripe,
 *		locking them in stripe order.
 */
void
rb_stripe_sync(text *endpoint, const RbBucket *parent, RbStripeSync how)
{
	int			stripes = rb_stripe_count(endpoint);
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	if (how == RB_SYNC_CONFIG && parent->conf_capacity / stripes < 1.0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("capacity (%g) is too small for %d stripes",
						parent->conf_capacity, stripes),
				 errdetail("Endpoint \"%s\" is striped: each stripe holds capacity / stripes tokens, at least one.",
						   text_to_cstring(endpoint)),
				 errhint("Raise the capacity, or stripe the endpoint with fewer stripes first (bucket_stripe).")));

	for (i = 0; i < stripes; i++)
	{
		RbBucket	stripe;

		rb_stripe_lock(endpoint, i, stripes, &stripe);
		switch (how)
		{
			case RB_SYNC_CONFIG:
				/* bank what the old limits earned, as configure does */
				rb_bucket_bank(&stripe, now);
				rb_stripe_config_from(&stripe, parent, stripes);
				if (stripe.state.tokens > stripe.capacity)
					stripe.state.tokens = stripe.capacity;
				break;
			case RB_SYNC_RESET:
				stripe.state.tokens = stripe.capacity;
				stripe.state.refilled_at = now;
				rb_adapt_init(&stripe.adapt);
				break;
			case RB_SYNC_ADAPT:
				rb_stripe_adapt_from(&stripe, parent);
				break;
		}
		rb_storage_update(&stripe);
	}
}

/*
 * rb_stripe_drop
 *		Delete a striped endpoint's stripes and its stripe count (the caller
 *		holds the parent's lock and deletes the parent).
 */
bool
rb_stripe_drop(text *endpoint)
{
	int			stripes = rb_stripe_count(endpoint);
	int			i;

	for (i = 0; i < stripes; i++)
		(void) rb_storage_delete(rb_stripe_key(endpoint, i, stripes));
	rb_stripe_record(endpoint, 1, 0);
	return true;
}


/*
 * rb_stripe_gather
 *		Fold the "old" stripes of an endpoint (old > 1) back into its row,
 *		which the caller holds: lock each in order, bank what it earned up to
 *		"now", add up its tokens, move its take counters to the parent, and
 *		delete it.  Sets the tokens they held and the latest refill time
 *		among them (a cooldown's, possibly in the future).
 */
void
rb_stripe_gather(text *endpoint, RbBucket *parent, int old, TimestampTz now,
				 double *tokens, TimestampTz *refilled_at)
{
	int			i;

	*tokens = 0.0;
	*refilled_at = now;
	for (i = 0; i < old; i++)
	{
		RbBucket	stripe;

		rb_stripe_lock(endpoint, i, old, &stripe);
		rb_bucket_bank(&stripe, now);
		*tokens += stripe.state.tokens;
		*refilled_at = Max(*refilled_at, stripe.state.refilled_at);
		parent->takes_granted += stripe.takes_granted;
		parent->tokens_granted += stripe.tokens_granted;
		if (stripe.last_granted_at != RB_NO_TIME &&
			(parent->last_granted_at == RB_NO_TIME ||
			 stripe.last_granted_at > parent->last_granted_at))
			parent->last_granted_at = stripe.last_granted_at;
		(void) rb_storage_delete(rb_stripe_key(endpoint, i, old));
	}
}

/*
 * rb_stripe_spread
 *		Lay the bucket out over "stripes" rows: the tokens it holds are
 *		shared evenly among new stripes, each refilling from refilled_at, its
 *		share of the limits and a copy of the feedback state; the endpoint's
 *		row becomes their parent (no tokens, refill time infinity).  With
 *		stripes 1 the row holds the tokens itself again.  The caller writes
 *		the parent and records the count.
 */
void
rb_stripe_spread(text *endpoint, RbBucket *parent, int stripes,
				 double tokens, TimestampTz refilled_at, TimestampTz now)
{
	int			i;

	if (stripes == 1)
	{
		parent->state.tokens = Min(tokens, parent->capacity);
		parent->state.refilled_at = refilled_at;
		return;
	}
	for (i = 0; i < stripes; i++)
	{
		RbBucket	stripe;

		rb_new_bucket(&stripe, parent->rate / stripes,
					  parent->capacity / stripes, now);
		rb_stripe_config_from(&stripe, parent, stripes);
		stripe.state.tokens = Min(tokens / stripes, stripe.capacity);
		stripe.state.refilled_at = refilled_at;
		stripe.adapt = parent->adapt;
		stripe.adapt.failure_run = 0;
		if (!rb_storage_insert(rb_stripe_key(endpoint, i, stripes), &stripe))
			elog(ERROR, "stripe %d of %d of endpoint \"%s\" exists already",
				 i, stripes, text_to_cstring(endpoint));
	}
	parent->state.tokens = 0.0;
	parent->state.refilled_at = RB_FOREVER;
}
