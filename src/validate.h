/*-------------------------------------------------------------------------
 *
 * validate.h
 *	  Checks of user input, each raising a class-22 error when it fails.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_VALIDATE_H
#define RATEBUCKET_VALIDATE_H

#include "postgres.h"
#include "fmgr.h"

#include "quota.h"

/* Longest endpoint accepted, in bytes (documented in the README). */
#define RB_MAX_ENDPOINT_BYTES 1024

/* Limits accepted for a rate (tokens per second) and a capacity. */
#define RB_MIN_RATE 1e-9
#define RB_MAX_RATE 1e12
#define RB_MAX_CAPACITY 1e12

extern text *rb_arg_endpoint(FunctionCallInfo fcinfo, int argno);
extern void rb_check_endpoint(text *endpoint);
extern void rb_check_tokens_value(double v);
extern double rb_arg_rate(FunctionCallInfo fcinfo, int argno);
extern double rb_arg_capacity(FunctionCallInfo fcinfo, int argno);
extern double rb_arg_tokens(FunctionCallInfo fcinfo, int argno);
extern int32 rb_arg_count(FunctionCallInfo fcinfo, int argno, const char *what);
extern void rb_check_tokens_fit(double tokens, double capacity);
extern RbQuotaPeriod rb_check_quota_period(const char *name);
extern pg_tz *rb_check_quota_zone(const char *name);
extern double rb_arg_optional(FunctionCallInfo fcinfo, int argno,
							  const char *what, double lo, bool lo_inclusive,
							  double hi);

#endif							/* RATEBUCKET_VALIDATE_H */
