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
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "api/result.h"

/*
 * The row types of the functions returning a row, blessed, by function:
 * built on a function's first call in the backend and kept until any
 * pg_proc row changes (a redefinition could change the type), or, for a
 * named row type, until its relation changes (ALTER TYPE).  fn_extra alone
 * would not do: a function in FROM gets a new one at every execution.
 */
#define RB_RESULT_TYPES 32

typedef struct RbResultType
{
	Oid			fn_oid;
	Oid			typrelid;		/* a named row type's relation, or InvalidOid */
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
 * A relation changed: if it is a cached named row type's (or any, for
 * InvalidOid), forget the cache at the next lookup, as above.
 */
static void
rb_result_types_reset_rel(Datum arg pg_attribute_unused(), Oid relid)
{
	int			i;

	for (i = 0; i < n_result_types; i++)
		if (relid == InvalidOid || result_types[i].typrelid == relid)
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
		CacheRegisterRelcacheCallback(rb_result_types_reset_rel, (Datum) 0);
		result_types_callback = true;
	}
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	MemoryContextSwitchTo(oldcxt);
	result_types[n_result_types].fn_oid = fn_oid;
	result_types[n_result_types].typrelid =
		tupdesc->tdtypeid == RECORDOID ? InvalidOid : get_typ_typrelid(tupdesc->tdtypeid);
	result_types[n_result_types].tupdesc = tupdesc;
	n_result_types++;
	return tupdesc;
}

/*
 * rb_result_tupdesc_of
 *		rb_result_tupdesc of a function that returns a named row type, after
 *		checking that the type still has the columns the C code fills, in
 *		order: its owner could have altered it (ALTER TYPE), which a list of
 *		OUT parameters cannot be.
 */
TupleDesc
rb_result_tupdesc_of(FunctionCallInfo fcinfo, int natts, const Oid *types)
{
	TupleDesc	tupdesc = rb_result_tupdesc(fcinfo);
	bool		ok = tupdesc->natts == natts;
	int			i;

	for (i = 0; ok && i < natts; i++)
		ok = !TupleDescAttr(tupdesc, i)->attisdropped &&
			TupleDescAttr(tupdesc, i)->atttypid == types[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("function %s returns type %s, which is not as ratebucket defines it",
						format_procedure(fcinfo->flinfo->fn_oid),
						format_type_be(tupdesc->tdtypeid)),
				 errdetail("It has been altered since the extension created it."),
				 errhint("Alter it back, or drop and create the extension again.")));
	return tupdesc;
}
