/*-------------------------------------------------------------------------
 *
 * ratebucket.c
 *	  Module entry point: PG_MODULE_MAGIC and a thin _PG_init.
 *
 * ratebucket needs no shared memory and no background worker, so it does
 * not need shared_preload_libraries: the library loads on the first call.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "utils/memutils.h"

#include "guc.h"
#include "ratebucket.h"
#include "storage.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * _PG_init
 *		Define the ratebucket.* settings and initialise each part.
 */
void
_PG_init(void)
{
	rb_guc_init();
	rb_storage_init();
}

/*
 * rb_result_tupdesc
 *		The row type a SQL-callable function returns, blessed, built once per
 *		call site and kept in fn_extra: every function returning a record
 *		uses it, so none pays for the lookup on every call.
 */
TupleDesc
rb_result_tupdesc(FunctionCallInfo fcinfo)
{
	TupleDesc	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;

	if (tupdesc == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("function returning record called in context that cannot accept type record")));
		tupdesc = BlessTupleDesc(tupdesc);
		fcinfo->flinfo->fn_extra = tupdesc;
		MemoryContextSwitchTo(oldcxt);
	}
	return tupdesc;
}
