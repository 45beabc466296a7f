/*-------------------------------------------------------------------------
 *
 * template.c
 *	  Templates in ratebucket.bucket_templates, and each backend's copy of
 *	  them.
 *
 * A pattern is a prefix followed by one '*': "acct:*" matches every key
 * that starts with "acct:", and "*" every key.  Of the templates that match
 * a key, the one with the longest prefix configures it.
 *
 * Configured takes meet endpoints without a configuration often (every
 * claim peeks each endpoint whose events it walks), so each backend keeps
 * the templates in memory, read once and again only when they change.  A
 * change invalidates the table's relcache entry, which every backend hears
 * of at the latest when it next looks for a template, and which drops its
 * copy: bucket_template and bucket_template_drop send that invalidation
 * themselves, and a statement trigger on the table
 * (ratebucket.bucket_templates_changed) sends it for any other write (a
 * restore, an UPDATE of the table).  The functions do not rely on the
 * trigger, which does not fire under session_replication_role = replica
 * or when it is disabled.
 * The copy is read with the latest snapshot, whatever the isolation level,
 * and so are the endpoints a change is carried to.
 *
 * A change and a first use serialise on a lock of the table: the backend
 * that configures an endpoint from a template holds ROW SHARE until it
 * commits, and bucket_template and bucket_template_drop take EXCLUSIVE
 * before they change a template and carry the change to the endpoints that
 * follow it.  So no endpoint is configured from a template as it was before
 * a change that has already been carried over.  (ROW SHARE is a weak lock:
 * first uses do not queue on each other, nor on a vacuum of the table;
 * EXCLUSIVE still lets plain reads of the table through.)  On Citus,
 * where the table is a reference table on every node, the lock is taken
 * with LOCK TABLE, which Citus takes on every node.
 *
 * The statements run between rb_storage_begin and rb_storage_end (as the
 * tables' owner), each in an SPI connection of its own, like stripe.c's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "bucket/storage.h"
#include "bucket/template.h"

#define RB_TEMPLATES_SCHEMA "ratebucket"
#define RB_TEMPLATES_TABLE "bucket_templates"

/* This backend's copy of the templates, most specific first. */
static RbTemplate *copy = NULL;
static int	copy_n = 0;
static bool copy_valid = false;
static Oid	templates_relid = InvalidOid;
static bool callback_registered = false;
/* Is the table a Citus reference table (rb_template_lock)?  For this relid. */
static Oid	lock_checked_relid = InvalidOid;
static bool lock_on_cluster = false;

static SPIPlanPtr load_plan = NULL;
static SPIPlanPtr store_plan = NULL;
static SPIPlanPtr delete_plan = NULL;
static SPIPlanPtr followers_plan = NULL;
static SPIPlanPtr outranked_plan = NULL;

/* Invalidations heard so far: a copy read while one arrives is not kept. */
static uint64 invalidations = 0;

/* The table changed (or any relation, InvalidOid): read it again. */
static void
rb_template_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	if (relid == InvalidOid || relid == templates_relid)
	{
		copy_valid = false;
		invalidations++;
		lock_checked_relid = InvalidOid;	/* distributed since? */
	}
}

/*
 * The table's oid; InvalidOid if this schema has none (not updated yet).
 * Looked up again whenever the copy is not valid (the extension may have
 * been dropped and created again), and kept while it is: an invalidation
 * of the table (its drop included) makes the copy invalid.
 */
