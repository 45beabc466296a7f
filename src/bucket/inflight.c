/*-------------------------------------------------------------------------
 *
 * inflight.c
 *	  In-flight caps, in ratebucket.inflight_caps (one row per key: the cap
 *	  and the lease) and ratebucket.inflight_slots (one row per delivery in
 *	  flight), through SPI with saved plans.
 *
 * A token bucket bounds how often deliveries start; a cap bounds how many
 * are out at once, for destinations that limit concurrency.  A slot is
 * acquired in the claim's transaction (so a rollback gives it back) and
 * released when the delivery's outcome is recorded; a slot whose lease ran
 * out belongs to a worker that died or hung, and the next acquire of its
 * key reclaims it, so none leaks.
 *
 * The SQL functions over these run as the extension's owner (SECURITY
 * DEFINER, with a fixed search_path), so no role needs privileges on the
 * tables; every statement names its tables and operators with their
 * schema.  bucket_take_batch acquires slots from C, as the table owner,
 * after checking that its caller could have called inflight_acquire.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "bucket/inflight.h"
#include "bucket/storage.h"

static SPIPlanPtr configure_plan = NULL;
static SPIPlanPtr lock_cap_plan = NULL;
static SPIPlanPtr reclaim_plan = NULL;
static SPIPlanPtr count_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr group_plan = NULL;
static SPIPlanPtr release_plan = NULL;
static SPIPlanPtr renew_shard_plan = NULL;
static SPIPlanPtr renew_lock_plan = NULL;
static SPIPlanPtr renew_plan = NULL;
static SPIPlanPtr drop_cap_plan = NULL;
static SPIPlanPtr drop_slots_plan = NULL;
static SPIPlanPtr missing_plan = NULL;

static void
rb_inflight_connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
rb_inflight_finish(void)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/* Run a saved plan, expecting result code "expect". */
static void
rb_inflight_exec(SPIPlanPtr plan, Datum *values, const char *nulls, int expect)
{
	int			rc = SPI_execute_plan(plan, values, nulls, false, 0);

	if (rc != expect)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
}

/*
 * rb_inflight_configure
 *		Allow at most "cap" slots of key in flight, each held for at most
 *		"lease" unless renewed (arguments checked by the caller).
 */
void
rb_inflight_configure(text *key, int32 cap, Interval *lease)
{
	Oid			argtypes[4] = {TEXTOID, INT4OID, INTERVALOID, TIMESTAMPTZOID};
	Datum		values[4];

	values[0] = PointerGetDatum(key);
	values[1] = Int32GetDatum(cap);
	values[2] = IntervalPGetDatum(lease);
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	rb_inflight_connect();
	rb_inflight_exec(rb_spi_plan(&configure_plan,
								 "INSERT INTO ratebucket.inflight_caps AS c"
								 " (key, cap, lease, configured_at) VALUES ($1, $2, $3, $4)"
								 " ON CONFLICT ON CONSTRAINT inflight_caps_pkey DO UPDATE"
								 " SET cap = excluded.cap, lease = excluded.lease,"
								 " configured_at = excluded.configured_at",
								 4, argtypes),
					 values, NULL, SPI_OK_INSERT);
	rb_inflight_finish();
}

/*
 * Lock the cap's row of key, which serialises the acquires of one key
 * until commit, and read its cap and lease; an error if there is none.  An
 * update rather than a lock: under REPEATABLE READ a concurrent acquire
 * then fails with a serialization error instead of counting the slots
 * from its older snapshot.
 */
static void
rb_inflight_lock_cap(text *key, int32 *cap, Datum *lease)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;

	values[0] = PointerGetDatum(key);
	rb_inflight_exec(rb_spi_plan(&lock_cap_plan,
								 "UPDATE ratebucket.inflight_caps AS ic SET cap = ic.cap"
								 " WHERE ic.key OPERATOR(pg_catalog.=) $1"
								 " RETURNING ic.cap, ic.lease",
								 1, argtypes),
					 values, NULL, SPI_OK_UPDATE_RETURNING);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("key \"%s\" has no in-flight cap", text_to_cstring(key)),
				 errhint("Call ratebucket.inflight_configure(key, cap) first.")));
	*cap = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
	*lease = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
						   &isnull);
}

/*
 * Reclaim the slots of key whose lease ran out by "now", and count those
 * left.  One that another transaction is deleting (a late release) is left
 * to it and counted as held: waiting for that transaction, while a claim
 * holds bucket rows its release may want next, could deadlock.
 */
