/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Bucket rows in ratebucket.buckets: directly through the index and the
 *	  heap (direct.c) where the table allows it, otherwise through SPI with
 *	  saved plans.
 *
 * Every statement names the table and every operator with its schema, so
 * nothing is resolved through the caller's search_path.  The statements run
 * as the table's owner (the way PostgreSQL's own foreign-key checks do):
 * a role reaches buckets only through the functions it was granted EXECUTE
 * on, and needs no privilege on the table itself, which it could otherwise
 * use to hand itself tokens.
 *
 * SPI is the portable path: on a table Citus distributed it reaches the
 * endpoint's shard, where direct heap access would see an empty shell, and
 * it is used there by itself (rb_is_distributed).  Its UPDATE names the
 * row by key and position, so that Citus sends it to one shard.  The
 * direct path serves the lookups,
 * locks and updates of rows that exist, which is every take but a bucket's
 * first; inserting and deleting rows always goes through SPI, connected
 * only when needed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/lockdefs.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "bucket/direct.h"
#include "bucket/events.h"
#include "bucket/reserve.h"
#include "bucket/storage.h"

#define RB_SCHEMA	"ratebucket"
#define RB_TABLE	"buckets"
#define RB_QUALIFIED RB_SCHEMA "." RB_TABLE

/*
 * The columns the C code reads and writes, besides endpoint: each SELECT
 * returns ctid and then these, in this order; INSERT and UPDATE bind them
 * as $2, $3, ... ($1 is the endpoint or the ctid).
 */
typedef enum RbColumnKind
{
	RB_F8,						/* float8 NOT NULL */
	RB_F8N,						/* float8, NULL <-> NaN */
	RB_I4,						/* int4 NOT NULL */
	RB_I4N,						/* int4, NULL <-> -1 */
	RB_I8,						/* int8 NOT NULL */
	RB_TS,						/* timestamptz NOT NULL */
	RB_TSN,						/* timestamptz, NULL <-> RB_NO_TIME */
	RB_TXTN						/* text, NULL <-> "" (char[RB_TEXT_LEN]) */
} RbColumnKind;

/*
 * A column added by an update script is "optional": a database whose
 * schema has not been updated yet (the new library is installed, ALTER
 * EXTENSION UPDATE has not run) lacks it.  There it reads as NULL and is
 * never written, so the functions of the old version keep working.
 */
typedef struct RbColumn
{
	const char *name;
	RbColumnKind kind;
	size_t		offset;			/* in RbBucket */
	bool		optional;		/* may be missing (added by an update) */
} RbColumn;

#define COL(name, kind, field) {name, kind, offsetof(RbBucket, field), false}
#define COL_OPT(name, kind, field) {name, kind, offsetof(RbBucket, field), true}

