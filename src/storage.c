/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Bucket rows in ratebucket.buckets, through SPI with saved plans.
 *
 * Every statement names the table and every operator with its schema, so
 * nothing is resolved through the caller's search_path.  The statements run
 * as the table's owner (the way PostgreSQL's own foreign-key checks do):
 * a role reaches buckets only through the functions it was granted EXECUTE
 * on, and needs no privilege on the table itself, which it could otherwise
 * use to hand itself tokens.
 *
 * SPI is the portable path: on a distributed setup (Citus) it reaches the
 * local shard, where direct heap access would see an empty placeholder.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "storage.h"

#define RB_SCHEMA	"ratebucket"
#define RB_TABLE	"buckets"

/* Columns every SELECT returns, in this order. */
#define RB_COLUMNS \
	"ctid, rate, capacity, tokens, refilled_at, conf_rate, conf_capacity, " \
	"configured_at, created_at, last_granted_at, takes_granted, tokens_granted"

#define RB_WHERE_ENDPOINT \
	" WHERE endpoint OPERATOR(pg_catalog.=) $1"

static const char *const lock_sql =
"SELECT " RB_COLUMNS " FROM " RB_SCHEMA "." RB_TABLE RB_WHERE_ENDPOINT
" FOR NO KEY UPDATE";

static const char *const lock_skip_sql =
"SELECT " RB_COLUMNS " FROM " RB_SCHEMA "." RB_TABLE RB_WHERE_ENDPOINT
" FOR NO KEY UPDATE SKIP LOCKED";

static const char *const peek_sql =
"SELECT " RB_COLUMNS " FROM " RB_SCHEMA "." RB_TABLE RB_WHERE_ENDPOINT;

static const char *const insert_sql =
"INSERT INTO " RB_SCHEMA "." RB_TABLE
" (endpoint, rate, capacity, tokens, refilled_at, conf_rate, conf_capacity,"
" configured_at, last_granted_at, takes_granted, tokens_granted, created_at)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
" ON CONFLICT (endpoint) DO NOTHING";

static const char *const update_sql =
"UPDATE " RB_SCHEMA "." RB_TABLE
" SET rate = $2, capacity = $3, tokens = $4, refilled_at = $5,"
" conf_rate = $6, conf_capacity = $7, configured_at = $8,"
" last_granted_at = $9, takes_granted = $10, tokens_granted = $11"
" WHERE ctid OPERATOR(pg_catalog.=) $1";

static const char *const delete_sql =
"DELETE FROM " RB_SCHEMA "." RB_TABLE RB_WHERE_ENDPOINT;

/* Saved plans, prepared on first use in each backend. */
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr lock_skip_plan = NULL;
static SPIPlanPtr peek_plan = NULL;
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr update_plan = NULL;
static SPIPlanPtr delete_plan = NULL;

/* Owner of ratebucket.buckets, cached until the relcache says otherwise. */
static Oid	table_owner = InvalidOid;

/* Forget the cached owner when any relation cache entry is invalidated. */
static void
rb_storage_relcache_callback(Datum arg pg_attribute_unused(),
							 Oid relid pg_attribute_unused())
{
	table_owner = InvalidOid;
}

/*
 * rb_storage_init
 *		Called once from _PG_init.
 */
void
rb_storage_init(void)
{
	CacheRegisterRelcacheCallback(rb_storage_relcache_callback, (Datum) 0);
}

/* Find the owner of ratebucket.buckets, or complain that it is missing. */
static Oid
rb_lookup_table_owner(void)
{
	Oid			nspid;
	Oid			relid = InvalidOid;
	HeapTuple	tuple;
	Oid			owner;

	nspid = get_namespace_oid(RB_SCHEMA, true);
	if (OidIsValid(nspid))
		relid = get_relname_relid(RB_TABLE, nspid);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s.%s\" does not exist", RB_SCHEMA, RB_TABLE),
				 errhint("Run CREATE EXTENSION ratebucket in this database.")));

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * rb_storage_begin
 *		Open SPI and act as the table's owner until rb_storage_end.
 *
 * An error in between needs no cleanup here: aborting the (sub)transaction
 * restores the user and closes SPI.
 */
void
rb_storage_begin(RbStorageSession *session)
{
	if (!OidIsValid(table_owner))
		table_owner = rb_lookup_table_owner();

	GetUserIdAndSecContext(&session->save_userid, &session->save_sec_context);
	SetUserIdAndSecContext(table_owner,
						   session->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/* rb_storage_end: close SPI and act as the caller again. */
void
rb_storage_end(RbStorageSession *session)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	SetUserIdAndSecContext(session->save_userid, session->save_sec_context);
}

/* Prepare and keep a plan, unless it already is. */
static SPIPlanPtr
rb_plan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *argtypes)
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

/* Read a nullable timestamptz column; false if it is NULL. */
static bool
rb_get_timestamp(HeapTuple tuple, TupleDesc desc, int attno, TimestampTz *out)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, attno, &isnull);

	if (!isnull)
		*out = DatumGetTimestampTz(d);
	return !isnull;
}

