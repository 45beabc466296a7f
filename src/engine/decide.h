/*-------------------------------------------------------------------------
 *
 * decide.h
 *	  A take decided on one bucket row in memory (decide.c), for the
 *	  engine's takes: take.c, striped.c and batch.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_ENGINE_DECIDE_H
#define RATEBUCKET_ENGINE_DECIDE_H

#include "engine/engine.h"

extern bool rb_decide_request(RbBucket *bucket, const RbTakeRequest *req,
							  TimestampTz now, RbTakeResult *result,
							  bool *write, double *granted,
							  double *rate, double *capacity);
extern bool rb_peek_refuses(RbBucket *peeked, const RbTakeRequest *req,
							RbTakeResult *result);
extern bool rb_take_peeked(RbBucket *bucket, const RbTakeRequest *req,
						   RbTakeResult *result, double *granted);
extern void rb_take_locked(RbBucket *bucket, text *endpoint,
						   const RbTakeRequest *req, RbTakeResult *result,
						   double *granted);
extern void rb_take_write(RbBucket *bucket, const RbTakeRequest *req,
						  double rate, double capacity, RbTakeResult *result,
						  double *granted);
extern void rb_take_refilled(RbBucket *bucket, const RbTakeRequest *req,
							 double moved, RbTakeResult *result,
							 TimestampTz now);
extern RbTakeResult rb_take_upto_held(RbBucket *bucket, text *endpoint,
									  int64 upto, TimestampTz now,
									  int64 *granted);

#endif							/* RATEBUCKET_ENGINE_DECIDE_H */