static int
rb_inflight_reclaim(text *key, TimestampTz now)
{
	Oid			argtypes[2] = {TEXTOID, TIMESTAMPTZOID};
	Datum		values[2];
	bool		isnull;

	values[0] = PointerGetDatum(key);
	values[1] = TimestampTzGetDatum(now);
	rb_inflight_exec(rb_spi_plan(&reclaim_plan,
								 "DELETE FROM ratebucket.inflight_slots AS s"
								 " WHERE s.key OPERATOR(pg_catalog.=) $1"
								 " AND s.slot OPERATOR(pg_catalog.=) ANY (ARRAY("
								 "SELECT x.slot FROM ratebucket.inflight_slots AS x"
								 " WHERE x.key OPERATOR(pg_catalog.=) $1"
								 " AND x.lease_until OPERATOR(pg_catalog.<=) $2"
								 " FOR UPDATE SKIP LOCKED))",
								 2, argtypes),
					 values, NULL, SPI_OK_DELETE);
	rb_inflight_exec(rb_spi_plan(&count_plan,
								 "SELECT pg_catalog.count(*)::int"
								 " FROM ratebucket.inflight_slots AS s"
								 " WHERE s.key OPERATOR(pg_catalog.=) $1",
								 1, argtypes),
					 values, NULL, SPI_OK_SELECT);
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The first slot id of this node: slot ids come from the node's own
 * sequence, plus this.  0 on one node.  On a Citus cluster the nodes'
 * sequences run independently, and a key's slots are acquired where its
 * shard lives, on the coordinator too for calls it does not delegate: each
 * node's ids start at its Citus group id << 48, so no two nodes hand out
 * the same id, and a shard that moves keeps ids the new node never gives.
 */
static int64
rb_inflight_slot_base(void)
{
	bool		isnull;
	Datum		group;

	if (!OidIsValid(get_extension_oid("citus", true)) ||
		!OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
		return 0;
	rb_inflight_exec(rb_spi_plan(&group_plan,
								 "SELECT pg_catalog.max(g.groupid)::pg_catalog.int8"
								 " FROM pg_catalog.pg_dist_local_group AS g",
								 0, NULL),
					 NULL, NULL, SPI_OK_SELECT);
	group = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return 0;
	if (DatumGetInt64(group) < 0 || DatumGetInt64(group) >= (INT64CONST(1) << 15))
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("in-flight slot ids cannot be made unique on Citus group %lld",
						(long long) DatumGetInt64(group)),
				 errdetail("Each node's slot ids start at its group id times 2^48, which fits a group id below 32768.")));
	return (int64) ((uint64) DatumGetInt64(group) << 48);
}

/* Is ratebucket.inflight_slots distributed by Citus? */
static bool
rb_inflight_slots_distributed(void)
{
	Oid			nsp;
	Oid			relid;

	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	nsp = get_namespace_oid("ratebucket", true);
	relid = OidIsValid(nsp) ? get_relname_relid("inflight_slots", nsp) : InvalidOid;
	return OidIsValid(relid) && rb_is_distributed(relid);
}

static int
rb_int64_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * rb_inflight_acquire
 *		Acquire up to n slots of key (n >= 1), as many as its cap leaves free
 *		after reclaiming the slots whose lease ran out.  Sets *slots to their
 *		ids, in ascending order, allocated in cxt, and returns how many.
 */
