/*-------------------------------------------------------------------------
 *
 * args.h
 *	  Checks of the SQL functions' arguments (args.c), each raising a
 *	  class-22 error when it fails, before any row is touched.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_API_ARGS_H
#define RATEBUCKET_API_ARGS_H

#include "postgres.h"
#include "fmgr.h"

#include "pgtime.h"

#include "bucket/bucket.h"
#include "core/quota.h"

extern text *rb_arg_endpoint(FunctionCallInfo fcinfo, int argno);
extern void rb_check_endpoint(text *endpoint);
extern void rb_check_tokens_value(double v);
extern double rb_arg_rate(FunctionCallInfo fcinfo, int argno);
extern double rb_arg_capacity(FunctionCallInfo fcinfo, int argno);
extern double rb_arg_tokens(FunctionCallInfo fcinfo, int argno);
extern int32 rb_arg_count(FunctionCallInfo fcinfo, int argno, const char *what);
extern RbQuotaPeriod rb_check_quota_period(const char *name);
extern pg_tz *rb_check_quota_zone(const char *name);
extern double rb_arg_optional(FunctionCallInfo fcinfo, int argno,
							  const char *what, double lo, bool lo_inclusive,
							  double hi);
extern void rb_arg_config(FunctionCallInfo fcinfo, int argno, RbConfig *config);

#endif							/* RATEBUCKET_API_ARGS_H */