/* Read a float8 column; NULL reads as 0. */
static double
rb_get_float8(HeapTuple tuple, TupleDesc desc, int attno)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, attno, &isnull);

	return isnull ? 0.0 : DatumGetFloat8(d);
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

	values[0] = PointerGetDatum(endpoint);
	rc = SPI_execute_plan(rb_plan(plan, sql, 1, argtypes), values, NULL,
						  false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return false;

	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	memset(bucket, 0, sizeof(*bucket));
	bucket->tid = *((ItemPointer) DatumGetPointer(SPI_getbinval(tuple, desc, 1, &isnull)));
	bucket->rate = rb_get_float8(tuple, desc, 2);
	bucket->capacity = rb_get_float8(tuple, desc, 3);
	bucket->state.tokens = rb_get_float8(tuple, desc, 4);
	rb_get_timestamp(tuple, desc, 5, &bucket->state.refilled_at);
	bucket->configured = rb_get_timestamp(tuple, desc, 8, &bucket->configured_at);
	bucket->conf_rate = rb_get_float8(tuple, desc, 6);
	bucket->conf_capacity = rb_get_float8(tuple, desc, 7);
	rb_get_timestamp(tuple, desc, 9, &bucket->created_at);
	bucket->has_granted = rb_get_timestamp(tuple, desc, 10, &bucket->last_granted_at);
	bucket->takes_granted = DatumGetInt64(SPI_getbinval(tuple, desc, 11, &isnull));
	bucket->tokens_granted = rb_get_float8(tuple, desc, 12);
	return true;
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
	return rb_select(&lock_skip_plan, lock_skip_sql, endpoint, bucket);
}

/*
 * rb_storage_peek
 *		Read the endpoint's row as last committed, without locking it.
 */
bool
rb_storage_peek(text *endpoint, RbBucket *bucket)
{
	return rb_select(&peek_plan, peek_sql, endpoint, bucket);
}

/* Fill the parameters $2..$12 shared by INSERT and UPDATE (from index 1). */
static void
rb_row_params(const RbBucket *bucket, Datum *values, char *nulls)
{
	values[1] = Float8GetDatum(bucket->rate);
	values[2] = Float8GetDatum(bucket->capacity);
	values[3] = Float8GetDatum(bucket->state.tokens);
	values[4] = TimestampTzGetDatum(bucket->state.refilled_at);
	values[5] = Float8GetDatum(bucket->conf_rate);
	values[6] = Float8GetDatum(bucket->conf_capacity);
	values[7] = TimestampTzGetDatum(bucket->configured_at);
	nulls[5] = nulls[6] = nulls[7] = bucket->configured ? ' ' : 'n';
	values[8] = TimestampTzGetDatum(bucket->last_granted_at);
	nulls[8] = bucket->has_granted ? ' ' : 'n';
	values[9] = Int64GetDatum(bucket->takes_granted);
	values[10] = Float8GetDatum(bucket->tokens_granted);
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
	Oid			argtypes[12] = {TEXTOID, FLOAT8OID, FLOAT8OID, FLOAT8OID,
		TIMESTAMPTZOID, FLOAT8OID, FLOAT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT8OID, FLOAT8OID, TIMESTAMPTZOID};
	Datum		values[12];
	char		nulls[12];
	int			rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(endpoint);
	rb_row_params(bucket, values, nulls);
	values[11] = TimestampTzGetDatum(bucket->created_at);

	rc = SPI_execute_plan(rb_plan(&insert_plan, insert_sql, 12, argtypes),
						  values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return SPI_processed == 1;
}

/*
 * rb_storage_update
 *		Write a locked row back: limits, state, configuration and counters.
 */
void
rb_storage_update(const RbBucket *bucket)
{
	Oid			argtypes[11] = {TIDOID, FLOAT8OID, FLOAT8OID, FLOAT8OID,
		TIMESTAMPTZOID, FLOAT8OID, FLOAT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT8OID, FLOAT8OID};
	Datum		values[11];
	char		nulls[11];
	int			rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(&bucket->tid);
	rb_row_params(bucket, values, nulls);

	rc = SPI_execute_plan(rb_plan(&update_plan, update_sql, 11, argtypes),
						  values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed != 1)
		elog(ERROR, "bucket row to update was not found at its locked position");
}

/*
 * rb_storage_lock_or_insert
 *		Lock the endpoint's row into *bucket and return true; if there is no
 *		row, insert *fresh instead and return false.
 *
 * If a concurrent transaction inserts the row first, our insert does nothing
 * and we lock theirs once it has committed.  Under REPEATABLE READ or
 * SERIALIZABLE that row stays invisible to us: a serialization failure, to
 * be retried like any other.
 */
bool
rb_storage_lock_or_insert(text *endpoint, RbBucket *bucket,
						  const RbBucket *fresh)
{
	if (rb_storage_lock(endpoint, bucket))
		return true;
	if (rb_storage_insert(endpoint, fresh))
		return false;
	if (rb_storage_lock(endpoint, bucket))
		return true;
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

	values[0] = PointerGetDatum(endpoint);
	rc = SPI_execute_plan(rb_plan(&delete_plan, delete_sql, 1, argtypes),
						  values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return SPI_processed > 0;
}
