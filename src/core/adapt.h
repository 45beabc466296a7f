/*-------------------------------------------------------------------------
 *
 * adapt.h
 *	  What destinations answer, as pure functions: outcomes, cooldowns, the
 *	  effective rate (lowered on 429, bounded by a floor, recovering toward
 *	  the ceiling), pause, and the circuit breaker.
 *
 * Like arith.h, nothing here calls PostgreSQL.  Times are microseconds on
 * the same clock as RbState; RB_NO_TIME stands for "not set".
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_ADAPT_H
#define RATEBUCKET_CORE_ADAPT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/arith.h"

#define RB_NO_TIME INT64_MIN
#define RB_FOREVER INT64_MAX	/* an open-ended pause (PostgreSQL's infinity) */

/* The settings in force for one bucket (defaults, or its configuration). */
typedef struct RbPolicy
{
	double		throttle_factor;	/* rate multiplier on a 429, (0, 1] */
	double		floor_factor;	/* lowest rate factor, (0, 1] */
	double		return_fraction;	/* of the rate a 429 was sent at: the
									 * level the rate returns to, (0, 1] */
	double		return_time;	/* seconds to return there, > 0 */
	double		recovery_factor;	/* growth above it per recovery_interval,
									 * >= 1 */
	double		recovery_interval;	/* seconds */
	int64_t		default_cooldown;	/* usecs, when no usable Retry-After */
	int64_t		min_cooldown;	/* usecs */
	int64_t		max_cooldown;	/* usecs */
	int			breaker_failures;	/* consecutive failures to open; 0 never */
	int64_t		breaker_open;	/* usecs, first open period */
	int64_t		breaker_max_open;	/* usecs, longest open period */
} RbPolicy;

/*
 * The adaptation state a bucket row stores.  The rate factor follows a
 * curve that the last throttle episode set (rb_curve_now): rate_factor
 * until factor_at, a concave return to target_factor within return_time,
 * then a slow convex climb above it.  NaN stands for "none" in the factors
 * a row may lack (a row that no episode has touched, or one written before
 * they existed).
 */
typedef struct RbAdapt
{
	double		rate_factor;	/* multiplier on the ceiling, from factor_at */
	int64_t		factor_at;		/* when the return to target_factor starts:
								 * the end of the episode's cooldown */
	double		target_factor;	/* the level it returns to; NaN: rate_factor */
	double		burst_factor;	/* multiplier on the capacity at factor_at,
								 * growing back like the rate; NaN: 1 */
	double		limit_factor;	/* a published rate over the ceiling; NaN:
								 * none published */
	double		limit_burst_factor; /* a published burst over the capacity;
									 * NaN: none */
	int64_t		cooldown_until; /* takes refused until then */
	int64_t		cooldown_from;	/* when that cooldown (or the last) began */
	double		lockout_seconds;	/* how long the last lock-out kept the
									 * destination closed; NaN: none seen */
	int64_t		at_floor_since; /* when the factor last hit the floor */
	int64_t		paused_until;	/* paused by hand until then (may be far) */
	int32_t		failure_run;	/* consecutive failures */
	int32_t		breaker_trips;	/* trips since the breaker last closed */
	int64_t		open_until;		/* breaker open until; RB_NO_TIME closed */
	int64_t		probe_at;		/* half-open probe let through at */
} RbAdapt;

/* What a response means for the bucket (doc/feedback.md, the outcome table). */
typedef enum RbOutcome
{
	RB_OUTCOME_SUCCESS,			/* 2xx */
	RB_OUTCOME_THROTTLED,		/* 429: cooldown, and the rate goes down */
	RB_OUTCOME_UNAVAILABLE,		/* 503 with Retry-After: cooldown */
	RB_OUTCOME_FAILURE,			/* 5xx, 408, no response: for the breaker */
	RB_OUTCOME_NEUTRAL			/* other statuses: the request's own fault */
} RbOutcome;

/* Why a take is refused before its tokens are even looked at. */
typedef enum RbGateReason
{
	RB_GATE_OPEN,				/* nothing stops the take */
	RB_GATE_PAUSED,
	RB_GATE_COOLDOWN,
	RB_GATE_BREAKER_OPEN,
	RB_GATE_PROBE_IN_FLIGHT,	/* half-open, a probe is out already */
	RB_GATE_PROBE				/* half-open, this take may be the probe */
} RbGateReason;

typedef enum RbBreakerState
{
	RB_BREAKER_CLOSED,
	RB_BREAKER_OPEN,
	RB_BREAKER_HALF_OPEN
} RbBreakerState;

extern void rb_adapt_init(RbAdapt *adapt);
extern void rb_start(RbState *state, RbAdapt *adapt, double capacity,
					 int64_t now);
extern RbOutcome rb_classify(int status, bool has_status, bool has_retry_after);
extern const char *rb_outcome_name(RbOutcome outcome);
extern double rb_curve_now(const RbAdapt *adapt, const RbPolicy *policy,
						   int64_t now);
extern double rb_factor_now(const RbAdapt *adapt, const RbPolicy *policy,
							int64_t now);
extern double rb_burst_fraction(const RbAdapt *adapt, const RbPolicy *policy,
								int64_t now);
extern double rb_capacity_now(const RbAdapt *adapt, const RbPolicy *policy,
							  double capacity, double want, int64_t now);
extern bool rb_at_floor(const RbAdapt *adapt, const RbPolicy *policy,
						int64_t now);
extern void rb_adapt_settle(RbAdapt *adapt, const RbPolicy *policy,
							int64_t now);
extern RbBreakerState rb_breaker_state(const RbAdapt *adapt, int64_t now);
extern const char *rb_breaker_name(RbBreakerState state);
extern RbGateReason rb_gate(const RbAdapt *adapt, const RbPolicy *policy,
							int64_t now, int64_t *until);
extern int64_t rb_clamp_cooldown(const RbPolicy *policy, double seconds);
extern void rb_cool_down(RbState *state, RbAdapt *adapt, int64_t until);
extern void rb_throttle_episode(RbAdapt *adapt, const RbPolicy *policy,
								int64_t sent, int64_t now);
extern void rb_lock_out(RbAdapt *adapt, const RbPolicy *policy, int64_t now);
extern void rb_publish_limit(RbAdapt *adapt, double rate_factor,
							 double burst_factor);
extern void rb_breaker_observe(RbAdapt *adapt, const RbPolicy *policy,
							   RbOutcome outcome, int64_t now);
extern RbTakeResult rb_decide_take(RbState *state, RbAdapt *adapt,
								   const RbPolicy *policy,
								   double stored_rate, double stored_capacity,
								   double rate, double capacity, double want,
								   int64_t now, bool *write);
extern RbTakeResult rb_decide_take_upto(RbState *state, RbAdapt *adapt,
										const RbPolicy *policy,
										double stored_rate,
										double stored_capacity,
										double rate, double capacity,
										int64_t max_want, int64_t now,
										bool *write, int64_t *granted);
extern bool rb_adapt_is_idle(const RbAdapt *adapt, const RbPolicy *policy,
							 int64_t now);

#endif							/* RATEBUCKET_CORE_ADAPT_H */