static const RbColumn rb_columns[] = {
	COL("rate", RB_F8, rate),
	COL("capacity", RB_F8, capacity),
	COL("tokens", RB_F8, state.tokens),
	COL("refilled_at", RB_TS, state.refilled_at),
	COL("conf_rate", RB_F8N, conf_rate),
	COL("conf_capacity", RB_F8N, conf_capacity),
	COL("conf_floor_rate", RB_F8N, conf_floor_rate),
	COL("conf_throttle_factor", RB_F8N, conf_throttle_factor),
	COL("conf_recovery_factor", RB_F8N, conf_recovery_factor),
	COL("conf_breaker_failures", RB_I4N, conf_breaker_failures),
	COL("configured_at", RB_TSN, configured_at),
	COL("created_at", RB_TS, created_at),
	COL("last_granted_at", RB_TSN, last_granted_at),
	COL("takes_granted", RB_I8, takes_granted),
	COL("tokens_granted", RB_F8, tokens_granted),
	COL("rate_factor", RB_F8, adapt.rate_factor),
	COL("factor_at", RB_TSN, adapt.factor_at),
	COL("cooldown_until", RB_TSN, adapt.cooldown_until),
	COL("at_floor_since", RB_TSN, adapt.at_floor_since),
	COL("paused_until", RB_TSN, adapt.paused_until),
	COL("failure_run", RB_I4, adapt.failure_run),
	COL("breaker_trips", RB_I4, adapt.breaker_trips),
	COL("breaker_open_until", RB_TSN, adapt.open_until),
	COL("probe_at", RB_TSN, adapt.probe_at),
	COL("successes", RB_I8, feedback.successes),
	COL("failures", RB_I8, feedback.failures),
	COL("throttles", RB_I8, feedback.throttles),
	COL("cooldowns", RB_I8, feedback.cooldowns),
	COL("breaker_opens", RB_I8, feedback.breaker_opens),
	COL("malformed_headers", RB_I8, feedback.malformed_headers),
	COL("last_status", RB_I4N, feedback.last_status),
	COL("last_observed_at", RB_TSN, feedback.last_observed_at),
	/* 1.2: calendar quotas */
	COL_OPT("quota_period", RB_TXTN, quota_period),
	COL_OPT("quota_time_zone", RB_TXTN, quota_time_zone),
	/* 1.5: the throttle episode's curve, a published limit */
	COL_OPT("target_factor", RB_F8N, adapt.target_factor),
	COL_OPT("burst_factor", RB_F8N, adapt.burst_factor),
	COL_OPT("limit_factor", RB_F8N, adapt.limit_factor),
	COL_OPT("limit_burst_factor", RB_F8N, adapt.limit_burst_factor),
	/* 1.6: the template that configured it */
	COL_OPT("template", RB_TXTN, template_name),
	/* 1.8: a token reserve in shared memory */
	COL_OPT("reserve", RB_I4N, reserve_batch),
	/* 1.11: when the cooldown began (a lock-out doubles it) */
	COL_OPT("cooldown_from", RB_TSN, adapt.cooldown_from),
	COL_OPT("lockout_seconds", RB_F8N, adapt.lockout_seconds),
};

#define RB_NCOLUMNS ((int) lengthof(rb_columns))

/*
 * Which columns the table has (every one but an optional column missing
 * from a schema not yet updated), and whether the statements below were
 * built for that set.
 */
static bool column_present[RB_NCOLUMNS];
static bool statements_built = false;

/* The statements, built from rb_columns by rb_storage_build. */
static char *lock_sql;
static char *lock_skip_sql;
static char *peek_sql;
static char *insert_sql;
static char *update_sql;

static const char *const delete_sql =
"DELETE FROM " RB_QUALIFIED " WHERE endpoint OPERATOR(pg_catalog.=) $1";

/* Parameter types: $1, then one per column (and the update's key last). */
static Oid	insert_argtypes[RB_NCOLUMNS + 1];
static Oid	update_argtypes[RB_NCOLUMNS + 2];

/* Saved plans, prepared on first use in each backend. */
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr lock_skip_plan = NULL;
static SPIPlanPtr peek_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr update_plan = NULL;
static SPIPlanPtr delete_plan = NULL;
static SPIPlanPtr shard_lock_plan = NULL;	/* Citus: rb_lock_shard */

/*
 * ratebucket.buckets and its owner, as the current call resolved them.  A
 * call resolves them once, when it begins (rb_storage_begin,
 * rb_storage_table), and keeps them to its end, whatever invalidations it
 * hears meanwhile: the reserves of its endpoints are keyed by this oid, and
 * a call that lost it halfway would no longer find, cap or drain them.  An
 * invalidation of the table (or of every relation) only marks them stale,
 * and the next call to begin looks them up again.
 */
static Oid	table_relid = InvalidOid;
static Oid	table_owner = InvalidOid;
static bool table_distributed = false;	/* by Citus: see rb_is_distributed */
static bool table_stale = true;
static Oid	lookup_relid = InvalidOid;	/* the table, while it is looked up */

/* The columns as direct.c sees them: rb_columns' names and SQL types. */
static RbDirectColumn direct_columns[RB_NCOLUMNS];

/* Within rb_storage_begin/end: which path serves the rows, SPI connected? */
static bool session_direct = false;
static bool session_spi = false;

/*
 * The table's relation cache entry was invalidated (its columns, its owner,
 * its drop, Citus distributing it), or every entry (InvalidOid): look the
 * table up again when the next call begins.  Never cleared here, since this
 * runs in the middle of calls (any relation's open or lock, SPI's steps).
 */
