/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  Finding, locking, inserting, updating and deleting bucket rows.
 *
 * All access to ratebucket.buckets from C goes through here, so that the
 * strategy (today SPI with saved plans) can change without touching the
 * callers.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_STORAGE_H
#define RATEBUCKET_STORAGE_H

#include "postgres.h"

#include "storage/itemptr.h"
#include "utils/timestamp.h"

#include "arith.h"

/* One bucket row, as the C code sees it. */
typedef struct RbBucket
{
	ItemPointerData tid;		/* where the row is (valid after a lock) */
	double		rate;			/* limits in force */
	double		capacity;
	RbState		state;			/* tokens at refilled_at */
	bool		configured;		/* conf_* and configured_at are set */
	double		conf_rate;
	double		conf_capacity;
	TimestampTz configured_at;
	TimestampTz created_at;
	bool		has_granted;	/* last_granted_at is set */
	TimestampTz last_granted_at;
	int64		takes_granted;
	double		tokens_granted;
} RbBucket;

/* What rb_storage_begin saved, for rb_storage_end to restore. */
typedef struct RbStorageSession
{
	Oid			save_userid;
	int			save_sec_context;
} RbStorageSession;

extern void rb_storage_init(void);
extern void rb_storage_begin(RbStorageSession *session);
extern void rb_storage_end(RbStorageSession *session);
extern bool rb_storage_lock(text *endpoint, RbBucket *bucket);
extern bool rb_storage_lock_skip(text *endpoint, RbBucket *bucket);
extern bool rb_storage_peek(text *endpoint, RbBucket *bucket);
extern bool rb_storage_insert(text *endpoint, const RbBucket *bucket);
extern bool rb_storage_lock_or_insert(text *endpoint, RbBucket *bucket,
									  const RbBucket *fresh);
extern void rb_storage_update(const RbBucket *bucket);
extern bool rb_storage_delete(text *endpoint);

#endif							/* RATEBUCKET_STORAGE_H */
