/*-------------------------------------------------------------------------
 *
 * engine.h
 *	  The engine: every decision made under row locks, called by the SQL
 *	  layer (api/) with arguments already checked, and returning C values,
 *	  never Datums.
 *
 *	  take.c		a take of one endpoint (bucket_take, bucket_take_upto)
 *	  striped.c		a take of a striped endpoint, stripe by stripe
 *	  decide.c		a take decided on one row in memory, and its optimistic
 *					write (used by take.c and striped.c)
 *	  peek.c		what a take would be told, without a lock
 *	  take_all.c	several buckets at once, all or nothing
 *	  batch.c		a claim's batch of requests over shared buckets and caps
 *	  observe.c		what a destination answered, applied to its bucket
 *	  admin.c		configure, quotas, reset, drop, pause, resume, stripe
 *	  reserve.c		token reserves given, taken away and listed
 *	  template.c	endpoints configured by templates, at their first use
 *
 * Every entry point opens and ends its own storage session (one door to
 * the table, bucket/storage.h), locks rows first and reads the clock after.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_ENGINE_ENGINE_H
#define RATEBUCKET_ENGINE_ENGINE_H

#include "postgres.h"

#include "pgtime.h"

#include "bucket/bucket.h"
#include "bucket/reserve.h"
#include "bucket/template.h"
#include "core/feedback.h"
#include "core/quota.h"

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

/* decide.c: the error for a take larger than its bucket */
extern void rb_check_request_fits(const RbTakeRequest *req, double capacity);

/* take.c */
extern RbTakeResult rb_engine_take(text *endpoint, const RbTakeRequest *req,
								   double *granted);

/* peek.c */
extern RbTakeResult rb_engine_peek(text *endpoint, double want, int64 upto,
								   double *granted);
extern bool rb_engine_peek_configured(text *endpoint, int64 upto,
									  int64 *granted);

/* take_all.c: one bucket of a bucket_take_all */
typedef struct RbAllItem
{
	text	   *endpoint;
	char	   *key;			/* endpoint as a C string: the lock order */
	int			pos;			/* where the caller named it */
	double		want;
	RbBucket	bucket;			/* the row, then what the take leaves */
	RbTakeResult result;
} RbAllItem;

extern void rb_engine_sort_items(RbAllItem *items, int n);
extern bool rb_engine_take_all(RbAllItem *items, int n, double *wait);

/* batch.c: one request of a bucket_take_batch, as the SQL layer read it */
typedef struct RbBatchRequest
{
	int			nkeys;
	char	  **keys;			/* the buckets it names, as given */
	char	   *cap_key;		/* its in-flight cap, or NULL */
	int64		tokens;			/* asked */
	/* set by the engine */
	int		   *buckets;		/* indexes into the batch's buckets */
	int			cap;			/* index into the batch's caps, or -1 */
	int64		granted;
	double		wait;
	int			first_slot;		/* of its cap's slots */
} RbBatchRequest;

typedef struct RbBatchBucket RbBatchBucket;
typedef struct RbBatchCap RbBatchCap;

typedef struct RbBatch
{
	RbBatchRequest *requests;
	int			nrequests;
	/* set by the engine */
	RbBatchBucket *buckets;
	int			nbuckets;
	RbBatchCap *caps;
	int			ncaps;
} RbBatch;

/* Most requests, and most distinct buckets, one batch may name. */
#define RB_MAX_BATCH 10000
/* Most buckets one request may name (as bucket_take_all). */
#define RB_MAX_BATCH_KEYS 64

extern void rb_engine_take_batch(RbBatch *batch);
extern int64 *rb_batch_slots(const RbBatch *batch, const RbBatchRequest *req);

/* observe.c */
extern bool rb_engine_observe_many(text *endpoint, const RbResponse *responses,
								   int n, RbObservation *out);
extern bool rb_engine_observe(text *endpoint, const RbResponse *response,
							  RbObservation *out);

/* admin.c */
extern void rb_engine_configure(text *endpoint, const RbConfig *config);
extern void rb_engine_configure_quota(text *endpoint, double quota,
									  RbQuotaPeriod period, pg_tz *tz);
extern bool rb_engine_reset(text *endpoint);
extern bool rb_engine_drop(text *endpoint);
extern bool rb_engine_pause(text *endpoint, TimestampTz until);
extern int	rb_engine_stripe(text *endpoint, int stripes);

/* reserve.c */
extern int32 rb_engine_reserve(text *endpoint, int32 batch);
extern int	rb_engine_reserves(RbReserveInfo **infos);

/* template.c */
extern bool rb_lock_configured(text *endpoint, RbBucket *bucket);
extern bool rb_template_prelock(text *endpoint);
extern bool rb_template_adopt_held(text *endpoint, RbBucket *bucket);
extern bool rb_template_peek(text *endpoint, RbBucket *bucket, bool found);
extern bool rb_engine_template_for(text *endpoint, RbTemplate *tmpl);
extern int64 rb_engine_template_set(const RbTemplate *tmpl, bool *created);
extern bool rb_engine_template_drop(const char *pattern);

#endif							/* RATEBUCKET_ENGINE_ENGINE_H */