static void
rb_storage_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	if (relid == InvalidOid || relid == table_relid || relid == lookup_relid)
		table_stale = true;
}

/* The SQL type of a column kind. */
static Oid
rb_column_type(RbColumnKind kind)
{
	switch (kind)
	{
		case RB_F8:
		case RB_F8N:
			return FLOAT8OID;
		case RB_I4:
		case RB_I4N:
			return INT4OID;
		case RB_I8:
			return INT8OID;
		case RB_TXTN:
			return TEXTOID;
		case RB_TS:
		case RB_TSN:
			break;
	}
	return TIMESTAMPTZOID;
}

/* Forget a saved plan (the statements are being rebuilt). */
static void
rb_forget_plan(SPIPlanPtr *plan)
{
	if (*plan != NULL)
		SPI_freeplan(*plan);
	*plan = NULL;
}

/*
 * rb_storage_build
 *		Build the statements from the columns present (column_present), and
 *		forget the plans of any earlier build.
 */
static void
rb_storage_build(void)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	StringInfoData cols;
	StringInfoData select;
	StringInfoData insert;
	StringInfoData update;
	int			i;
	int			n = 0;

	if (statements_built)
	{
		pfree(lock_sql);
		pfree(lock_skip_sql);
		pfree(peek_sql);
		pfree(insert_sql);
		pfree(update_sql);
		rb_forget_plan(&lock_plan);
		rb_forget_plan(&lock_skip_plan);
		rb_forget_plan(&peek_plan);
		rb_forget_plan(&insert_plan);
		rb_forget_plan(&update_plan);
	}

	initStringInfo(&cols);
	initStringInfo(&insert);
	initStringInfo(&update);
	appendStringInfoString(&insert, "INSERT INTO " RB_QUALIFIED " (endpoint");
	appendStringInfoString(&update, "UPDATE " RB_QUALIFIED " SET ");
	insert_argtypes[0] = TEXTOID;
	update_argtypes[0] = TIDOID;
	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		if (!column_present[i])
			continue;
		appendStringInfo(&cols, ", %s", rb_columns[i].name);
		appendStringInfo(&insert, ", %s", rb_columns[i].name);
		appendStringInfo(&update, "%s%s = $%d", n > 0 ? ", " : "",
						 rb_columns[i].name, n + 2);
		insert_argtypes[n + 1] = update_argtypes[n + 1] =
			rb_column_type(rb_columns[i].kind);
		n++;
	}
	appendStringInfoString(&insert, ") VALUES ($1");
	for (i = 0; i < n; i++)
		appendStringInfo(&insert, ", $%d", i + 2);
	appendStringInfoString(&insert, ") ON CONFLICT (endpoint) DO NOTHING");
	/*
	 * By key as well as by position: on a distributed table (Citus) a
	 * statement without the distribution column goes to every shard.
	 */
	appendStringInfo(&update, " WHERE endpoint OPERATOR(pg_catalog.=) $%d"
					 " AND ctid OPERATOR(pg_catalog.=) $1", n + 2);
	update_argtypes[n + 1] = TEXTOID;

	initStringInfo(&select);
	appendStringInfo(&select,
					 "SELECT ctid%s FROM " RB_QUALIFIED
					 " WHERE endpoint OPERATOR(pg_catalog.=) $1", cols.data);
	peek_sql = pstrdup(select.data);
	lock_sql = psprintf("%s FOR NO KEY UPDATE", select.data);
	lock_skip_sql = psprintf("%s FOR NO KEY UPDATE SKIP LOCKED", select.data);
	insert_sql = insert.data;
	update_sql = update.data;
	pfree(cols.data);
	pfree(select.data);
	MemoryContextSwitchTo(oldcxt);
	statements_built = true;
}

/*
 * rb_storage_init
 *		Called once from _PG_init.  The statements are built on first use,
 *		when the table's columns can be looked up.
 */
