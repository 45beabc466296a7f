/*-------------------------------------------------------------------------
 *
 * direct.c
 *	  Bucket rows through the primary key index and the heap, without SQL:
 *	  the fast path of storage.c.
 *
 * A take through SPI runs one or two SQL statements, and their executor
 * start-up and shutdown cost more than the row work itself.  Here the same
 * work is done the way the executor would do it, with nothing around it:
 * an index scan of buckets_pkey under a fresh snapshot (as SPI takes one for
 * each statement), table_tuple_lock as SELECT ... FOR NO KEY UPDATE locks,
 * heap_update as UPDATE writes, and an index entry when the update is not
 * HOT.  So MVCC, row locks, READ COMMITTED's re-read of the newest version,
 * REPEATABLE READ's serialization failures, SSI's predicate locks and WAL
 * are PostgreSQL's own.
 *
 * A lookup first tries where the endpoint's row was found last time (see
 * "Where rows were found" below), and goes through the index when that
 * does not lead to the row.
 *
 * It is used only for a table shaped as the extension created it: a heap
 * table with no triggers (a foreign key to it adds some), no rules, no row
 * security, no inheritance children, and one index, the btree primary key
 * on endpoint; every column the C code knows present with its type.  Anything else (and ratebucket.direct_access = off,
 * which a distributed table needs) leaves all access to SPI, which handles
 * whatever the table has become.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/hash.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "parser/parse_relation.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/smgr.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "bucket/direct.h"
#include "bucket/settings.h"

/* What we know of the table, until the relcache says otherwise. */
typedef enum RbDirectShape
{
	RB_SHAPE_UNKNOWN,
	RB_SHAPE_USABLE,
	RB_SHAPE_UNUSABLE
} RbDirectShape;

static RbDirectShape shape = RB_SHAPE_UNKNOWN;
static Oid	shape_relid = InvalidOid;
static Oid	shape_indexid = InvalidOid;
static uint64 shape_invalidations = 0;	/* heard so far, see rb_direct_shape */
static AttrNumber shape_endpoint_attno;
static int	shape_ncolumns;
static int	shape_attnums[RB_DIRECT_MAX_COLUMNS];

/* The relations opened by rb_direct_begin, and the rows read since. */
static Relation heap_rel = NULL;
static Relation index_rel = NULL;
static bool peek_session = false;	/* opened with AccessShareLock */
static MemoryContext direct_cxt = NULL;

/*
 * Rows read by rb_direct_find, as they were read: rb_direct_update writes
 * the bucket's columns over a copy of its row, so that a column the C code
 * does not know keeps its value.  bucket_take_all reads up to 64 rows.
 */
typedef struct RbReadRow
{
	ItemPointerData tid;
	HeapTuple	tuple;
} RbReadRow;

static RbReadRow *read_rows = NULL;
static int	read_count = 0;
static int	read_size = 0;

/*
 * Where rows were found.  For each endpoint this backend has found through
 * the index, the heap position the index entry gave: the start of the
 * row's chain of versions, which stays the row's entry point for as long
 * as its updates are HOT, that is for most of its life (the table's
 * fillfactor leaves them room).  A lookup starts there and skips the index
 * descent, and goes through the index as before whenever the position no
 * longer leads to a version of this endpoint's row that the snapshot sees:
 * the row was updated onto another page, deleted, the line pointer reused
 * by another row (the endpoint is compared), the page truncated away.
 *
 * The entries are keyed by a hash of the endpoint alone; two endpoints with
 * the same hash share an entry, and the comparison of the endpoint tells
 * them apart.  Nothing else needs to forget a position: whatever happened
 * to the table since (VACUUM, a new file from VACUUM FULL, CLUSTER or
 * TRUNCATE), a position leads to this endpoint's row or the lookup goes
 * through the index.  At most RB_FOUND_MAX entries (about 40 bytes each
 * with dynahash's overhead, some 0.7 MB in all); beyond, the map starts
 * afresh, as it does for another table.  Not used under SERIALIZABLE,
 * where the index scan's predicate locks matter.
 */
#define RB_FOUND_MAX 16384

