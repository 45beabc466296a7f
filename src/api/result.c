/*-------------------------------------------------------------------------
 *
 * result.c
 *	  The row types of the SQL functions returning a record, blessed and
 *	  cached per function.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "api/result.h"

/*
 * The row types of the functions returning a row, blessed, by function:
 * built on a function's first call in the backend and kept until any
 * pg_proc row changes (a redefinition could change the type).  fn_extra
 * alone would not do: a function in FROM gets a new one at every execution.
 * A named row type can also change without its functions (ALTER TYPE):
 * rb_result_tupdesc_of checks it.
 */
#define RB_RESULT_TYPES 32

typedef struct RbResultType
{
	Oid			fn_oid;
	TupleDesc	tupdesc;
} RbResultType;

static RbResultType result_types[RB_RESULT_TYPES];
static int	n_result_types = 0;
static bool result_types_stale = false;
static bool result_types_callback = false;

/*
 * A function was created, altered or dropped: forget every cached row type
 * at the next lookup.  Not here: invalidations arrive whenever a relation
 * is opened, and a caller may still be using a row type it was given.
 */
static void
rb_result_types_reset(Datum arg pg_attribute_unused(),
					  int cacheid pg_attribute_unused(),
					  uint32 hashvalue pg_attribute_unused())
{
	result_types_stale = true;
}

/*
 * rb_result_tupdesc
 *		The row type a SQL-callable function returns, blessed: every function
 *		returning a row uses it, so none pays for the lookup on every call.
 */
TupleDesc
rb_result_tupdesc(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	TupleDesc	tupdesc;
	MemoryContext oldcxt;
	int			i;

	if (result_types_stale)
	{
		for (i = 0; i < n_result_types; i++)
			FreeTupleDesc(result_types[i].tupdesc);
		n_result_types = 0;
		result_types_stale = false;
	}
	for (i = 0; i < n_result_types; i++)
		if (result_types[i].fn_oid == fn_oid)
			return result_types[i].tupdesc;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("function returning record called in context that cannot accept type record")));
	if (n_result_types == RB_RESULT_TYPES)
		return BlessTupleDesc(tupdesc);		/* not expected: more functions than slots */

	if (!result_types_callback)
	{
		CacheRegisterSyscacheCallback(PROCOID, rb_result_types_reset, (Datum) 0);
		result_types_callback = true;
	}
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	MemoryContextSwitchTo(oldcxt);
	result_types[n_result_types].fn_oid = fn_oid;
	result_types[n_result_types].tupdesc = tupdesc;
	n_result_types++;
	return tupdesc;
}

/* Has the row type these columns, in order? */
static bool
rb_result_is(TupleDesc tupdesc, int natts, const Oid *types)
{
	int			i;

	if (tupdesc == NULL || tupdesc->natts != natts)
		return false;
	for (i = 0; i < natts; i++)
		if (TupleDescAttr(tupdesc, i)->attisdropped ||
			TupleDescAttr(tupdesc, i)->atttypid != types[i])
			return false;
	return true;
}

/*
 * rb_result_tupdesc_of
 *		rb_result_tupdesc of a function that returns a row of these columns,
 *		checked.  A named row type's owner can alter it (ALTER TYPE), which a
 *		list of OUT parameters cannot be, and the cache above does not hear
 *		of that: the type as the type cache has it now must have the
 *		columns, and so must the cached one (else it is built again).
 */
TupleDesc
rb_result_tupdesc_of(FunctionCallInfo fcinfo, int natts, const Oid *types)
{
	TupleDesc	tupdesc = rb_result_tupdesc(fcinfo);
	bool		ok = true;

	if (tupdesc->tdtypeid != RECORDOID)
	{
		ok = rb_result_is(lookup_type_cache(tupdesc->tdtypeid, TYPECACHE_TUPDESC)->tupDesc,
						  natts, types);
		if (ok && !rb_result_is(tupdesc, natts, types))
		{
			result_types_stale = true;
			tupdesc = rb_result_tupdesc(fcinfo);
		}
	}
	if (!ok || !rb_result_is(tupdesc, natts, types))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("function %s returns type %s, which is not as ratebucket defines it",
						format_procedure(fcinfo->flinfo->fn_oid),
						format_type_be(tupdesc->tdtypeid)),
				 errdetail("It has been altered since the extension created it."),
				 errhint("Alter it back, or drop and create the extension again.")));
	return tupdesc;
}