void
rb_storage_init(void)
{
	int			i;

	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		direct_columns[i].name = rb_columns[i].name;
		direct_columns[i].type = rb_column_type(rb_columns[i].kind);
	}
	CacheRegisterRelcacheCallback(rb_storage_relcache_callback, (Datum) 0);
	rb_direct_init();
}

/*
 * rb_find_columns
 *		Which of rb_columns the table has; rebuild the statements if that
 *		changed (an update added columns) or they were never built.  (The
 *		direct path reads and writes every column: it serves only a table
 *		that has them all, see rb_direct_begin's shape check.)
 */
static void
rb_find_columns(Oid relid)
{
	bool		changed = !statements_built;
	int			i;

	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		bool		present = !rb_columns[i].optional ||
			get_attnum(relid, rb_columns[i].name) != InvalidAttrNumber;

		if (present != column_present[i])
			changed = true;
		column_present[i] = present;
	}
	if (changed)
		rb_storage_build();
}

/*
 * rb_is_distributed
 *		Is the table distributed by Citus?  On every node of a cluster its
 *		name is then an empty shell and its rows are in shard tables: direct
 *		access by name would see none, while SQL reaches the endpoint's shard
 *		(on its node, through Citus's local execution).  Known from Citus's
 *		catalog, pg_dist_partition, in a database that has Citus.
 */
bool
rb_is_distributed(Oid relid)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1];
	bool		distributed;
	int			rc;

	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = ObjectIdGetDatum(relid);
	rc = SPI_execute_with_args("SELECT 1 FROM pg_catalog.pg_dist_partition"
							   " WHERE logicalrelid OPERATOR(pg_catalog.=)"
							   " $1::pg_catalog.regclass",
							   1, argtypes, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	distributed = SPI_processed > 0;
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	return distributed;
}

/* Find ratebucket.buckets and its owner, or complain that it is missing. */
static void
rb_lookup_table(void)
{
	Oid			nspid;
	Oid			relid = InvalidOid;
	HeapTuple	tuple;
	Oid			owner;

	/* an invalidation heard from here on is for the next call to act on */
	table_stale = false;
	table_relid = InvalidOid;
	nspid = get_namespace_oid(RB_SCHEMA, true);
	if (OidIsValid(nspid))
		relid = get_relname_relid(RB_TABLE, nspid);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s.%s\" does not exist", RB_SCHEMA, RB_TABLE),
				 errhint("Run CREATE EXTENSION ratebucket in this database.")));
	lookup_relid = relid;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	rb_find_columns(relid);
	table_distributed = rb_is_distributed(relid);
	table_relid = relid;
	table_owner = owner;
	lookup_relid = InvalidOid;
}

/*
 * rb_storage_begin
 *		Act as the table's owner until rb_storage_end, and open the table for
 *		direct access if it can be (SPI is connected when first needed).
 *
 * An error in between needs no cleanup here: aborting the (sub)transaction
 * restores the user, closes SPI and releases the relations; the next
 * rb_storage_begin starts afresh.
 */
static void
rb_storage_begin_session(RbStorageSession *session, bool peek_only)
{
	if (table_stale || !OidIsValid(table_relid))
		rb_lookup_table();

	GetUserIdAndSecContext(&session->save_userid, &session->save_sec_context);
	SetUserIdAndSecContext(table_owner,
						   session->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	session_spi = false;
	session_direct = !table_distributed &&
		rb_direct_begin(table_relid, direct_columns, RB_NCOLUMNS, peek_only);
}

void
rb_storage_begin(RbStorageSession *session)
{
	rb_storage_begin_session(session, false);
}

/*
 * rb_storage_begin_peek
 *		rb_storage_begin for a session that only peeks (rb_storage_peek):
 *		the table is locked as a SELECT locks it, so a peek waits for nothing
 *		a SELECT would not wait for.
 */
void
rb_storage_begin_peek(RbStorageSession *session)
{
	rb_storage_begin_session(session, true);
}

/* Connect SPI for this session, unless it already is. */
static void
rb_spi_connect(void)
{
	if (!session_spi)
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		session_spi = true;
	}
}

