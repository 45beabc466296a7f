/*-------------------------------------------------------------------------
 *
 * arith.h
 *	  Token-bucket arithmetic as pure functions of (state, limits, now).
 *
 * Nothing here calls PostgreSQL: times are microseconds since any fixed
 * epoch (PostgreSQL's TimestampTz fits), rates are tokens per second.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_CORE_ARITH_H
#define RATEBUCKET_CORE_ARITH_H

#include <stdbool.h>
#include <stdint.h>

#define RB_USECS_PER_SEC 1000000.0

/* The state a bucket row stores. */
typedef struct RbState
{
	double		tokens;			/* tokens held at refilled_at */
	int64_t		refilled_at;	/* clock of the last refill, microseconds */
} RbState;

/* What a take decided. */
typedef struct RbTakeResult
{
	bool		allowed;
	double		remaining;		/* tokens left after the take (or the refill) */
	double		wait_seconds;	/* 0 when allowed */
} RbTakeResult;

extern double rb_refill(double tokens, double rate, double capacity,
						int64_t refilled_at, int64_t now);
extern void rb_advance(RbState *state, double rate, double capacity,
					   int64_t now);
extern RbTakeResult rb_take(RbState *state, double rate, double capacity,
							double want, int64_t now);
extern double rb_wait_seconds(double have, double want, double rate);

#endif							/* RATEBUCKET_CORE_ARITH_H */
