/*-------------------------------------------------------------------------
 *
 * ratebucket.h
 *	  Declarations shared by the SQL-callable parts of ratebucket.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_H
#define RATEBUCKET_H

#include "fmgr.h"
#include "access/tupdesc.h"

#include "storage.h"

/* ratebucket.c */
extern TupleDesc rb_result_tupdesc(FunctionCallInfo fcinfo);

/* feedback.c */
extern void rb_bucket_policy(const RbBucket *bucket, double ceiling,
							 RbPolicy *policy);
extern double rb_bucket_ceiling(const RbBucket *bucket);

/* take.c */
extern void rb_new_bucket(RbBucket *bucket, double rate, double capacity,
						  TimestampTz now);
extern void rb_not_configured(text *endpoint, bool explicit) pg_attribute_noreturn();
extern int64 rb_peek_grantable(text *endpoint, int64 upto);
extern bool rb_peek_grantable_configured(text *endpoint, int64 upto,
										 int64 *granted);
extern RbTakeResult rb_take_upto_configured(text *endpoint, int64 upto,
											bool nowait, int64 *granted);
extern RbTakeResult rb_take_upto_held(RbBucket *bucket, text *endpoint,
									  int64 upto, TimestampTz now,
									  int64 *granted);
extern void rb_bucket_quota_window(const RbBucket *bucket, TimestampTz at,
								   TimestampTz *start, TimestampTz *end);

#endif							/* RATEBUCKET_H */