typedef struct RbFoundEntry
{
	uint32		hash;			/* the key: hash_any of the endpoint */
	ItemPointerData root;		/* the index entry's heap position */
} RbFoundEntry;

static HTAB *found_rows = NULL;
static Oid	found_relid = InvalidOid;

static void
rb_found_reset(void)
{
	if (found_rows != NULL)
		hash_destroy(found_rows);
	found_rows = NULL;
}

static uint32
rb_endpoint_hash(text *endpoint)
{
	return DatumGetUInt32(hash_any((const unsigned char *) VARDATA_ANY(endpoint),
								   VARSIZE_ANY_EXHDR(endpoint)));
}

/* Remember that the endpoint's row was reached through "root". */
static void
rb_found_remember(uint32 hash, ItemPointer root)
{
	RbFoundEntry *entry;

	if (found_rows != NULL && hash_get_num_entries(found_rows) >= RB_FOUND_MAX)
		rb_found_reset();
	if (found_rows == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(uint32);
		ctl.entrysize = sizeof(RbFoundEntry);
		ctl.hcxt = TopMemoryContext;
		found_rows = hash_create("ratebucket found rows", 1024, &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	entry = hash_search(found_rows, &hash, HASH_ENTER, NULL);
	entry->root = *root;
}

/* Forget the shape when the table's (or any) relcache entry goes. */
static void
rb_direct_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	if (relid == InvalidOid || relid == shape_relid || relid == shape_indexid)
	{
		shape = RB_SHAPE_UNKNOWN;
		shape_relid = InvalidOid;
		shape_indexid = InvalidOid;
		shape_invalidations++;
	}
}

/* rb_direct_init: called once from rb_storage_init. */
void
rb_direct_init(void)
{
	direct_cxt = AllocSetContextCreate(TopMemoryContext, "ratebucket direct",
									   ALLOCSET_SMALL_SIZES);
	CacheRegisterRelcacheCallback(rb_direct_relcache_callback, (Datum) 0);
}

/*
 * rb_direct_check_shape
 *		Is the open table as the extension made it?  Records the index and
 *		the column numbers if so.
 */
static RbDirectShape
rb_direct_check_shape(Relation rel, const RbDirectColumn *columns, int ncolumns,
					  Oid *indexid)
{
	TupleDesc	desc = RelationGetDescr(rel);
	List	   *indexes;
	Relation	irel;
	bool		ok;
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		rel->trigdesc != NULL ||
		rel->rd_rules != NULL ||
		rel->rd_rel->relrowsecurity ||
		rel->rd_rel->relhassubclass ||
		ncolumns > RB_DIRECT_MAX_COLUMNS)
		return RB_SHAPE_UNUSABLE;

	shape_endpoint_attno = attnameAttNum(rel, "endpoint", false);
	if (shape_endpoint_attno <= 0 ||
		TupleDescAttr(desc, shape_endpoint_attno - 1)->atttypid != TEXTOID)
		return RB_SHAPE_UNUSABLE;
	for (i = 0; i < ncolumns; i++)
	{
		int			attno = attnameAttNum(rel, columns[i].name, false);

		if (attno <= 0 || TupleDescAttr(desc, attno - 1)->atttypid != columns[i].type)
			return RB_SHAPE_UNUSABLE;
		shape_attnums[i] = attno;
	}
	shape_ncolumns = ncolumns;

	indexes = RelationGetIndexList(rel);
	ok = list_length(indexes) == 1 && linitial_oid(indexes) == rel->rd_pkindex;
	list_free(indexes);
	if (!ok)
		return RB_SHAPE_UNUSABLE;

	irel = index_open(rel->rd_pkindex, AccessShareLock);
	ok = irel->rd_rel->relam == BTREE_AM_OID &&
		irel->rd_index->indnatts == 1 &&
		irel->rd_index->indkey.values[0] == shape_endpoint_attno &&
		heap_attisnull(irel->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(irel->rd_indextuple, Anum_pg_index_indpred, NULL) &&
		irel->rd_index->indisvalid && irel->rd_index->indisready;
	*indexid = RelationGetRelid(irel);
	index_close(irel, AccessShareLock);
	return ok ? RB_SHAPE_USABLE : RB_SHAPE_UNUSABLE;
}

/*
 * rb_direct_shape
 *		Can this session use the open table "rel" directly?  If so, its index
 *		in *indexid.  The shape is checked once and kept until an
 *		invalidation of the table or its index; what this session works
 *		with is its own copy, which an invalidation heard in the middle of
 *		the call does not change (the lock it holds keeps the table as it
 *		is for what it does).  A check that heard an invalidation of the
 *		table while it ran (an index created meanwhile, say) serves this
 *		session only: the next one checks again.
 */
static bool
rb_direct_shape(Relation rel, Oid relid, const RbDirectColumn *columns,
				int ncolumns, Oid *indexid)
{
	RbDirectShape s;
	uint64		seen;

	if (shape != RB_SHAPE_UNKNOWN && shape_relid == relid)
	{
		*indexid = shape_indexid;
		return shape == RB_SHAPE_USABLE;
	}
	/* the table's invalidations are heard from here on */
	shape = RB_SHAPE_UNKNOWN;
	shape_relid = relid;
	shape_indexid = InvalidOid;
	seen = shape_invalidations;
	*indexid = InvalidOid;
	s = rb_direct_check_shape(rel, columns, ncolumns, indexid);
	if (shape_invalidations == seen)
	{
		shape = s;
		shape_indexid = *indexid;
	}
	else
		shape_relid = InvalidOid;
	return s == RB_SHAPE_USABLE;
}

/*
 * rb_direct_begin
 *		Open the table (relid, found by the caller through the extension's
 *		schema) and its index for direct access, if the setting allows it
 *		and the table's shape does.  Returns false, opening nothing, if not.
 *		peek_only: only rb_direct_find(RB_DIRECT_PEEK) follows, and the
 *		relations get the lock a SELECT takes, as the SPI peek does.
 */
bool
rb_direct_begin(Oid relid, const RbDirectColumn *columns, int ncolumns,
				bool peek_only)
{
	Relation	rel;
	LOCKMODE	lockmode;
	Oid			indexid;

	if (!rb_direct_access)
		return false;
	if (shape != RB_SHAPE_UNKNOWN && shape_relid != relid)
		shape = RB_SHAPE_UNKNOWN;
	if (found_relid != relid)
	{
		rb_found_reset();
		found_relid = relid;
	}
	if (shape == RB_SHAPE_UNUSABLE)
		return false;

	/*
	 * The lock UPDATE takes, or the one SELECT takes for a peek (and in a
	 * read-only transaction, as on a standby, where a peek is all that can
	 * succeed); opening also makes the relcache entry current.
	 */
	peek_session = peek_only || XactReadOnly;
	lockmode = peek_session ? AccessShareLock : RowExclusiveLock;
	rel = table_open(relid, lockmode);
	if (!rb_direct_shape(rel, relid, columns, ncolumns, &indexid))
	{
		table_close(rel, NoLock);
		return false;
	}
	heap_rel = rel;
	index_rel = index_open(indexid, lockmode);
	MemoryContextReset(direct_cxt);
	read_rows = NULL;
	read_count = read_size = 0;
	return true;
}

/* rb_direct_end: close what rb_direct_begin opened (locks are kept). */
void
rb_direct_end(void)
{
	if (index_rel != NULL)
		index_close(index_rel, NoLock);
	if (heap_rel != NULL)
		table_close(heap_rel, NoLock);
	index_rel = NULL;
	heap_rel = NULL;
	MemoryContextReset(direct_cxt);
	read_rows = NULL;
	read_count = read_size = 0;
}

/* Remember a row as read, for rb_direct_update. */
static void
rb_direct_remember(TupleTableSlot *slot)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(direct_cxt);
	int			i;

	for (i = 0; i < read_count; i++)
		if (ItemPointerEquals(&read_rows[i].tid, &slot->tts_tid))
			break;
	if (i == read_count)
	{
		if (read_count == read_size)
		{
			read_size = read_size == 0 ? 4 : read_size * 2;
			read_rows = read_rows == NULL ?
				palloc(sizeof(RbReadRow) * read_size) :
				repalloc(read_rows, sizeof(RbReadRow) * read_size);
		}
		read_count++;
	}
	else
		heap_freetuple(read_rows[i].tuple);
	read_rows[i].tid = slot->tts_tid;
	read_rows[i].tuple = ExecCopySlotHeapTuple(slot);
	MemoryContextSwitchTo(oldcxt);
}