static Oid
rb_templates_relid(void)
{
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(rb_template_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	if (!copy_valid)
	{
		Oid			nspid = get_namespace_oid(RB_TEMPLATES_SCHEMA, true);

		templates_relid = OidIsValid(nspid) ?
			get_relname_relid(RB_TEMPLATES_TABLE, nspid) : InvalidOid;
	}
	return templates_relid;
}

/*
 * The length of a pattern's prefix: -1 unless it is a prefix and one final
 * '*' (what a template's pattern is, wherever it comes from).
 */
static int
rb_pattern_prefix(const char *pattern)
{
	size_t		len = strlen(pattern);

	if (len == 0 || pattern[len - 1] != '*' ||
		memchr(pattern, '*', len - 1) != NULL)
		return -1;
	return (int) len - 1;
}

/*
 * rb_template_check_pattern
 *		A pattern must be a prefix and one final '*', at most
 *		RB_MAX_PATTERN_BYTES long; returns the prefix's length.
 */
int
rb_template_check_pattern(const char *pattern)
{
	size_t		len = strlen(pattern);
	int			prefix_len;

	if (len > RB_MAX_PATTERN_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("pattern is too long (%zu bytes)", len),
				 errdetail("A template's pattern is at most %d bytes.",
						   RB_MAX_PATTERN_BYTES)));
	prefix_len = rb_pattern_prefix(pattern);
	if (prefix_len < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid template pattern \"%s\"", pattern),
				 errdetail("A pattern is a prefix followed by one '*', which ends it."),
				 errhint("For example 'acct:*' for every key that starts with \"acct:\", or '*' for every key.")));
	return prefix_len;
}

/* Most specific first: longest prefix first, then by pattern. */
static int
rb_template_cmp(const void *a, const void *b)
{
	const RbTemplate *x = (const RbTemplate *) a;
	const RbTemplate *y = (const RbTemplate *) b;

	if (x->prefix_len != y->prefix_len)
		return x->prefix_len > y->prefix_len ? -1 : 1;
	return strcmp(x->pattern, y->pattern);
}

/* A float8 column of an SPI row, NaN when NULL. */
static double
rb_spi_float8(HeapTuple row, TupleDesc desc, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(row, desc, col, &isnull);

	return isnull ? get_float8_nan() : DatumGetFloat8(d);
}

/*
 * Is a row of the table a template this code can use?  Only a change by
 * hand (an INSERT by the owner) can store one that is not; it is ignored,
 * with a warning.
 */
static bool
rb_template_usable(const RbTemplate *t)
{
	bool		ok = t->prefix_len >= 0 &&
		t->config.rate >= RB_MIN_RATE && t->config.rate <= RB_MAX_RATE &&
		t->config.capacity > 0.0 && t->config.capacity <= RB_MAX_CAPACITY;

	if (!ok)
		ereport(WARNING,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("template \"%s\" in ratebucket.bucket_templates is not valid: ignored",
						t->pattern),
				 errhint("Write templates with ratebucket.bucket_template.")));
	return ok;
}

/*
 * Read the templates into this backend's copy, as last committed (and as
 * this transaction changed them): with the latest snapshot, whatever the
 * isolation level, so that a first use after the templates' lock sees a
 * change that committed while it waited.  The copy is kept only if no
 * invalidation arrived while it was read.
 */
