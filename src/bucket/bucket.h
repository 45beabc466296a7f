/*-------------------------------------------------------------------------
 *
 * bucket.h
 *	  The bucket: one row of ratebucket.buckets as the C code sees it, its
 *	  constructor, the policy and limits in force for it, and the decision
 *	  of a take on it at a given time (bucket.c).
 *
 * Above the pure core (core/), which knows tokens, adaptation and quotas
 * as separate states, a bucket is the whole row: limits, configuration,
 * state, feedback and counters.  Everything here works on a row in memory;
 * reading and writing rows is storage.h's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_BUCKET_H
#define RATEBUCKET_BUCKET_BUCKET_H

#include "postgres.h"

#include <math.h>

#include "storage/itemptr.h"
#include "utils/timestamp.h"

#include "core/adapt.h"
#include "core/arith.h"
#include "core/feedback.h"

/* Longest endpoint accepted, in bytes (doc/api.md). */
#define RB_MAX_ENDPOINT_BYTES 1024

/* Limits accepted for a rate (tokens per second) and a capacity. */
#define RB_MIN_RATE 1e-9
#define RB_MAX_RATE 1e12
#define RB_MAX_CAPACITY 1e12

/* Room for a text column of RbBucket, terminating NUL included. */
#define RB_TEXT_LEN 256

/*
 * What of a row the events watch (bucket/events.c), as it was read: a row
 * read by storage records it, so that its write can tell what changed.
 * valid is false for a row not read from the table (a new one): then
 * nothing was set.
 */
typedef struct RbEventState
{
	bool		valid;
	bool		quota_spent;	/* a quota with less than one token left */
	int64		refilled_at;	/* for a quota: in which window */
	int64		open_until;		/* the breaker's (RB_NO_TIME: closed) */
	int64		at_floor_since;
	int64		paused_until;
} RbEventState;

/*
 * The endpoint's token reserve as a read of its row found it (reserve.c):
 * found is false if it has none.  saved_* are the draws a refill counts
 * into the row; leased is set when the refill also leases the row's refill
 * to the reserve.
 */
typedef struct RbReserveRef
{
	bool		found;
	bool		leased;
	int			slot;
	uint64		incarnation;
	uint64		generation;
	int64		saved_takes;
	double		saved_tokens;
} RbReserveRef;

/*
 * One bucket row.  A NULL column reads as NaN (for float8), -1 (for int4),
 * RB_NO_TIME (for timestamptz) or "" (for text), and is written back as
 * NULL.
 */
typedef struct RbBucket
{
	ItemPointerData tid;		/* where the row is (after a peek or a lock) */
	text	   *key;			/* its endpoint, as the peek or lock was given */
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
	RbFeedbackCounters feedback;	/* what bucket_observe counts */
	/* calendar quota (bucket_configure_quota); "" for a rate bucket */
	char		quota_period[RB_TEXT_LEN];
	char		quota_time_zone[RB_TEXT_LEN];
	/* the template that configured it (bucket_template); "" if none */
	char		template_name[RB_TEXT_LEN];
	/* tokens a refill of its reserve moves (bucket_reserve); -1: none */
	int32		reserve_batch;
	/* not a column: its reserve, as storage read it */
	RbReserveRef reserve;
	/* not a column: what the events watch, as storage read it */
	RbEventState as_read;
} RbBucket;

/*
 * A configuration (bucket_configure, or a template's): NaN or -1 where the
 * ratebucket.* setting applies.
 */
typedef struct RbConfig
{
	double		rate;
	double		capacity;
	double		floor_rate;
	double		throttle_factor;
	double		recovery_factor;
	int32		breaker_failures;
} RbConfig;

#define rb_is_configured(bucket) (!isnan((bucket)->conf_rate))
#define rb_is_quota(bucket) ((bucket)->quota_period[0] != '\0')
#define rb_follows_template(bucket) ((bucket)->template_name[0] != '\0')
#define rb_has_reserve(bucket) ((bucket)->reserve_batch > 0)

extern void rb_new_bucket(RbBucket *bucket, double rate, double capacity,
						  TimestampTz now);
extern void rb_bucket_configure(RbBucket *bucket, const RbConfig *config,
								const char *template_name, TimestampTz now);
extern double rb_bucket_ceiling(const RbBucket *bucket);
extern void rb_bucket_policy(const RbBucket *bucket, double ceiling,
							 RbPolicy *policy);
extern void rb_bucket_bank(RbBucket *bucket, TimestampTz now);
extern double rb_bucket_capacity_now(const RbBucket *bucket, TimestampTz now);
extern double rb_bucket_rate_now(const RbBucket *bucket, TimestampTz now);
extern void rb_bucket_hold_out(RbBucket *bucket, double held, TimestampTz now);
extern void rb_bucket_quota_window(const RbBucket *bucket, TimestampTz at,
								   TimestampTz *start, TimestampTz *end);
extern bool rb_bucket_limits(const RbBucket *bucket, bool use_config,
							 double *rate, double *capacity);
extern RbTakeResult rb_bucket_decide(RbBucket *bucket, double rate,
									 double capacity, double want, int64 upto,
									 TimestampTz now, bool *write,
									 double *granted);
extern void rb_bucket_settle(RbBucket *bucket, TimestampTz now);
extern void rb_bucket_count_grant(RbBucket *bucket, double granted,
								  TimestampTz now);
extern void rb_bucket_check_fits(double tokens, double capacity);
/* PostgreSQL 18 marks a function that does not return with pg_noreturn,
 * before the declaration, in place of pg_attribute_noreturn() after it. */
#if PG_VERSION_NUM >= 180000
pg_noreturn extern void rb_bucket_not_configured(text *endpoint, bool explicit);
#else
extern void rb_bucket_not_configured(text *endpoint, bool explicit) pg_attribute_noreturn();
#endif

/* What bucket_now reports of a row at a time. */
typedef struct RbBucketNow
{
	double		tokens;
	double		effective_rate;
	double		cooldown_seconds;
	bool		paused;
	RbBreakerState breaker;
	double		breaker_seconds;
	bool		at_floor;
	TimestampTz at_floor_since; /* when at_floor */
	bool		expirable;
} RbBucketNow;

extern void rb_bucket_now(const RbBucket *bucket, TimestampTz at,
						  RbBucketNow *now);
extern bool rb_bucket_quota_now(const RbBucket *bucket, TimestampTz at,
								double *used, double *left,
								TimestampTz *start, TimestampTz *end);

#endif							/* RATEBUCKET_BUCKET_BUCKET_H */