/* rb_storage_end: close what begin opened and act as the caller again. */
void
rb_storage_end(RbStorageSession *session)
{
	if (session_direct)
		rb_direct_end();
	if (session_spi && SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	session_direct = false;
	session_spi = false;
	SetUserIdAndSecContext(session->save_userid, session->save_sec_context);
}

/*
 * rb_spi_plan
 *		Prepare and keep a plan, unless it already is: the saved plans of
 *		the statements on ratebucket's tables (here, and in stripe.c and
 *		inflight.c).
 */
SPIPlanPtr
rb_spi_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
{
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

		if (p == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*plan = p;
	}
	return *plan;
}

/* Set a column of a bucket to what NULL reads as. */
static void
rb_null_column(const RbColumn *col, RbBucket *bucket)
{
	char	   *field = (char *) bucket + col->offset;

	switch (col->kind)
	{
		case RB_F8:
		case RB_F8N:
			*(double *) field = get_float8_nan();
			break;
		case RB_I4:
		case RB_I4N:
			*(int32 *) field = -1;
			break;
		case RB_I8:
			*(int64 *) field = 0;
			break;
		case RB_TS:
		case RB_TSN:
			*(TimestampTz *) field = RB_NO_TIME;
			break;
		case RB_TXTN:
			field[0] = '\0';
			break;
	}
}

/* Store a column's value in the bucket's field. */
static void
rb_read_value(const RbColumn *col, Datum d, bool isnull, RbBucket *bucket)
{
	char	   *field = (char *) bucket + col->offset;

	if (isnull)
	{
		rb_null_column(col, bucket);
		return;
	}
	switch (col->kind)
	{
		case RB_TXTN:
			text_to_cstring_buffer(DatumGetTextPP(d), field, RB_TEXT_LEN);
			break;
		case RB_F8:
		case RB_F8N:
			*(double *) field = isnull ? get_float8_nan() : DatumGetFloat8(d);
			break;
		case RB_I4:
		case RB_I4N:
			*(int32 *) field = isnull ? -1 : DatumGetInt32(d);
			break;
		case RB_I8:
			*(int64 *) field = isnull ? 0 : DatumGetInt64(d);
			break;
		case RB_TS:
		case RB_TSN:
			*(TimestampTz *) field = isnull ? RB_NO_TIME : DatumGetTimestampTz(d);
			break;
	}
}

/* Read column col of rb_columns from attribute attno of a tuple. */
static void
rb_read_column(const RbColumn *col, HeapTuple tuple, TupleDesc desc,
			   int attno, RbBucket *bucket)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, attno, &isnull);

	rb_read_value(col, d, isnull, bucket);
}

/* Bind column col of a bucket as a parameter value. */
static void
rb_bind_column(const RbColumn *col, const RbBucket *bucket,
			   Datum *value, char *null)
{
	const char *field = (const char *) bucket + col->offset;

	*null = ' ';
	switch (col->kind)
	{
		case RB_F8:
			*value = Float8GetDatum(*(const double *) field);
			break;
		case RB_F8N:
			*value = Float8GetDatum(*(const double *) field);
			if (isnan(*(const double *) field))
				*null = 'n';
			break;
		case RB_I4:
			*value = Int32GetDatum(*(const int32 *) field);
			break;
		case RB_I4N:
			*value = Int32GetDatum(*(const int32 *) field);
			if (*(const int32 *) field < 0)
				*null = 'n';
			break;
		case RB_I8:
			*value = Int64GetDatum(*(const int64 *) field);
			break;
		case RB_TS:
		case RB_TSN:
			*value = TimestampTzGetDatum(*(const TimestampTz *) field);
			if (col->kind == RB_TSN && *(const TimestampTz *) field == RB_NO_TIME)
				*null = 'n';
			break;
		case RB_TXTN:
			if (field[0] == '\0')
			{
				*value = (Datum) 0;
				*null = 'n';
			}
			else
				*value = CStringGetTextDatum(field);
			break;
	}
}