static void
rb_template_load(void)
{
	uint64		seen = invalidations;
	uint64		i;
	int			n = 0;
	int			rc;

	if (copy != NULL)
		pfree(copy);
	copy = NULL;
	copy_n = 0;
	copy_valid = false;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	rc = SPI_execute_snapshot(rb_spi_plan(&load_plan,
										  "SELECT pattern, rate, capacity, floor_rate,"
										  " throttle_factor, recovery_factor, breaker_failures"
										  " FROM ratebucket.bucket_templates",
										  0, NULL),
							  NULL, NULL, GetLatestSnapshot(), InvalidSnapshot,
							  false, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		copy = MemoryContextAllocZero(TopMemoryContext,
									  sizeof(RbTemplate) * SPI_processed);
	for (i = 0; i < SPI_processed; i++)
	{
		RbTemplate *t = &copy[n];
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;

		text_to_cstring_buffer(DatumGetTextPP(SPI_getbinval(row, desc, 1, &isnull)),
							   t->pattern, RB_TEXT_LEN);
		t->prefix_len = rb_pattern_prefix(t->pattern);
		t->config.rate = rb_spi_float8(row, desc, 2);
		t->config.capacity = rb_spi_float8(row, desc, 3);
		t->config.floor_rate = rb_spi_float8(row, desc, 4);
		t->config.throttle_factor = rb_spi_float8(row, desc, 5);
		t->config.recovery_factor = rb_spi_float8(row, desc, 6);
		d = SPI_getbinval(row, desc, 7, &isnull);
		t->config.breaker_failures = isnull ? -1 : DatumGetInt32(d);
		if (rb_template_usable(t))
			n++;
	}
	copy_n = n;
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");

	qsort(copy, copy_n, sizeof(RbTemplate), rb_template_cmp);
	copy_valid = invalidations == seen;
}

/*
 * rb_template_match
 *		The most specific template whose pattern matches the endpoint, into
 *		*out; false if none does (or the schema has no templates yet).
 */
bool
rb_template_match(text *endpoint, RbTemplate *out)
{
	const char *key = VARDATA_ANY(endpoint);
	int			len = VARSIZE_ANY_EXHDR(endpoint);
	int			i;

	/* a change committed since this transaction last heard: drop the copy */
	AcceptInvalidationMessages();
	if (!OidIsValid(rb_templates_relid()))
		return false;
	if (!copy_valid)
		rb_template_load();
	for (i = 0; i < copy_n; i++)
		if (copy[i].prefix_len <= len &&
			memcmp(copy[i].pattern, key, copy[i].prefix_len) == 0)
		{
			*out = copy[i];
			return true;
		}
	return false;
}

/*
 * rb_template_lock
 *		Lock the templates for a first use (ROW SHARE, until commit) or for
 *		a change (EXCLUSIVE), see the file header; the templates are then
 *		read again if a change committed meanwhile.
 */
void
rb_template_lock(bool change)
{
	Oid			relid = rb_templates_relid();

	if (!OidIsValid(relid))
		return;
	if (relid != lock_checked_relid)
	{
		lock_on_cluster = rb_is_distributed(relid);
		lock_checked_relid = relid;
	}
	if (lock_on_cluster)
	{
		/*
		 * On Citus the templates are a reference table, copied to every
		 * node, and a first use runs on the endpoint's node while a change
		 * runs on the coordinator: a lock of this node's table alone would
		 * not make them wait for each other.  LOCK TABLE, which Citus takes
		 * on every node, does.
		 */
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute(change ?
						"LOCK TABLE " RB_TEMPLATES_SCHEMA "." RB_TEMPLATES_TABLE
						" IN EXCLUSIVE MODE" :
						"LOCK TABLE " RB_TEMPLATES_SCHEMA "." RB_TEMPLATES_TABLE
						" IN ROW SHARE MODE", false, 0) != SPI_OK_UTILITY)
			elog(ERROR, "could not lock the templates");
		if (SPI_finish() != SPI_OK_FINISH)
			elog(ERROR, "SPI_finish failed");
	}
	else
		LockRelationOid(relid, change ? ExclusiveLock : RowShareLock);
	/* the relid may have been reset by an invalidation the lock let in */
	(void) rb_templates_relid();
}

/* The schema must have the table to change a template. */
static void
rb_template_require_table(void)
{
	if (!OidIsValid(rb_templates_relid()))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("ratebucket's schema has no templates yet"),
				 errhint("Run ALTER EXTENSION ratebucket UPDATE.")));
}

/* A float8 argument, NULL for NaN. */
#define rb_nullable(v) (isnan(v))

/*
 * rb_template_store
 *		Create or replace the template of tmpl->pattern; true if it is new.
 */
