/*-------------------------------------------------------------------------
 *
 * feedback.h
 *	  The feedback policy as pure functions (feedback.c): the policy in
 *	  force for a bucket, and the whole decision bucket_observe makes from
 *	  what a destination answered.
 *
 * Nothing here calls PostgreSQL.  The engine locks the row, reads the
 * clock, and hands the row's state to rb_feedback_observe; the fuzzer
 * (test/fuzz/fuzz_arith.c) calls the same function.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_FEEDBACK_H
#define RATEBUCKET_CORE_FEEDBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/adapt.h"
#include "core/arith.h"
#include "core/headers.h"

/*
 * The defaults of the policy, in the units of the ratebucket.* settings
 * that hold them (bucket/settings.c).
 */
typedef struct RbSettings
{
	double		throttle_factor;
	double		floor_fraction;
	double		return_fraction;
	int			return_time_ms;
	double		recovery_factor;
	int			recovery_interval_s;
	int			default_cooldown_ms;
	int			min_cooldown_ms;
	int			max_cooldown_ms;
	int			breaker_failures;
	int			breaker_open_ms;
	int			breaker_max_open_ms;
} RbSettings;

/* A bucket's own overrides of those defaults: NaN or -1 where it has none. */
typedef struct RbOverrides
{
	double		floor_rate;
	double		throttle_factor;
	double		recovery_factor;
	int32_t		breaker_failures;
} RbOverrides;

/*
 * What a destination answered, as the worker received it.  Each header
 * field is its text (NULL when absent); RateLimit and RateLimit-Policy
 * with the lines of a list already joined.  limit, remaining and reset are
 * X-RateLimit-Limit, -Remaining and -Reset (or the RateLimit-Limit ...
 * fields of the older drafts where the X- ones are absent).
 */
typedef struct RbResponse
{
	int			status;
	bool		has_status;		/* false: no response at all (SQL NULL) */
	const char *ratelimit;
	size_t		ratelimit_len;
	const char *policy;
	size_t		policy_len;
	const char *limit;
	size_t		limit_len;
	const char *remaining;
	size_t		remaining_len;
	const char *reset;
	size_t		reset_len;
	const char *retry_after;
	size_t		retry_after_len;
	bool		retry_after_bad;	/* given, but not as text */
	int			bad_fields;		/* other fields given, but not as text */
	int64_t		sent_at;		/* when the request was sent, on the clock
								 * of the takes; RB_NO_TIME: not known */
} RbResponse;

/* The counters of ratebucket.buckets that feedback moves. */
typedef struct RbFeedbackCounters
{
	int64_t		successes;
	int64_t		failures;
	int64_t		throttles;
	int64_t		cooldowns;
	int64_t		breaker_opens;
	int64_t		malformed_headers;
	int32_t		last_status;	/* -1: never observed */
	int64_t		last_observed_at;	/* RB_NO_TIME: never */
} RbFeedbackCounters;

/* What bucket_observe reports, and what the engine must carry further. */
typedef struct RbObservation
{
	RbOutcome	outcome;
	double		cooldown_seconds;	/* left of the cooldown now; 0: none */
	double		effective_rate; /* ceiling times the factor now */
	RbBreakerState breaker;
	bool		adapt_changed;	/* what a take is told changed */
} RbObservation;

extern void rb_policy_resolve(const RbSettings *settings,
							  const RbOverrides *overrides, double ceiling,
							  RbPolicy *policy);
extern void rb_read_response(const RbResponse *response, double now_unix,
							 RbRateLimit *rl, RbRetryAfterKind *ra_kind,
							 double *ra_value);
extern RbOutcome rb_response_outcome(const RbResponse *response,
									 double now_unix);
/*
 * The bucket an answer is applied to, as the engine found it.  ceiling and
 * capacity are what the feedback is measured against (the configuration,
 * if any); refill_rate and refill_capacity are what the row's tokens refill
 * at, before the answer: the limits of the take that last wrote it, with
 * the feedback's factor (lower than the configuration for a take with
 * limits of its own).
 */
typedef struct RbObserved
{
	double		ceiling;		/* the rate its takes use */
	double		capacity;		/* the capacity its takes use */
	double		refill_rate;	/* the row's refill rate now */
	double		refill_capacity;	/* the row's capacity now */
	bool		is_quota;		/* a calendar quota: no rate to adapt */
	bool		holds_tokens;	/* false: its tokens live elsewhere (stripes) */
} RbObserved;

extern void rb_feedback_observe(RbState *state, RbAdapt *adapt,
								RbFeedbackCounters *counters,
								const RbPolicy *policy,
								const RbObserved *bucket,
								const RbResponse *response,
								int64_t now, double now_unix,
								RbObservation *out);
extern bool rb_adapt_changed(const RbAdapt *before, const RbAdapt *after,
							 const RbPolicy *policy, int64_t now);

#endif							/* RATEBUCKET_CORE_FEEDBACK_H */