int
rb_inflight_acquire(text *key, int32 n, MemoryContext cxt, int64 **slots)
{
	Oid			argtypes[5] = {TEXTOID, TIMESTAMPTZOID, INTERVALOID, INT4OID, INT8OID};
	Datum		values[5];
	int32		cap;
	Datum		lease;
	TimestampTz now;
	int			held;
	int			k;
	uint64		i;

	rb_inflight_connect();
	rb_inflight_lock_cap(key, &cap, &lease);
	now = GetCurrentTimestamp();
	held = rb_inflight_reclaim(key, now);
	k = Min(n, cap - held);
	*slots = MemoryContextAlloc(cxt, sizeof(int64) * Max(k, 1));
	if (k <= 0)
	{
		rb_inflight_finish();
		return 0;
	}

	values[0] = PointerGetDatum(key);
	values[1] = TimestampTzGetDatum(now);
	values[2] = lease;
	values[3] = Int32GetDatum(k);
	values[4] = Int64GetDatum(rb_inflight_slot_base());
	rb_inflight_exec(rb_spi_plan(&insert_plan,
								 "INSERT INTO ratebucket.inflight_slots AS s"
								 " (key, slot, acquired_at, lease_until)"
								 " OVERRIDING SYSTEM VALUE"
								 " SELECT $1, $5 OPERATOR(pg_catalog.+) pg_catalog.nextval("
								 "pg_catalog.pg_get_serial_sequence('ratebucket.inflight_slots', 'slot')::pg_catalog.regclass),"
								 " $2, $2 OPERATOR(pg_catalog.+) $3"
								 " FROM pg_catalog.generate_series(1, $4)"
								 " RETURNING s.slot",
								 5, argtypes),
					 values, NULL, SPI_OK_INSERT_RETURNING);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		(*slots)[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
												  SPI_tuptable->tupdesc, 1,
												  &isnull));
	}
	k = (int) SPI_processed;
	rb_inflight_finish();
	qsort(*slots, k, sizeof(int64), rb_int64_cmp);
	return k;
}

/*
 * rb_inflight_release
 *		Release slots of key; returns how many were still held (a slot
 *		whose lease ran out may already have been reclaimed).
 */
int
rb_inflight_release(text *key, ArrayType *slots)
{
	Oid			argtypes[2] = {TEXTOID, INT8ARRAYOID};
	Datum		values[2];
	int			n;

	values[0] = PointerGetDatum(key);
	values[1] = PointerGetDatum(slots);
	rb_inflight_connect();
	rb_inflight_exec(rb_spi_plan(&release_plan,
								 "DELETE FROM ratebucket.inflight_slots AS s"
								 " WHERE s.key OPERATOR(pg_catalog.=) $1"
								 " AND s.slot OPERATOR(pg_catalog.=) ANY ($2)",
								 2, argtypes),
					 values, NULL, SPI_OK_DELETE);
	n = (int) SPI_processed;
	rb_inflight_finish();
	return n;
}

/*
 * rb_inflight_renew
 *		Extend the lease of slots of key still held, by "lease" from now
 *		(NULL: the cap's lease).  Returns how many were renewed; an expired
 *		slot is not.
 */
int
rb_inflight_renew(text *key, ArrayType *slots, Interval *lease)
{
	Oid			argtypes[4] = {TEXTOID, INT8ARRAYOID, INTERVALOID, TIMESTAMPTZOID};
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	int			n;

	values[0] = PointerGetDatum(key);
	values[1] = PointerGetDatum(slots);
	values[2] = lease != NULL ? IntervalPGetDatum(lease) : (Datum) 0;
	if (lease == NULL)
		nulls[2] = 'n';
	rb_inflight_connect();

	/*
	 * Lock the slots first, in order, and read the clock once they are
	 * held: a slot that expired while this waited for its holder (a late
	 * release, say) is not renewed.  The clock is a parameter of the
	 * UPDATE, not a volatile call in it, which a distributed table's UPDATE
	 * could not run.
	 */
	if (rb_inflight_slots_distributed())
	{
		/*
		 * On Citus, keep the key's shard in place until commit, as a take
		 * does (bucket/storage.c, rb_lock_shard): a shard move between the
		 * lock below and the UPDATE would send the UPDATE where nothing is
		 * locked.
		 */
		rb_lock_shard_of(&renew_shard_plan, "ratebucket.inflight_slots", key);
	}
	rb_inflight_exec(rb_spi_plan(&renew_lock_plan,
								 "SELECT s.slot FROM ratebucket.inflight_slots AS s"
								 " WHERE s.key OPERATOR(pg_catalog.=) $1"
								 " AND s.slot OPERATOR(pg_catalog.=) ANY ($2)"
								 " ORDER BY s.slot FOR UPDATE OF s",
								 2, argtypes),
					 values, nulls, SPI_OK_SELECT);
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	rb_inflight_exec(rb_spi_plan(&renew_plan,
								 "UPDATE ratebucket.inflight_slots AS s"
								 " SET lease_until = $4 OPERATOR(pg_catalog.+) COALESCE($3, c.lease)"
								 " FROM ratebucket.inflight_caps AS c"
								 " WHERE c.key OPERATOR(pg_catalog.=) s.key"
								 " AND s.key OPERATOR(pg_catalog.=) $1"
								 " AND s.slot OPERATOR(pg_catalog.=) ANY ($2)"
								 " AND s.lease_until OPERATOR(pg_catalog.>) $4",
								 4, argtypes),
					 values, nulls, SPI_OK_UPDATE);
	n = (int) SPI_processed;
	rb_inflight_finish();
	return n;
}

