/*-------------------------------------------------------------------------
 *
 * direct.h
 *	  Bucket rows through the index and the heap, without SQL (direct.c):
 *	  used by storage.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_DIRECT_H
#define RATEBUCKET_BUCKET_DIRECT_H

#include "postgres.h"

#include "storage/itemptr.h"

/* Most columns storage.c may hand over. */
#define RB_DIRECT_MAX_COLUMNS 64

/* A column storage.c reads and writes (besides endpoint), and its type. */
typedef struct RbDirectColumn
{
	const char *name;
	Oid			type;
} RbDirectColumn;

typedef enum RbDirectMode
{
	RB_DIRECT_PEEK,				/* read the row as last committed */
	RB_DIRECT_LOCK,				/* lock it, waiting for a holder */
	RB_DIRECT_LOCK_SKIP			/* lock it unless another transaction holds it */
} RbDirectMode;

typedef enum RbFindResult
{
	RB_NOT_FOUND,
	RB_FOUND,
	RB_LOCKED					/* held by another transaction (LOCK_SKIP) */
} RbFindResult;

extern void rb_direct_init(void);
extern bool rb_direct_begin(Oid relid, const RbDirectColumn *columns,
							int ncolumns, bool peek_only);
extern void rb_direct_end(void);
extern RbFindResult rb_direct_find(text *endpoint, RbDirectMode mode,
								   ItemPointer tid, Datum *values, bool *nulls);
extern bool rb_direct_update(ItemPointer tid, const Datum *values,
							 const bool *nulls, bool wait);

#endif							/* RATEBUCKET_BUCKET_DIRECT_H */
