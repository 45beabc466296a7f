/*-------------------------------------------------------------------------
 *
 * events.h
 *	  The events a bucket row's changes send (events.c): NOTIFY on the
 *	  channel ratebucket_events, with a JSON payload, from the transaction
 *	  that wrote the change.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_EVENTS_H
#define RATEBUCKET_BUCKET_EVENTS_H

#include "postgres.h"

#include "bucket/bucket.h"

/* The channel every event is sent on (doc/events.md). */
#define RB_EVENTS_CHANNEL "ratebucket_events"

extern void rb_events_read(RbBucket *bucket);
extern void rb_events_written(text *key, const RbBucket *bucket);

#endif							/* RATEBUCKET_BUCKET_EVENTS_H */