bool
rb_template_store(const RbTemplate *tmpl)
{
	Oid			argtypes[7] = {TEXTOID, FLOAT8OID, FLOAT8OID, FLOAT8OID,
	FLOAT8OID, FLOAT8OID, INT4OID};
	Datum		values[7];
	char		nulls[7] = "       ";
	bool		created;
	bool		isnull;
	int			rc;

	rb_template_require_table();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = CStringGetTextDatum(tmpl->pattern);
	values[1] = Float8GetDatum(tmpl->config.rate);
	values[2] = Float8GetDatum(tmpl->config.capacity);
	values[3] = Float8GetDatum(tmpl->config.floor_rate);
	values[4] = Float8GetDatum(tmpl->config.throttle_factor);
	values[5] = Float8GetDatum(tmpl->config.recovery_factor);
	values[6] = Int32GetDatum(tmpl->config.breaker_failures);
	if (rb_nullable(tmpl->config.floor_rate))
		nulls[3] = 'n';
	if (rb_nullable(tmpl->config.throttle_factor))
		nulls[4] = 'n';
	if (rb_nullable(tmpl->config.recovery_factor))
		nulls[5] = 'n';
	if (tmpl->config.breaker_failures < 0)
		nulls[6] = 'n';
	rc = SPI_execute_plan(rb_spi_plan(&store_plan,
									  "INSERT INTO ratebucket.bucket_templates AS t"
									  " (pattern, rate, capacity, floor_rate, throttle_factor,"
									  "  recovery_factor, breaker_failures, configured_at)"
									  " VALUES ($1, $2, $3, $4, $5, $6, $7,"
									  "  pg_catalog.clock_timestamp())"
									  " ON CONFLICT (pattern) DO UPDATE SET"
									  "  rate = EXCLUDED.rate, capacity = EXCLUDED.capacity,"
									  "  floor_rate = EXCLUDED.floor_rate,"
									  "  throttle_factor = EXCLUDED.throttle_factor,"
									  "  recovery_factor = EXCLUDED.recovery_factor,"
									  "  breaker_failures = EXCLUDED.breaker_failures,"
									  "  configured_at = EXCLUDED.configured_at"
									  " RETURNING t.xmax OPERATOR(pg_catalog.=) 0",
									  7, argtypes),
						  values, nulls, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	created = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	return created;
}

/* rb_template_delete: delete the template of "pattern"; false if none. */
bool
rb_template_delete(const char *pattern)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		found;
	int			rc;

	rb_template_require_table();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = CStringGetTextDatum(pattern);
	rc = SPI_execute_plan(rb_spi_plan(&delete_plan,
									  "DELETE FROM ratebucket.bucket_templates"
									  " WHERE pattern OPERATOR(pg_catalog.=) $1",
									  1, argtypes),
						  values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	found = SPI_processed > 0;
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	return found;
}

/*
 * rb_template_followers
 *		The endpoints whose rows follow a template, in byte order (the order
 *		every taker locks in), as a List of text in the caller's memory
 *		context: those that follow "pattern" itself, or with outranked, those
 *		"pattern" matches that follow it or a less specific template (the
 *		endpoints a change of "pattern" configures).
 */
List *
rb_template_followers(const char *pattern, bool outranked)
{
	MemoryContext callcxt = CurrentMemoryContext;
	Oid			argtypes[2] = {TEXTOID, INT4OID};
	Datum		values[2];
	List	   *endpoints = NIL;
	SPIPlanPtr	plan;
	uint64		i;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = CStringGetTextDatum(pattern);
	values[1] = Int32GetDatum((int32) strlen(pattern));
	/* with the latest snapshot: the followers as committed, whatever the level */
	if (outranked)
		plan = rb_spi_plan(&outranked_plan,
						   "SELECT endpoint FROM ratebucket.buckets"
						   " WHERE template IS NOT NULL"
						   "  AND pg_catalog.starts_with(endpoint COLLATE \"C\","
						   "   pg_catalog.rtrim($1, '*'))"
						   "  AND pg_catalog.octet_length(template)"
						   "   OPERATOR(pg_catalog.<=) $2"
						   " ORDER BY endpoint COLLATE \"C\"",
						   2, argtypes);
	else
		plan = rb_spi_plan(&followers_plan,
						   "SELECT endpoint FROM ratebucket.buckets"
						   " WHERE template OPERATOR(pg_catalog.=) $1"
						   " ORDER BY endpoint COLLATE \"C\"",
						   1, argtypes);
	rc = SPI_execute_snapshot(plan, values, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, false, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i],
									  SPI_tuptable->tupdesc, 1, &isnull);
		MemoryContext old = MemoryContextSwitchTo(callcxt);

		endpoints = lappend(endpoints, DatumGetTextPCopy(d));
		MemoryContextSwitchTo(old);
	}
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	return endpoints;
}

/*
 * rb_template_invalidate
 *		Tell every backend (this one at its next command) that the templates
 *		changed: the trigger on the table calls it.
 */
void
rb_template_invalidate(void)
{
	Oid			relid = rb_templates_relid();

	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	copy_valid = false;
}
