/*-------------------------------------------------------------------------
 *
 * ratebucket.h
 *	  Declarations shared by the SQL-callable parts of ratebucket.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_H
#define RATEBUCKET_H

#include "storage.h"

/* take.c */
extern void rb_new_bucket(RbBucket *bucket, double rate, double capacity,
						  TimestampTz now);

#endif							/* RATEBUCKET_H */