/* Find (and lock, as mode says) a row directly; fill *bucket if found. */
static RbFindResult
rb_find_direct(text *endpoint, RbDirectMode mode, RbBucket *bucket)
{
	Datum		values[RB_NCOLUMNS];
	bool		nulls[RB_NCOLUMNS];
	ItemPointerData tid;
	RbFindResult found;
	int			i;

	found = rb_direct_find(endpoint, mode, &tid, values, nulls);
	if (found == RB_FOUND)
	{
		memset(bucket, 0, sizeof(*bucket));
		bucket->tid = tid;
		bucket->key = endpoint;
		for (i = 0; i < RB_NCOLUMNS; i++)
			rb_read_value(&rb_columns[i], values[i], nulls[i], bucket);
		rb_reserve_read(bucket, table_relid);
		rb_events_read(bucket);
	}
	return found;
}

/* Run a SELECT by endpoint; fill *bucket and return true if a row came back. */
static bool
rb_select(SPIPlanPtr *plan, const char *sql, text *endpoint, RbBucket *bucket)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	int			rc;
	int			i;
	int			attno = 2;

	rb_spi_connect();
	values[0] = PointerGetDatum(endpoint);
	rc = SPI_execute_plan(rb_spi_plan(plan, sql, 1, argtypes), values, NULL,
						  false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return false;

	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	memset(bucket, 0, sizeof(*bucket));
	bucket->tid = *((ItemPointer) DatumGetPointer(SPI_getbinval(tuple, desc, 1, &isnull)));
	bucket->key = endpoint;
	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		if (column_present[i])
			rb_read_column(&rb_columns[i], tuple, desc, attno++, bucket);
		else
			rb_null_column(&rb_columns[i], bucket);
	}
	if (!table_distributed)
		rb_reserve_read(bucket, table_relid);
	rb_events_read(bucket);
	return true;
}

/*
 * rb_storage_from_row
 *		Read a ratebucket.buckets row passed as a composite value (for
 *		functions that compute from a row their caller already has).
 */
void
rb_storage_from_row(HeapTupleHeader row, RbBucket *bucket)
{
	TupleDesc	desc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(row),
											  HeapTupleHeaderGetTypMod(row));
	HeapTupleData tuple;
	int			i;

	tuple.t_len = HeapTupleHeaderGetDatumLength(row);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = row;

	memset(bucket, 0, sizeof(*bucket));
	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		int			attno = SPI_fnumber(desc, rb_columns[i].name);

		if (attno <= 0 && rb_columns[i].optional)
			rb_null_column(&rb_columns[i], bucket);
		else if (attno <= 0)
			elog(ERROR, "bucket row has no column \"%s\"", rb_columns[i].name);
		else
			rb_read_column(&rb_columns[i], &tuple, desc, attno, bucket);
	}
	ReleaseTupleDesc(desc);
}

/*
 * On Citus, keep the endpoint's shard where it is until the transaction
 * ends, as Citus's own UPDATE would: its share lock on the shard's
 * placement metadata, which a shard move or split takes exclusively before
 * it copies the shard.  Citus plans a SELECT ... FOR UPDATE as a read and
 * takes no such lock for it, so a move could otherwise complete between the
 * row's lock, held in the old placement, and its UPDATE, which would then
 * go to the new one, where no lock is held.  (A call that waits here for a
 * move to finish then finds the row in its new placement.)
 */
static void
rb_lock_shard(text *endpoint)
{
	rb_spi_connect();
	rb_lock_shard_of(&shard_lock_plan, RB_QUALIFIED, endpoint);
}

/*
 * rb_lock_shard_of
 *		rb_lock_shard for the shard of key in a distributed table ("relation",
 *		schema-qualified), with SPI connected; the plan is saved in *plan.
 */
void
rb_lock_shard_of(SPIPlanPtr *plan, const char *relation, text *key)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	int			rc;

	StaticAssertStmt(ShareLock == 5, "the lock mode lock_shard_metadata is given");
	values[0] = PointerGetDatum(key);
	rc = SPI_execute_plan(rb_spi_plan(plan, *plan != NULL ? NULL :
									  psprintf("SELECT pg_catalog.lock_shard_metadata(5, ARRAY["
											   "pg_catalog.get_shard_id_for_distribution_column("
											   "'%s'::pg_catalog.regclass, $1)])", relation),
									  1, argtypes),
						  values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
}

