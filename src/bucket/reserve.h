/*-------------------------------------------------------------------------
 *
 * reserve.h
 *	  Token reserves in shared memory for hot endpoints (reserve.c): a take
 *	  of an endpoint with a reserve draws from it without touching its row,
 *	  and the row refills the reserve a batch at a time.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_RESERVE_H
#define RATEBUCKET_BUCKET_RESERVE_H

#include "postgres.h"

#include "bucket/bucket.h"

/* Longest endpoint that can have a reserve, in bytes. */
#define RB_RESERVE_MAX_ENDPOINT 255

/* Most tokens a refill may move at once. */
#define RB_RESERVE_MAX_BATCH 1000000

/* What a caller may see of one reserve (bucket_reserves). */
typedef struct RbReserveInfo
{
	char		endpoint[RB_RESERVE_MAX_ENDPOINT + 1];
	double		tokens;			/* ready to draw */
	double		pending;		/* moved by refills not yet committed */
	double		drawn;			/* drawn by takes not yet committed */
	double		batch;
	double		rate;			/* the limits its tokens were moved under */
	double		capacity;
	int64		draws;			/* committed draws since it was made */
	double		tokens_drawn;
	int64		refills;		/* committed refills */
	int64		drains;			/* times emptied by feedback or a change */
	TimestampTz created_at;
	TimestampTz last_refill_at;
} RbReserveInfo;

extern void rb_reserve_init(void);
extern bool rb_reserve_available(void);
extern bool rb_reserve_known(void);

/* storage.c: every row read and written */
extern void rb_reserve_read(RbBucket *bucket, Oid relid);
extern void rb_reserve_written(const RbBucket *bucket);

/* the take's two sides */
extern bool rb_reserve_draw(text *endpoint, Oid relid, bool use_config,
							double rate, double capacity, double want,
							int64 upto, bool nowait, double *granted,
							double *remaining);
extern double rb_reserve_wait(text *endpoint, Oid relid, bool use_config,
							  double rate, double capacity, double want,
							  int64 upto, double wait);
extern double rb_reserve_cut(RbBucket *bucket, TimestampTz now, bool here);
extern void rb_reserve_hand(RbBucket *bucket, Oid relid, double tokens,
							bool use_config, double req_rate,
							double req_capacity, TimestampTz now);

/* administration */
extern void rb_reserve_forget(text *endpoint, Oid relid);
extern int	rb_reserve_list(Oid relid, RbReserveInfo **infos);

#endif							/* RATEBUCKET_BUCKET_RESERVE_H */