/* Hand the row in a slot to the caller, column by column. */
static void
rb_direct_deliver(TupleTableSlot *slot, ItemPointer tid, Datum *values,
				  bool *nulls)
{
	int			i;

	slot_getallattrs(slot);
	for (i = 0; i < shape_ncolumns; i++)
	{
		values[i] = slot->tts_values[shape_attnums[i] - 1];
		nulls[i] = slot->tts_isnull[shape_attnums[i] - 1];
	}
	*tid = slot->tts_tid;
	rb_direct_remember(slot);
}

/*
 * Lock the row an index scan found in "slot" (seen through "snapshot"):
 * RB_FOUND with the slot holding the locked version, RB_LOCKED if another
 * transaction holds it and mode is RB_DIRECT_LOCK_SKIP, RB_NOT_FOUND if it
 * was deleted meanwhile.
 */
static RbFindResult
rb_direct_lock_slot(TupleTableSlot *slot, Snapshot snapshot, RbDirectMode mode)
{
	RbFindResult found = RB_FOUND;
	ItemPointerData locktid = slot->tts_tid;
	TM_FailureData tmfd;
	TM_Result	res;
	int			flags = 0;

	if (peek_session)
	{
		PreventCommandIfReadOnly("SELECT FOR NO KEY UPDATE");
		elog(ERROR, "a bucket row cannot be locked in a session opened to peek");
	}

	if (!IsolationUsesXactSnapshot())
		flags |= TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	res = table_tuple_lock(heap_rel, &locktid, snapshot, slot,
						   GetCurrentCommandId(true),
						   LockTupleNoKeyExclusive,
						   mode == RB_DIRECT_LOCK_SKIP ? LockWaitSkip : LockWaitBlock,
						   flags, &tmfd);
	switch (res)
	{
		case TM_Ok:
			break;
		case TM_WouldBlock:
			found = RB_LOCKED;
			break;
		case TM_Updated:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			elog(ERROR, "unexpected table_tuple_lock status: %u", res);
			break;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			found = RB_NOT_FOUND;
			break;
		case TM_SelfModified:
		case TM_Invisible:
		default:
			elog(ERROR, "unexpected table_tuple_lock status: %u", res);
			break;
	}
	return found;
}

