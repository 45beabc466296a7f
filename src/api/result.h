/*-------------------------------------------------------------------------
 *
 * result.h
 *	  The row types of the SQL functions returning a row (result.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_API_RESULT_H
#define RATEBUCKET_API_RESULT_H

#include "postgres.h"

#include "access/tupdesc.h"
#include "fmgr.h"

extern TupleDesc rb_result_tupdesc(FunctionCallInfo fcinfo);
extern TupleDesc rb_result_tupdesc_of(FunctionCallInfo fcinfo, int natts,
									  const Oid *types);

#endif							/* RATEBUCKET_API_RESULT_H */