/*
 * rb_storage_lock
 *		Lock the endpoint's row (FOR NO KEY UPDATE, waiting for a holder) and
 *		read it.  Returns false if there is no such row.
 *
 * Under READ COMMITTED a row updated by a transaction that committed while
 * we waited is re-read at its newest version, so the caller never works
 * from a stale read.
 */
bool
rb_storage_lock(text *endpoint, RbBucket *bucket)
{
	if (session_direct)
		return rb_find_direct(endpoint, RB_DIRECT_LOCK, bucket) == RB_FOUND;
	if (table_distributed)
		rb_lock_shard(endpoint);
	return rb_select(&lock_plan, lock_sql, endpoint, bucket);
}

/*
 * rb_storage_lock_skip
 *		Lock the endpoint's row and read it, unless another transaction holds
 *		it.  Returns false, without waiting, if the row is locked or missing.
 */
bool
rb_storage_lock_skip(text *endpoint, RbBucket *bucket)
{
	if (session_direct)
		return rb_find_direct(endpoint, RB_DIRECT_LOCK_SKIP, bucket) == RB_FOUND;
	if (table_distributed)
		rb_lock_shard(endpoint);
	return rb_select(&lock_skip_plan, lock_skip_sql, endpoint, bucket);
}

/*
 * rb_storage_peek
 *		Read the endpoint's row as last committed, without locking it.
 */
bool
rb_storage_peek(text *endpoint, RbBucket *bucket)
{
	if (session_direct)
		return rb_find_direct(endpoint, RB_DIRECT_PEEK, bucket) == RB_FOUND;
	return rb_select(&peek_plan, peek_sql, endpoint, bucket);
}

/*
 * Run INSERT or UPDATE with $1 = first, the bucket's columns after, and
 * then "last" if it is not NULL.
 */