/*
 * Pruning.  A heap fetch prunes the page it comes to (removes the row
 * versions no transaction can see any more, compacts the page and writes a
 * WAL record) when the page has less free space than the table's
 * fillfactor reserves: with ratebucket.buckets at fillfactor 50, a page is
 * half full of live rows right after it is pruned, so it is short again
 * after the next update, and nearly every take paid for a prune of the
 * version the take before it left.  A lookup here prunes a page only once
 * its free space is below RB_PRUNE_BELOW, room left for about ten more
 * versions of a row, and then removes all the dead versions in one go.
 * heap_page_prune_opt still applies its own test (and needs the page free
 * of other pins), so no page is pruned that a heap fetch would have left.
 */
#define RB_PRUNE_BELOW (BLCKSZ / 4)

/*
 * Point the heap fetch "fetch" (of the heap table the shape check ensured)
 * at "block" before it fetches from there: it prunes only on a change of
 * page, so it then leaves pruning to the test here.
 */
static void
rb_direct_visit(IndexFetchTableData *fetch, BlockNumber block)
{
	IndexFetchHeapData *hfetch = (IndexFetchHeapData *) fetch;
	Buffer		prev = hfetch->xs_cbuf;
	Page		page;

	hfetch->xs_cbuf = ReleaseAndReadBuffer(prev, fetch->rel, block);
	if (hfetch->xs_cbuf == prev)
		return;
	page = BufferGetPage(hfetch->xs_cbuf);
	if (PageIsFull(page) || PageGetHeapFreeSpace(page) < RB_PRUNE_BELOW)
		heap_page_prune_opt(fetch->rel, hfetch->xs_cbuf);
}