/*
 * rb_inflight_drop
 *		Forget the cap of key and every slot it holds; false if there was
 *		none (a NULL key names none).  The cap's row first: an acquire in
 *		progress holds it, so its slots are committed (or gone) before the
 *		slots are deleted.
 */
bool
rb_inflight_drop(text *key)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	char		nulls[1] = {key == NULL ? 'n' : ' '};
	bool		found;

	values[0] = PointerGetDatum(key);
	rb_inflight_connect();
	rb_inflight_exec(rb_spi_plan(&drop_cap_plan,
								 "DELETE FROM ratebucket.inflight_caps AS c"
								 " WHERE c.key OPERATOR(pg_catalog.=) $1",
								 1, argtypes),
					 values, nulls, SPI_OK_DELETE);
	found = SPI_processed > 0;
	rb_inflight_exec(rb_spi_plan(&drop_slots_plan,
								 "DELETE FROM ratebucket.inflight_slots AS s"
								 " WHERE s.key OPERATOR(pg_catalog.=) $1",
								 1, argtypes),
					 values, nulls, SPI_OK_DELETE);
	rb_inflight_finish();
	return found;
}

/*
 * rb_inflight_missing
 *		The first of "keys" that has no cap, or NULL if every one has: with
 *		a fresh snapshot, as an acquire will look, not the statement's.  (The
 *		caps are looked up in one uncorrelated subquery, which Citus can run
 *		on a distributed table; a correlated NOT EXISTS it cannot.)
 */
char *
rb_inflight_missing(char **keys, int n)
{
	Oid			argtypes[1] = {TEXTARRAYOID};
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));
	Datum		values[1];
	char	   *missing = NULL;
	MemoryContext callcxt = CurrentMemoryContext;
	int			i;

	if (n == 0)
		return NULL;
	for (i = 0; i < n; i++)
		elems[i] = PointerGetDatum(cstring_to_text(keys[i]));
	values[0] = PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false,
												TYPALIGN_INT));
	rb_inflight_connect();
	rb_inflight_exec(rb_spi_plan(&missing_plan,
								 "SELECT u.k FROM pg_catalog.unnest($1) WITH ORDINALITY AS u(k, o)"
								 " WHERE u.k OPERATOR(pg_catalog.<>) ALL (ARRAY("
								 "SELECT c.key FROM ratebucket.inflight_caps AS c"
								 " WHERE c.key OPERATOR(pg_catalog.=) ANY ($1)))"
								 " ORDER BY u.o LIMIT 1",
								 1, argtypes),
					 values, NULL, SPI_OK_SELECT);
	if (SPI_processed > 0)
	{
		char	   *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		missing = MemoryContextStrdup(callcxt, v);
	}
	rb_inflight_finish();
	return missing;
}

/*
 * rb_inflight_check_acquire
 *		The privileges an acquire needs, as a call of inflight_acquire by
 *		roleid would check them: USAGE on its schema and EXECUTE on it.  A
 *		batch that acquires slots for its caller checks them for that
 *		caller.
 */
void
rb_inflight_check_acquire(Oid roleid)
{
	Oid			argtypes[2] = {TEXTOID, INT4OID};
	List	   *name = list_make2(makeString("ratebucket"),
								  makeString("inflight_acquire"));
	Oid			fn = LookupFuncName(name, 2, argtypes, false);
	Oid			nsp = get_func_namespace(fn);
	AclResult	acl;

#if PG_VERSION_NUM >= 160000
	acl = object_aclcheck(NamespaceRelationId, nsp, roleid, ACL_USAGE);
#else
	acl = pg_namespace_aclcheck(nsp, roleid, ACL_USAGE);
#endif
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_SCHEMA, get_namespace_name(nsp));
#if PG_VERSION_NUM >= 160000
	acl = object_aclcheck(ProcedureRelationId, fn, roleid, ACL_EXECUTE);
#else
	acl = pg_proc_aclcheck(fn, roleid, ACL_EXECUTE);
#endif
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_FUNCTION, "inflight_acquire");
}
