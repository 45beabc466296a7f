/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  Finding, locking, inserting, updating and deleting bucket rows.
 *
 * All access to ratebucket.buckets from C goes through here (one door),
 * so that the strategy (direct index and heap access where it can, SPI
 * with saved plans otherwise) can change without touching the callers.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_STORAGE_H
#define RATEBUCKET_BUCKET_STORAGE_H

#include "postgres.h"

#include "access/htup_details.h"
#include "executor/spi.h"

#include "bucket/bucket.h"

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
extern SPIPlanPtr rb_spi_plan(SPIPlanPtr *plan, const char *sql, int nargs,
							  Oid *argtypes);
extern bool rb_is_distributed(Oid relid);
extern Oid	rb_storage_relid(void);
extern Oid	rb_storage_table(void);
extern bool rb_storage_distributed(void);
extern void rb_lock_shard_of(SPIPlanPtr *plan, const char *relation, text *key);

#endif							/* RATEBUCKET_BUCKET_STORAGE_H */
