/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  Finding, locking, inserting, updating and deleting bucket rows.
 *
 * All access to ratebucket.buckets from C goes through here, so that the
 * strategy (direct index and heap access where it can, SPI with saved plans
 * otherwise) can change without touching the callers.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_STORAGE_H
#define RATEBUCKET_STORAGE_H

#include "postgres.h"

#include "access/htup_details.h"
#include "storage/itemptr.h"
#include "utils/timestamp.h"

#include <math.h>

#include "adapt.h"
#include "arith.h"

/*
 * One bucket row, as the C code sees it.  A NULL column reads as NaN (for
 * float8), -1 (for int4) or RB_NO_TIME (for timestamptz), and is written
 * back as NULL.
 */
typedef struct RbBucket
{
	ItemPointerData tid;		/* where the row is (after a peek or a lock) */
	double		rate;			/* limits in force (the ceiling) */
	double		capacity;
	RbState		state;			/* tokens at refilled_at */
	RbAdapt		adapt;			/* what destinations said */
	/* configuration (bucket_configure) */
	double		conf_rate;
	double		conf_capacity;
	double		conf_floor_rate;
	double		conf_throttle_factor;
	double		conf_recovery_factor;
	int32		conf_breaker_failures;
	TimestampTz configured_at;
	/* history and counters */
	TimestampTz created_at;
	TimestampTz last_granted_at;
	int64		takes_granted;
	double		tokens_granted;
	int64		successes;
	int64		failures;
	int64		throttles;
	int64		cooldowns;
	int64		breaker_opens;
	int64		malformed_headers;
	int32		last_status;
	TimestampTz last_observed_at;
} RbBucket;

#define rb_is_configured(bucket) (!isnan((bucket)->conf_rate))

/* What rb_storage_begin saved, for rb_storage_end to restore. */
typedef struct RbStorageSession
{
	Oid			save_userid;
	int			save_sec_context;
} RbStorageSession;

extern void rb_storage_init(void);
extern void rb_storage_begin(RbStorageSession *session);
extern void rb_storage_begin_peek(RbStorageSession *session);
extern void rb_storage_end(RbStorageSession *session);
extern bool rb_storage_lock(text *endpoint, RbBucket *bucket);
extern bool rb_storage_lock_skip(text *endpoint, RbBucket *bucket);
extern bool rb_storage_peek(text *endpoint, RbBucket *bucket);
extern bool rb_storage_insert(text *endpoint, const RbBucket *bucket);
extern bool rb_storage_lock_or_insert(text *endpoint, RbBucket *bucket,
									  const RbBucket *fresh);
extern void rb_storage_update(RbBucket *bucket);
extern bool rb_storage_update_unchanged(RbBucket *bucket);
extern bool rb_storage_delete(text *endpoint);
extern void rb_storage_from_row(HeapTupleHeader row, RbBucket *bucket);

#endif							/* RATEBUCKET_STORAGE_H */