/*
 * The version of the endpoint's row that "snapshot" sees, found through the
 * index, into "slot"; *root is the index entry's heap position.  False if
 * there is none.
 */
static bool
rb_direct_fetch_indexed(text *endpoint, Snapshot snapshot,
						TupleTableSlot *slot, ItemPointer root)
{
	IndexScanDesc scan;
	ScanKeyData key;
	bool		found;

	ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index_rel->rd_indcollation[0], F_TEXTEQ,
						   PointerGetDatum(endpoint));
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap_rel, index_rel, snapshot, NULL, 1, 0);
#else
	scan = index_beginscan(heap_rel, index_rel, snapshot, 1, 0);
#endif
	index_rescan(scan, &key, 1, NULL, 0);

	/*
	 * index_getnext_slot, taking the index entry's position before the heap
	 * fetch moves it along the chain to the version it finds.
	 */
	found = false;
	for (;;)
	{
		if (!scan->xs_heap_continue)
		{
			ItemPointer entry = index_getnext_tid(scan, ForwardScanDirection);

			if (entry == NULL)
				break;
			*root = *entry;
			rb_direct_visit(scan->xs_heapfetch, ItemPointerGetBlockNumber(entry));
		}
		if (index_fetch_heap(scan, slot))
		{
			found = true;
			break;
		}
	}
	index_endscan(scan);
	return found;
}

/*
 * Is "block" one of the table's?  The storage manager entry keeps the size
 * smgrnblocks last found (an lseek), and forgets it when the relation is
 * truncated: smgrtruncate sets the new size in the backend that
 * truncates, and the invalidation that truncation sends before it releases
 * its lock resets the entry in every other backend, which processes it
 * when it next locks the table (the storage session locks it for every
 * lookup).  The size kept can only be too small, by the pages other
 * backends added since: a block below it exists, and only a block at or
 * past it costs the system call that asks again.  (smgr_cached_nblocks is
 * the storage manager's own field, which it trusts outside recovery only
 * for this reason; the isolation spec take-found-rows truncates under a
 * remembered position.)
 */
static bool
rb_direct_has_block(BlockNumber block)
{
	SMgrRelation smgr = RelationGetSmgr(heap_rel);
	BlockNumber known = smgr->smgr_cached_nblocks[MAIN_FORKNUM];

	if (known != InvalidBlockNumber && block < known)
		return true;
	return block < smgrnblocks(smgr, MAIN_FORKNUM);
}

/*
 * The version of the endpoint's row that "snapshot" sees, found from where
 * the row was last found (see "Where rows were found"), into "slot", as an
 * index scan fetches the heap tuple an index entry points to.  False if
 * that position is unknown or does not lead to it: the index then finds
 * the row, or that there is none.
 */
static bool
rb_direct_fetch_found(text *endpoint, uint32 hash, Snapshot snapshot,
					  TupleTableSlot *slot)
{
	RbFoundEntry *entry;
	IndexFetchTableData *fetch;
	ItemPointerData root;
	bool		call_again = false;
	bool		all_dead = false;
	bool		found;
	Datum		key;
	bool		isnull;
	text	   *stored;

	if (found_rows == NULL)
		return false;
	entry = hash_search(found_rows, &hash, HASH_FIND, NULL);
	if (entry == NULL)
		return false;
	root = entry->root;
	/* a block VACUUM truncated away is not there to read */
	if (!rb_direct_has_block(ItemPointerGetBlockNumber(&root)))
		return false;

	fetch = table_index_fetch_begin(heap_rel);
	rb_direct_visit(fetch, ItemPointerGetBlockNumber(&root));
	found = table_index_fetch_tuple(fetch, &root, snapshot, slot, &call_again,
									&all_dead);
	table_index_fetch_end(fetch);
	if (!found)
		return false;

	/*
	 * The line pointer may have been reused by another endpoint's row.  The
	 * bytes are compared: a collation that calls other bytes equal only
	 * sends the lookup through the index.
	 */
	key = slot_getattr(slot, shape_endpoint_attno, &isnull);
	if (isnull)
		return false;
	stored = DatumGetTextPP(key);
	return VARSIZE_ANY_EXHDR(stored) == VARSIZE_ANY_EXHDR(endpoint) &&
		memcmp(VARDATA_ANY(stored), VARDATA_ANY(endpoint),
			   VARSIZE_ANY_EXHDR(endpoint)) == 0;
}