static int
rb_write(SPIPlanPtr *plan, const char *sql, Oid *argtypes, Datum first,
		 const RbBucket *bucket, text *last, int expect)
{
	Datum		values[RB_NCOLUMNS + 2];
	char		nulls[RB_NCOLUMNS + 2];
	int			rc;
	int			i;
	int			n = 0;

	rb_spi_connect();
	values[0] = first;
	nulls[0] = ' ';
	for (i = 0; i < RB_NCOLUMNS; i++)
		if (column_present[i])
		{
			rb_bind_column(&rb_columns[i], bucket, &values[n + 1], &nulls[n + 1]);
			n++;
		}
	if (last != NULL)
	{
		values[n + 1] = PointerGetDatum(last);
		nulls[n + 1] = ' ';
	}
	rc = SPI_execute_plan(rb_spi_plan(plan, sql, n + 1 + (last != NULL), argtypes),
						  values, nulls, false, 0);
	if (rc != expect)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * A row was written: its events (bucket/events.c) and its reserve
 * (bucket/reserve.c), unless Citus distributed the table (see there; an
 * endpoint of a distributed table has no reserve).
 */
static void
rb_written(text *key, const RbBucket *bucket)
{
	if (!table_distributed && key != NULL)
	{
		rb_events_written(key, bucket);
		rb_reserve_written(bucket);
	}
}

/*
 * rb_storage_relid
 *		The table of this storage session (within rb_storage_begin/end).
 */
Oid
rb_storage_relid(void)
{
	return table_relid;
}

/*
 * rb_storage_table
 *		Outside a storage session: the table, for work that reads none of
 *		its rows (a reserve's draw), found without opening or locking it.
 *		The invalidations other transactions sent are accepted first, as
 *		locking the table would accept them, so that a table dropped or
 *		created again since is looked up afresh, by name in the catalogs.
 */
Oid
rb_storage_table(void)
{
	AcceptInvalidationMessages();
	if (table_stale || !OidIsValid(table_relid))
		rb_lookup_table();
	return table_relid;
}

/*
 * rb_storage_distributed
 *		Is the table distributed by Citus?  As of the storage session, or of
 *		rb_storage_table.
 */
bool
rb_storage_distributed(void)
{
	return table_distributed;
}

/*
 * rb_storage_insert
 *		Insert a new row for the endpoint.  Returns false, changing nothing,
 *		if a concurrent transaction inserted one first (the caller then locks
 *		that row instead).
 */
bool
rb_storage_insert(text *endpoint, const RbBucket *bucket)
{
	if (rb_write(&insert_plan, insert_sql, insert_argtypes,
				 PointerGetDatum(endpoint), bucket, NULL, SPI_OK_INSERT) != 1)
		return false;
	rb_written(endpoint, bucket);
	return true;
}

/* Write a row read directly; see rb_direct_update for "wait". */
static bool
rb_update_direct(RbBucket *bucket, bool wait)
{
	Datum		values[RB_NCOLUMNS];
	bool		nulls[RB_NCOLUMNS];
	int			i;

	for (i = 0; i < RB_NCOLUMNS; i++)
	{
		char		null;

		rb_bind_column(&rb_columns[i], bucket, &values[i], &null);
		nulls[i] = (null == 'n');
	}
	return rb_direct_update(&bucket->tid, values, nulls, wait);
}

/*
 * rb_storage_update
 *		Write a locked row back, every column the C code knows.
 */
void
rb_storage_update(RbBucket *bucket)
{
	if (session_direct)
	{
		if (!rb_update_direct(bucket, true))
			elog(ERROR, "bucket row to update was not found at its locked position");
	}
	else
	{
		if (bucket->key == NULL)
			elog(ERROR, "bucket row to update was not locked by its key");
		if (rb_write(&update_plan, update_sql, update_argtypes,
					 PointerGetDatum(&bucket->tid), bucket, bucket->key,
					 SPI_OK_UPDATE) != 1)
			elog(ERROR, "bucket row to update was not found at its locked position");
	}
	rb_written(bucket->key, bucket);
	rb_events_read(bucket);
}

/*
 * rb_storage_update_unchanged
 *		Write back a row read by rb_storage_peek, if no other transaction has
 *		written or locked it since: then the row is exactly as if it had been
 *		locked when it was read, and this is the take's one write.  Returns
 *		false, writing nothing, if another has (or on the SPI path, which
 *		cannot tell): the caller locks the row and decides again.
 */
bool
rb_storage_update_unchanged(RbBucket *bucket)
{
	if (!session_direct || !rb_update_direct(bucket, false))
		return false;
	rb_written(bucket->key, bucket);
	rb_events_read(bucket);
	return true;
}

/*
 * rb_storage_lock_or_insert
 *		Lock the endpoint's row into *bucket and return true; if there is no
 *		row, insert *fresh instead and return false.
 *
 * If a concurrent transaction inserts the row first, our insert does nothing
 * and we lock theirs once it has committed.  Under READ COMMITTED that row
 * may be gone again by then (bucket_expire deleted it): try again, as long
 * as others keep committing.  Under REPEATABLE READ or SERIALIZABLE a row
 * inserted by another transaction stays invisible to us: a serialization
 * failure, to be retried like any other.
 */
bool
rb_storage_lock_or_insert(text *endpoint, RbBucket *bucket,
						  const RbBucket *fresh)
{
	int			attempt;

	for (attempt = 0; attempt < 1000; attempt++)
	{
		if (rb_storage_lock(endpoint, bucket))
			return true;
		if (rb_storage_insert(endpoint, fresh))
			return false;
		if (IsolationUsesXactSnapshot())
			break;
		CHECK_FOR_INTERRUPTS();
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to concurrent creation of bucket \"%s\"",
					text_to_cstring(endpoint)),
			 errhint("Retry the transaction, or take from buckets under READ COMMITTED.")));
	return false;				/* keep the compiler quiet */
}

/*
 * rb_storage_delete
 *		Delete the endpoint's row.  Returns false if there was none.
 */
bool
rb_storage_delete(text *endpoint)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	int			rc;

	rb_spi_connect();
	values[0] = PointerGetDatum(endpoint);
	rc = SPI_execute_plan(rb_spi_plan(&delete_plan, delete_sql, 1, argtypes),
						  values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		rb_reserve_forget(endpoint, table_relid);
	return SPI_processed > 0;
}
