/*-------------------------------------------------------------------------
 *
 * inflight.h
 *	  In-flight caps: at most N deliveries of a key at once, each holding a
 *	  slot until its outcome is recorded or its lease runs out (inflight.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_INFLIGHT_H
#define RATEBUCKET_BUCKET_INFLIGHT_H

#include "postgres.h"

#include "utils/array.h"
#include "utils/timestamp.h"

/* Longest key accepted, in bytes (as an endpoint). */
#define RB_MAX_INFLIGHT_KEY_BYTES 1024

extern void rb_inflight_configure(text *key, int32 cap, Interval *lease);
extern int	rb_inflight_acquire(text *key, int32 n, MemoryContext cxt,
								int64 **slots);
extern int	rb_inflight_release(text *key, ArrayType *slots);
extern int	rb_inflight_renew(text *key, ArrayType *slots, Interval *lease);
extern bool rb_inflight_drop(text *key);
extern char *rb_inflight_missing(char **keys, int n);
extern void rb_inflight_check_acquire(Oid roleid);

#endif							/* RATEBUCKET_BUCKET_INFLIGHT_H */