/*
 * rb_direct_find
 *		Find the endpoint's row and, as "mode" asks, lock it: the work of
 *		one SELECT ... WHERE endpoint = $1 [FOR NO KEY UPDATE [SKIP LOCKED]].
 *		Returns RB_FOUND with the row's columns (in the order given to
 *		rb_direct_begin) in values/nulls, its position in *tid, or
 *		RB_NOT_FOUND, or RB_LOCKED (RB_DIRECT_LOCK_SKIP only).
 *
 * The snapshot is taken as SPI takes one for a statement: a fresh one under
 * READ COMMITTED, the transaction's otherwise, after making the
 * transaction's own earlier writes visible.  Under READ COMMITTED a lock
 * that waited for a holder who then updated the row locks and returns the
 * newest version; under REPEATABLE READ that is a serialization failure.
 * A row deleted meanwhile is not found (or, under REPEATABLE READ, the same
 * failure).  Values point into memory valid until rb_direct_end; the
 * caller copies what it keeps.
 */
RbFindResult
rb_direct_find(text *endpoint, RbDirectMode mode, ItemPointer tid,
			   Datum *values, bool *nulls)
{
	Snapshot	snapshot;
	TupleTableSlot *slot;
	MemoryContext oldcxt;
	RbFindResult found = RB_NOT_FOUND;
	ItemPointerData root;
	uint32		hash;
	bool		use_found;

	Assert(heap_rel != NULL);

	CommandCounterIncrement();
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	snapshot = GetActiveSnapshot();

	oldcxt = MemoryContextSwitchTo(direct_cxt);
	slot = table_slot_create(heap_rel, NULL);
	use_found = !IsolationIsSerializable();
	hash = rb_endpoint_hash(endpoint);
	if (use_found && rb_direct_fetch_found(endpoint, hash, snapshot, slot))
		found = RB_FOUND;
	else if (rb_direct_fetch_indexed(endpoint, snapshot, slot, &root))
	{
		found = RB_FOUND;
		if (use_found)
			rb_found_remember(hash, &root);
	}

	if (found == RB_FOUND && mode != RB_DIRECT_PEEK)
		found = rb_direct_lock_slot(slot, snapshot, mode);

	if (found == RB_FOUND)
		rb_direct_deliver(slot, tid, values, nulls);
	ExecDropSingleTupleTableSlot(slot);
	MemoryContextSwitchTo(oldcxt);
	PopActiveSnapshot();
	return found;
}

/*
 * A new version of a row, written by rb_direct_update: a HOT update needs
 * no index entry; any other needs the key's.
 */
static void
rb_direct_index_version(HeapTuple newtup)
{
	IndexInfo  *info;
	Datum		keyval[1];
	bool		keynull[1];

	if (HeapTupleIsHeapOnly(newtup))
		return;
	info = BuildIndexInfo(index_rel);
	keyval[0] = heap_getattr(newtup, shape_endpoint_attno,
							 RelationGetDescr(heap_rel), &keynull[0]);
	index_insert(index_rel, keyval, keynull, &newtup->t_self, heap_rel,
				 UNIQUE_CHECK_YES, true, info);
}

/* The new version is the one a later update in this call writes over. */
static void
rb_direct_replace_read(ItemPointer tid, HeapTuple newtup)
{
	int			i;

	for (i = 0; i < read_count; i++)
		if (ItemPointerEquals(&read_rows[i].tid, tid))
		{
			heap_freetuple(read_rows[i].tuple);
			read_rows[i].tuple = newtup;
			read_rows[i].tid = newtup->t_self;
			break;
		}
}

#ifdef USE_ASSERT_CHECKING
/*
 * Would heap_update find the row at *tid free to write (TM_Ok): the
 * version read, held by no other transaction?  Looked at under a share lock
 * of its buffer, as heap_update looks at it under an exclusive one.
 */
static bool
rb_direct_untouched(ItemPointer tid)
{
	OffsetNumber off = ItemPointerGetOffsetNumber(tid);
	TM_Result	res = TM_Invisible;
	Buffer		buffer;
	Page		page;

	buffer = ReadBuffer(heap_rel, ItemPointerGetBlockNumber(tid));
	LockBuffer(buffer, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buffer);
	if (off >= FirstOffsetNumber && off <= PageGetMaxOffsetNumber(page))
	{
		ItemId		lp = PageGetItemId(page, off);

		if (ItemIdIsNormal(lp))
		{
			HeapTupleData tuple;

			tuple.t_data = (HeapTupleHeader) PageGetItem(page, lp);
			tuple.t_len = ItemIdGetLength(lp);
			tuple.t_tableOid = RelationGetRelid(heap_rel);
			tuple.t_self = *tid;
			res = HeapTupleSatisfiesUpdate(&tuple, GetCurrentCommandId(false),
										   buffer);
		}
	}
	UnlockReleaseBuffer(buffer);
	return res == TM_Ok;
}
#endif

/*
 * rb_direct_patch
 *		The new version of a row read as oldtup, with the known columns' new
 *		values, made as a copy of oldtup with each value written over the
 *		old one where it lies: what heap_modify_tuple_by_cols would form,
 *		for less than half its cost (it takes every column apart and puts
 *		the row together again).  The catalogs' updates are made the same
 *		way.  heap_update then sets the new version's header afresh.
 *
 *		That holds when the copy's layout is the new row's: every column is
 *		null in both or in neither, and every variable-width column keeps its
 *		bytes.  A take changes numbers and times, so it holds for nearly
 *		every write.  Otherwise, and for a row stored before a column was
 *		added to the table (it has fewer attributes than the table), NULL
 *		comes back and the caller forms the row whole.
 */
static HeapTuple
rb_direct_patch(HeapTuple oldtup, TupleDesc desc, const Datum *values,
				const bool *nulls)
{
	HeapTupleHeader td = oldtup->t_data;
	int			natts = desc->natts;
	bits8	   *bp = td->t_bits;
	bool		hasnulls = HeapTupleHasNulls(oldtup);
	char	   *tp = (char *) td + td->t_hoff;
	int32		offsets[MaxHeapAttributeNumber];
	uint32		off = 0;
	HeapTuple	newtup;
	int			attnum;
	int			i;

	if (HeapTupleHeaderGetNatts(td) != natts)
		return NULL;

	/* Where each attribute lies in the row (-1: null), as deforming finds it. */
	for (attnum = 0; attnum < natts; attnum++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, attnum);

		if (hasnulls && att_isnull(attnum, bp))
		{
			offsets[attnum] = -1;
			continue;
		}
		if (att->attlen == -1)
			off = att_align_pointer(off, att->attalign, -1, tp + off);
		else
			off = att_align_nominal(off, att->attalign);
		offsets[attnum] = off;
		off = att_addlength_pointer(off, att->attlen, tp + off);
	}

	/* Whether the layout holds. */
	for (i = 0; i < shape_ncolumns; i++)
	{
		int			a = shape_attnums[i] - 1;
		Form_pg_attribute att = TupleDescAttr(desc, a);

		if (nulls[i] != (offsets[a] < 0))
			return NULL;
		if (!nulls[i] && att->attlen < 0)
		{
			struct varlena *old = (struct varlena *) (tp + offsets[a]);
			struct varlena *new = (struct varlena *) DatumGetPointer(values[i]);

			if (att->attlen != -1 ||
				VARATT_IS_EXTERNAL(new) || VARATT_IS_COMPRESSED(new) ||
				VARATT_IS_EXTERNAL(old) || VARATT_IS_COMPRESSED(old) ||
				VARSIZE_ANY_EXHDR(old) != VARSIZE_ANY_EXHDR(new) ||
				memcmp(VARDATA_ANY(old), VARDATA_ANY(new), VARSIZE_ANY_EXHDR(new)) != 0)
				return NULL;
		}
	}

	/* The copy, and the fixed-width values written over it. */
	newtup = heap_copytuple(oldtup);
	tp = (char *) newtup->t_data + newtup->t_data->t_hoff;
	for (i = 0; i < shape_ncolumns; i++)
	{
		int			a = shape_attnums[i] - 1;
		Form_pg_attribute att = TupleDescAttr(desc, a);

		if (nulls[i] || att->attlen < 0)
			continue;
		if (att->attbyval)
			store_att_byval(tp + offsets[a], values[i], att->attlen);
		else
			memcpy(tp + offsets[a], DatumGetPointer(values[i]), att->attlen);
	}
	return newtup;
}

/*
 * rb_direct_update
 *		Write the row read at *tid (by rb_direct_find) with new values for
 *		the known columns, as UPDATE would.
 *
 * With wait, the row must be ours to write (locked by rb_direct_find, or by
 * this transaction otherwise): anything else is an error.  Without, the
 * write happens only if no other transaction has touched the row since it
 * was read, nor holds a lock on it now; otherwise nothing is written and
 * false comes back.  On success *tid is the new version's position.
 */
bool
rb_direct_update(ItemPointer tid, const Datum *values, const bool *nulls,
				 bool wait)
{
	HeapTuple	oldtup = NULL;
	HeapTuple	newtup;
	TM_FailureData tmfd;
	TM_Result	res;
	LockTupleMode lockmode;
	MemoryContext oldcxt;
	bool		update_wait;
	int			i;

	Assert(heap_rel != NULL);
	for (i = 0; i < read_count; i++)
		if (ItemPointerEquals(&read_rows[i].tid, tid))
			oldtup = read_rows[i].tuple;
	if (oldtup == NULL)
		elog(ERROR, "bucket row to update was not read first");

	PreventCommandIfReadOnly("UPDATE");
	PreventCommandIfParallelMode("UPDATE");
	if (peek_session)
		elog(ERROR, "a bucket row cannot be written in a session opened to peek");

	/*
	 * heap_update without waiting returns TM_BeingModified for a row another
	 * transaction holds, and the caller then locks it the usual way.  No
	 * caller in PostgreSQL itself updates without waiting, and a server built
	 * with assertions asserts that none meets a held row.  There, look first
	 * and update only a row nobody holds, waiting in heap_update in the rare
	 * case that one took it in between (production builds do not wait).
	 */
#ifdef USE_ASSERT_CHECKING
	if (!wait && !rb_direct_untouched(tid))
		return false;
	update_wait = true;
#else
	update_wait = wait;
#endif

	oldcxt = MemoryContextSwitchTo(direct_cxt);
	newtup = rb_direct_patch(oldtup, RelationGetDescr(heap_rel), values, nulls);
	if (newtup == NULL)
		newtup = heap_modify_tuple_by_cols(oldtup, RelationGetDescr(heap_rel),
										   shape_ncolumns, shape_attnums,
										   (Datum *) values, (bool *) nulls);
	{
#if PG_VERSION_NUM >= 160000
		TU_UpdateIndexes update_indexes;

		res = heap_update(heap_rel, tid, newtup, GetCurrentCommandId(true),
						  InvalidSnapshot, update_wait, &tmfd, &lockmode,
						  &update_indexes);
#else
		res = heap_update(heap_rel, tid, newtup, GetCurrentCommandId(true),
						  InvalidSnapshot, update_wait, &tmfd, &lockmode);
#endif
	}
	if (res != TM_Ok)
	{
		MemoryContextSwitchTo(oldcxt);
		if (!wait && (res == TM_BeingModified || res == TM_Updated ||
					  res == TM_Deleted))
			return false;
		if (res == TM_Updated || res == TM_Deleted)
		{
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
		}
		elog(ERROR, "bucket row could not be updated at its locked position (status %u)",
			 res);
	}

	rb_direct_index_version(newtup);
	rb_direct_replace_read(tid, newtup);
	*tid = newtup->t_self;
	MemoryContextSwitchTo(oldcxt);
	return true;
}
