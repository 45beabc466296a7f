/*-------------------------------------------------------------------------
 *
 * reserve.c
 *	  Token reserves in shared memory: the hot-endpoint mode.
 *
 * An endpoint given a reserve (bucket_reserve) keeps some of its tokens in
 * a slot of shared memory instead of its row.  A take draws from the slot
 * under its spinlock, without reading or writing the row; the take that
 * finds the slot empty goes through the row like any other, and moves up to
 * a batch of the row's tokens into the slot with the same write.
 *
 * The bound rate·T + capacity stays exact because of one invariant: the
 * row's tokens plus what the slot holds (its tokens, the tokens moved by
 * refills not yet committed, the tokens drawn by takes not yet committed)
 * never exceed the capacity.  Every read of the row caps its tokens at
 * capacity minus that sum (rb_reserve_read), and only a writer of the row
 * makes the sum grow, after its write, while it holds the row; whatever
 * else happens to the slot makes it shrink.
 *
 * The row keeps refilling while the slot holds tokens, and what it would
 * hold is what a reader finds after a crash, when the slot is gone.  So
 * the slot also knows the row as the last committed refill wrote it (its
 * "line": tokens at a time, growing at the rate up to the capacity), and a
 * draw first lets go of the slot's tokens that would take the row and the
 * slot together past the capacity in force, which feedback and a burst the
 * destination published lower (rb_slot_expire): an endpoint that sits idle
 * with tokens in its reserve finds them back in its row, not twice.
 * A write of the row that would put more in it than the line allows (a
 * hand-over of tokens back to the row) empties the slot.
 *
 * The lease: a refill also moves the row's refill time ahead, by
 * ratebucket.reserve_lease, as a cooldown does.  Until then the row refills
 * nothing, and the slot refills instead, at the rate the row refilled at
 * (rb_slot_accrue), from the time of the refill's write, once that write is
 * durably committed.  Row and slot never refill at once, so together they
 * refill at the rate, as the row alone would; the line stands still during
 * the lease, so the slot's tokens last while it does, even in a bucket that
 * stays full.  A crash loses what is left of the lease with the slot: the
 * row, frozen, refills again when it ends.  A take that the row refuses
 * during a lease is told when the slot will grant it, if that is sooner
 * (rb_reserve_wait).
 *
 * Transactions:
 *	  - a draw counts as drawn until its transaction ends: committed, the
 *		token is spent; rolled back (or its subtransaction), it returns to
 *		the slot;
 *	  - a refill's tokens are pending until its transaction ends: committed
 *		durably (rb_commit_is_durable), they become drawable; rolled back,
 *		they stay with the row, which the rollback restores; prepared
 *		(two-phase), or committed without the synchronous standbys'
 *		acknowledgement (a cancelled wait), they are dropped;
 *	  - a take through such a row commits as durably as synchronous_commit
 *		= on makes it, whatever the setting says (rb_reserve_make_durable),
 *		so tokens are never drawable before the row that gave them up is
 *		durable, and replicated to a synchronous standby: a crash or a
 *		failover empties the slots, which only loses tokens.
 *
 * Emptying ("draining"): a write of the row that changes what the slot was
 * filled under (the limits, a lower rate, a cooldown, a pause, an open
 * breaker, more tokens than the invariant allows, the reserve turned off)
 * empties the slot at once and starts a new generation; whatever the old
 * generation's transactions do at their end is then ignored, and the slot
 * knows its row again (its line) from the new generation's first refill.
 *
 * Slots are found through a shared hash table keyed by database, table and
 * endpoint, under one LWLock, and each backend keeps its own map from
 * endpoint to slot for the draws, checked under the slot's spinlock by an
 * incarnation number that changes whenever a slot is given to another
 * endpoint.  When every slot is in use, the least recently refilled is
 * taken back: its tokens are lost.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

#include "bucket/reserve.h"

#define RB_RESERVE_TRANCHE "ratebucket reserves"

/* How long a take waits for a refill on its way, and how often. */
#define RB_REFILL_WAIT_MS 10
#define RB_REFILL_WAITS 5

/* The longest lease, in milliseconds. */
#define RB_RESERVE_MAX_LEASE_MS 10000

typedef struct RbReserveKey
{
	Oid			dbid;
	Oid			relid;
	char		endpoint[RB_RESERVE_MAX_ENDPOINT + 1];
} RbReserveKey;

typedef struct RbReserveEntry
{
	RbReserveKey key;
	int			slot;
} RbReserveEntry;

typedef struct RbSlot
{
	slock_t		mutex;
	ConditionVariable refilled; /* broadcast when pending tokens land */
	uint64		incarnation;	/* 0: free */
	uint64		generation;		/* changes when the slot is drained */
	RbReserveKey key;
	double		tokens;
	double		pending;
	double		drawn;
	double		batch;
	/* the row as the last committed refill wrote it (see above) */
	double		line_tokens;
	TimestampTz line_at;		/* ahead of the clock: the lease's end */
	TimestampTz accrued_at;		/* the lease's refill counted up to here */
	/* refills handed over and not yet settled, and the latest lease they wrote */
	int			pending_refills;
	TimestampTz pending_line_at;
	/* what it was filled under: the request, and the limits it resolved to */
	bool		from_config;
	double		req_rate;
	double		req_capacity;
	double		rate;
	double		capacity;
	double		effective_rate; /* the row's, for that take: the lease's */
	double		capacity_now;	/* the capacity in force, at most */
	/* committed draws the row has not counted yet */
	int64		unsaved_takes;
	double		unsaved_tokens;
	/* for bucket_reserves */
	int64		draws;
	double		tokens_drawn;
	int64		refills;
	int64		drains;
	TimestampTz created_at;
	TimestampTz last_refill_at;
} RbSlot;

typedef struct RbReserveShared
{
	LWLock	   *lock;
	uint64		next_incarnation;
	RbSlot		slots[FLEXIBLE_ARRAY_MEMBER];
} RbReserveShared;

/* What this backend's transaction did to slots, undone or settled at its end. */
typedef struct RbAction
{
	int			slot;
	uint64		incarnation;
	uint64		generation;
	SubTransactionId subid;
	bool		refill;			/* else a draw */
	double		tokens;
	int64		takes;			/* draws: how many */
	int64		saved_takes;	/* refills: committed draws the row counted */
	double		saved_tokens;
	double		row_tokens;		/* refills: the row as written */
	TimestampTz row_at;
	TimestampTz written_at;		/* refills: when (a lease starts then) */
} RbAction;

/* This backend's map from endpoint to slot. */
typedef struct RbCacheEntry
{
	char		endpoint[RB_RESERVE_MAX_ENDPOINT + 1];
	int			slot;
	uint64		incarnation;
} RbCacheEntry;

static int	rb_reserves_max = 1024;
static int	rb_reserve_lease_ms = 50;
static RbReserveShared *reserve_shared = NULL;
static HTAB *reserve_index = NULL;
static HTAB *reserve_cache = NULL;

static RbAction *actions = NULL;
static int	nactions = 0;
static int	maxactions = 0;

/* Has this transaction taken through a row with a reserve? */
static bool durable_commit = false;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
rb_reserve_shmem_size(void)
{
	return add_size(add_size(offsetof(RbReserveShared, slots),
							 mul_size(rb_reserves_max, sizeof(RbSlot))),
					hash_estimate_size(rb_reserves_max, sizeof(RbReserveEntry)));
}

static void
rb_reserve_shmem_request(void)
{
#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	RequestAddinShmemSpace(rb_reserve_shmem_size());
	RequestNamedLWLockTranche(RB_RESERVE_TRANCHE, 1);
}

static void
rb_reserve_shmem_startup(void)
{
	HASHCTL		info;
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	reserve_shared = ShmemInitStruct(RB_RESERVE_TRANCHE,
									 add_size(offsetof(RbReserveShared, slots),
											  mul_size(rb_reserves_max,
													   sizeof(RbSlot))),
									 &found);
	if (!found)
	{
		reserve_shared->lock = &(GetNamedLWLockTranche(RB_RESERVE_TRANCHE))->lock;
		reserve_shared->next_incarnation = 1;
		for (i = 0; i < rb_reserves_max; i++)
		{
			RbSlot	   *slot = &reserve_shared->slots[i];

			memset(slot, 0, sizeof(*slot));
			SpinLockInit(&slot->mutex);
			ConditionVariableInit(&slot->refilled);
		}
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RbReserveKey);
	info.entrysize = sizeof(RbReserveEntry);
	reserve_index = ShmemInitHash("ratebucket reserve index",
								  rb_reserves_max, rb_reserves_max,
								  &info, HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
}

static void rb_reserve_xact(XactEvent event, void *arg);
static void rb_reserve_subxact(SubXactEvent event, SubTransactionId mySubid,
							   SubTransactionId parentSubid, void *arg);

/*
 * rb_reserve_init
 *		Define ratebucket.reserves; when the library is preloaded, ask for
 *		the slots' shared memory and watch transactions end.
 */
void
rb_reserve_init(void)
{
	/* a PGC_POSTMASTER setting can only be made while the server starts */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("ratebucket.reserves",
							"Slots for token reserves (bucket_reserve); needs shared_preload_libraries.",
							"Each slot takes about 700 bytes of shared memory. 0 turns reserves off.",
							&rb_reserves_max, 1024, 0, 1000000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.reserve_lease",
							"How long a refill of a token reserve leases its row's refill to the reserve.",
							"Until then the row refills nothing and the reserve refills at the row's rate. 0 leases nothing.",
							&rb_reserve_lease_ms, 50, 0, RB_RESERVE_MAX_LEASE_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	if (rb_reserves_max == 0)
		return;
#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = rb_reserve_shmem_request;
#else
	rb_reserve_shmem_request();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = rb_reserve_shmem_startup;
	RegisterXactCallback(rb_reserve_xact, NULL);
	RegisterSubXactCallback(rb_reserve_subxact, NULL);
}

/* Can endpoints have reserves here (preloaded, with slots)? */
bool
rb_reserve_available(void)
{
	return reserve_shared != NULL;
}

/* Does this backend know of a reserve, one it could draw from? */
bool
rb_reserve_known(void)
{
	return reserve_cache != NULL && hash_get_num_entries(reserve_cache) > 0;
}

/* The endpoint as a key (false if too long for a reserve). */
static bool
rb_reserve_key(text *endpoint, Oid relid, RbReserveKey *key)
{
	int			len = VARSIZE_ANY_EXHDR(endpoint);

	/* a call keeps its table to its end (storage.c): never a key without it */
	if (!OidIsValid(relid))
		elog(ERROR, "token reserve looked up without its table");
	if (len > RB_RESERVE_MAX_ENDPOINT)
		return false;
	memset(key, 0, sizeof(*key));
	key->dbid = MyDatabaseId;
	key->relid = relid;
	memcpy(key->endpoint, VARDATA_ANY(endpoint), len);
	return true;
}

/* This backend's cached slot for the endpoint, or NULL. */
static RbCacheEntry *
rb_cache_find(const char *endpoint, bool create)
{
	bool		found;

	if (reserve_cache == NULL)
	{
		HASHCTL		info;

		if (!create)
			return NULL;
		memset(&info, 0, sizeof(info));
		info.keysize = RB_RESERVE_MAX_ENDPOINT + 1;
		info.entrysize = sizeof(RbCacheEntry);
		info.hcxt = TopMemoryContext;
		reserve_cache = hash_create("ratebucket reserve cache", 64, &info,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return hash_search(reserve_cache, endpoint,
					   create ? HASH_ENTER : HASH_FIND, &found);
}

static void
rb_cache_remember(const RbReserveKey *key, int slot, uint64 incarnation)
{
	RbCacheEntry *entry = rb_cache_find(key->endpoint, true);

	entry->slot = slot;
	entry->incarnation = incarnation;
}

static void
rb_cache_forget(const char *endpoint)
{
	if (reserve_cache != NULL)
		hash_search(reserve_cache, endpoint, HASH_REMOVE, NULL);
}

/* Everything the slot holds (the invariant's part of it); mutex held. */
static double
rb_slot_held(const RbSlot *slot)
{
	return slot->tokens + slot->pending + slot->drawn;
}

/*
 * Empty the slot and start a new generation; mutex held.
 *
 * The slot forgets its line too, as a new slot has none: the write that
 * drains may have moved the row's refill time back (bucket_reset), and a
 * refill of the new generation may then write an earlier lease's end than
 * the line's, which the line would ignore while the row refills.  Until a
 * refill of the new generation lands, the row may be full, so the slot
 * keeps nothing; and what is left of the lease is lost: the slot accrues
 * nothing until that refill's write, the row refills after it.
 */
static void
rb_slot_drain(RbSlot *slot)
{
	if (rb_slot_held(slot) > 0.0)
		slot->drains++;
	slot->generation++;
	slot->tokens = 0.0;
	slot->pending = 0.0;
	slot->drawn = 0.0;
	slot->line_tokens = INFINITY;
	slot->line_at = 0;
	slot->accrued_at = 0;
	slot->pending_refills = 0;
	slot->pending_line_at = 0;
}

/*
 * The most the slot's row can hold at "now" (its line); mutex held.  The
 * row refills at its rate times the feedback's factor, never above 1, so
 * the rate the slot was filled under bounds it; during a lease it does not
 * refill.
 */
static double
rb_slot_row_most(const RbSlot *slot, TimestampTz now)
{
	double		most = slot->line_tokens;

	if (now > slot->line_at)
		most += slot->rate * (double) (now - slot->line_at) / USECS_PER_SEC;
	return Min(most, slot->capacity);
}

/*
 * Add what the lease refilled up to "now", at the rate the row refilled at
 * when the lease was written; mutex held.
 */
static void
rb_slot_accrue(RbSlot *slot, TimestampTz now)
{
	TimestampTz until = Min(now, slot->line_at);

	if (until > slot->accrued_at)
	{
		slot->tokens += ((double) (until - slot->accrued_at) / USECS_PER_SEC) *
			slot->effective_rate;
		slot->accrued_at = until;
	}
}

/*
 * The capacity row and slot hold together: the one in force (lowered by
 * feedback, or by a burst the destination published) as the row's last
 * write left it; mutex held.  It only grows with time until the next
 * write, so the value of that write is never above the one in force.
 */
static double
rb_slot_capacity(const RbSlot *slot)
{
	return Min(slot->capacity, slot->capacity_now);
}

/*
 * Bring the slot to "now": add what its lease refilled, then let go of the
 * tokens that would take the row and the slot together past the capacity
 * in force (the row refilled while they sat here, or the lease refilled
 * the slot past what the row lacks); mutex held.
 */
static void
rb_slot_expire(RbSlot *slot, TimestampTz now)
{
	double		cap = rb_slot_capacity(slot);
	double		excess;

	rb_slot_accrue(slot, now);
	excess = Min(rb_slot_row_most(slot, now), cap) + slot->tokens +
		slot->pending - cap;
	if (excess > 0.0)
		slot->tokens = Max(0.0, slot->tokens - excess);
}

/* The slot index of a key, under the shared lock; -1 if none. */
static int
rb_index_find(const RbReserveKey *key)
{
	RbReserveEntry *entry;
	int			slot = -1;

	LWLockAcquire(reserve_shared->lock, LW_SHARED);
	entry = hash_search(reserve_index, key, HASH_FIND, NULL);
	if (entry != NULL)
		slot = entry->slot;
	LWLockRelease(reserve_shared->lock);
	return slot;
}

/*
 * rb_reserve_read
 *		A row was read: if its endpoint has a slot, note which (for the
 *		write and the refill), let go of the slot's tokens the row has
 *		refilled past (rb_slot_expire), and cap the row's tokens at its
 *		capacity less what the slot holds, banked at the time of the read.
 */
void
rb_reserve_read(RbBucket *bucket, Oid relid)
{
	RbReserveKey key;
	RbSlot	   *slot;
	int			i;
	double		held;
	TimestampTz now;

	bucket->reserve.found = false;
	if (reserve_shared == NULL || !rb_has_reserve(bucket) ||
		bucket->key == NULL || !rb_reserve_key(bucket->key, relid, &key))
		return;
	i = rb_index_find(&key);
	if (i < 0)
		return;
	slot = &reserve_shared->slots[i];
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->mutex);
	if (slot->incarnation == 0 || memcmp(&slot->key, &key, sizeof(key)) != 0)
	{
		SpinLockRelease(&slot->mutex);
		return;
	}
	rb_slot_expire(slot, now);
	bucket->reserve.found = true;
	bucket->reserve.slot = i;
	bucket->reserve.incarnation = slot->incarnation;
	bucket->reserve.generation = slot->generation;
	held = rb_slot_held(slot);
	SpinLockRelease(&slot->mutex);
	rb_cache_remember(&key, i, bucket->reserve.incarnation);
	if (held > 0.0)
		rb_bucket_hold_out(bucket, held, now);
}

/*
 * May the slot's tokens still be drawn after this write of its row, which
 * refills it at "rate" and holds at most "cap" now?
 */
static bool
rb_slot_still_fits(const RbSlot *slot, const RbBucket *bucket,
				   const RbBucketNow *now, double rate, double cap)
{
	if (!rb_has_reserve(bucket))
		return false;
	if (now->paused || now->breaker != RB_BREAKER_CLOSED ||
		now->cooldown_seconds > 0.0)
		return false;
	if (bucket->rate != slot->rate || bucket->capacity != slot->capacity)
		return false;
	if (rate < slot->effective_rate * (1.0 - 1e-9))
		return false;
	/*
	 * A refill time moved back into a lease would refill row and slot at
	 * once: the lease of the line, and that of a refill whose transaction
	 * has committed (so this write could lock the row) but not yet settled
	 * (its line is not the slot's yet).
	 */
	if (bucket->state.refilled_at < Max(slot->line_at, slot->pending_line_at))
		return false;
	if (bucket->state.tokens >
		rb_slot_row_most(slot, bucket->state.refilled_at) + cap * 1e-12)
		return false;
	return bucket->state.tokens + rb_slot_held(slot) <= cap * (1.0 + 1e-12);
}

static void rb_reserve_make_durable(void);

/*
 * rb_reserve_written
 *		A row was written.  If its endpoint has a reserve, whatever wrote it
 *		(a take, a claim's batch, an administrative change), its transaction
 *		commits durably (rb_reserve_make_durable): a crash must not undo a
 *		write of the row while tokens it gave up or granted stay told.  A
 *		row read with a slot: drain the slot unless what it holds may still
 *		be drawn (rb_slot_still_fits), which a row given more than its line
 *		allows never is.
 */
void
rb_reserve_written(const RbBucket *bucket)
{
	RbSlot	   *slot;
	RbBucketNow now;
	TimestampTz at;
	double		rate;
	double		cap;
	bool		drained = false;

	if (reserve_shared == NULL)
		return;
	if (rb_has_reserve(bucket))
		rb_reserve_make_durable();
	if (!bucket->reserve.found)
		return;
	at = GetCurrentTimestamp();
	rb_bucket_now(bucket, at, &now);
	rate = rb_bucket_rate_now(bucket, at);
	cap = rb_bucket_capacity_now(bucket, at);
	slot = &reserve_shared->slots[bucket->reserve.slot];
	SpinLockAcquire(&slot->mutex);
	if (slot->incarnation == bucket->reserve.incarnation)
	{
		if (!rb_slot_still_fits(slot, bucket, &now, rate, cap))
		{
			rb_slot_drain(slot);
			drained = true;
		}

		/*
		 * A capacity lowered by this write (a published burst) caps what
		 * the lease refills from now on; one it raised waits for the next
		 * refill, since this write may yet roll back.
		 */
		slot->capacity_now = Min(slot->capacity_now, cap);
	}
	SpinLockRelease(&slot->mutex);
	if (drained)
		ConditionVariableBroadcast(&slot->refilled);
}

/* Room for one more action, made before a slot is changed (no error after). */
static void
rb_actions_make_room(void)
{
	if (nactions == maxactions)
	{
		int			n = Max(16, maxactions * 2);

		actions = actions == NULL ?
			MemoryContextAlloc(TopMemoryContext, n * sizeof(RbAction)) :
			repalloc(actions, n * sizeof(RbAction));
		maxactions = n;
	}
}

/*
 * Record what this transaction did to a slot, merged with the like; room
 * was made (rb_actions_make_room).
 */
static void
rb_action_add(const RbAction *action)
{
	int			i;

	for (i = 0; i < nactions; i++)
	{
		RbAction   *a = &actions[i];

		if (a->slot == action->slot && a->incarnation == action->incarnation &&
			a->generation == action->generation && a->subid == action->subid &&
			a->refill == action->refill && !a->refill)
		{
			a->tokens += action->tokens;
			a->takes += action->takes;
			return;
		}
	}
	Assert(nactions < maxactions);
	actions[nactions++] = *action;
}

/* Has this transaction a refill of the slot on its way? */
static bool
rb_own_refill(int slot)
{
	int			i;

	for (i = 0; i < nactions; i++)
		if (actions[i].slot == slot && actions[i].refill)
			return true;
	return false;
}

/* Do the slot's tokens answer this request (same request, same limits)? */
static bool
rb_slot_serves(const RbSlot *slot, bool use_config, double rate,
			   double capacity)
{
	if (slot->from_config != use_config)
		return false;
	return use_config || (slot->req_rate == rate &&
						  slot->req_capacity == capacity);
}

/*
 * How many tokens the slot grants the request now (0: none); mutex held.
 * A take of "want" gets all or nothing, a take of up to "upto" as many
 * whole tokens as the slot has.
 */
static double
rb_slot_grant(const RbSlot *slot, double want, int64 upto)
{
	if (upto > 0)
		return Min((double) upto, floor(slot->tokens));
	return slot->tokens >= want ? want : 0.0;
}

/*
 * One try at a draw: 1 drawn, 0 not now (a refill is on its way), -1 not
 * from this reserve, -2 the slot is another endpoint's now.
 */
static int
rb_draw_once(RbSlot *slot, const RbCacheEntry *cached, Oid relid,
			 bool use_config, double rate, double capacity, double want,
			 int64 upto, double *granted, double *remaining)
{
	RbAction	action = {0};
	double		n;
	bool		wait;
	TimestampTz now = GetCurrentTimestamp();

	rb_actions_make_room();
	SpinLockAcquire(&slot->mutex);
	if (slot->incarnation != cached->incarnation)
	{
		SpinLockRelease(&slot->mutex);
		return -2;
	}
	if (slot->key.relid != relid ||
		!rb_slot_serves(slot, use_config, rate, capacity))
	{
		SpinLockRelease(&slot->mutex);
		return -1;
	}
	rb_slot_expire(slot, now);
	n = rb_slot_grant(slot, want, upto);
	if (n > 0.0)
	{
		slot->tokens -= n;
		slot->drawn += n;
		action.generation = slot->generation;
		*remaining = slot->tokens;
		SpinLockRelease(&slot->mutex);
		action.slot = cached->slot;
		action.incarnation = cached->incarnation;
		action.subid = GetCurrentSubTransactionId();
		action.tokens = n;
		action.takes = 1;
		rb_action_add(&action);
		*granted = n;
		return 1;
	}
	wait = slot->pending > 0.0;
	SpinLockRelease(&slot->mutex);
	return wait && !rb_own_refill(cached->slot) ? 0 : -1;
}

/*
 * rb_reserve_draw
 *		A take from the endpoint's reserve, if it has one this backend knows
 *		of, filled for this request's limits, and holding enough: true with
 *		the tokens granted and those left in the reserve.  While a refill
 *		of the empty reserve is on its way (another transaction's), waits
 *		for it a few times briefly, unless "nowait".  False, having taken
 *		nothing, when the take must go through the row (always in a
 *		read-only transaction, which the row refuses).
 */
bool
rb_reserve_draw(text *endpoint, Oid relid, bool use_config, double rate,
				double capacity, double want, int64 upto, bool nowait,
				double *granted, double *remaining)
{
	char		name[RB_RESERVE_MAX_ENDPOINT + 1];
	int			len = VARSIZE_ANY_EXHDR(endpoint);
	RbCacheEntry *cached;
	RbSlot	   *slot;
	int			tries;
	int			r = -1;

	if (!rb_reserve_known() ||
		len > RB_RESERVE_MAX_ENDPOINT || XactReadOnly)
		return false;
	memcpy(name, VARDATA_ANY(endpoint), len);
	name[len] = '\0';			/* a string key: no need to clear the rest */
	cached = rb_cache_find(name, false);
	if (cached == NULL)
		return false;
	slot = &reserve_shared->slots[cached->slot];
	for (tries = 0; tries <= RB_REFILL_WAITS; tries++)
	{
		r = rb_draw_once(slot, cached, relid, use_config, rate, capacity,
						 want, upto, granted, remaining);
		if (r != 0 || tries == RB_REFILL_WAITS || nowait)
			break;
		(void) ConditionVariableTimedSleep(&slot->refilled, RB_REFILL_WAIT_MS,
										   PG_WAIT_EXTENSION);
	}
	if (tries > 0)
		ConditionVariableCancelSleep();
	if (r == -2)
		rb_cache_forget(name);
	return r == 1;
}

/*
 * rb_reserve_wait
 *		A take of the endpoint that its row refused, told to wait "wait"
 *		seconds: if the reserve, refilling under its lease, will hold what
 *		the take asks before then (and before the lease ends), the seconds
 *		until it does; else "wait".
 */
double
rb_reserve_wait(text *endpoint, Oid relid, bool use_config, double rate,
				double capacity, double want, int64 upto, double wait)
{
	char		name[RB_RESERVE_MAX_ENDPOINT + 1];
	int			len = VARSIZE_ANY_EXHDR(endpoint);
	RbCacheEntry *cached;
	RbSlot	   *slot;
	TimestampTz now;
	double		need = upto > 0 ? 1.0 : want;
	double		usecs = -1.0;

	if (!rb_reserve_known() ||
		len > RB_RESERVE_MAX_ENDPOINT)
		return wait;
	memcpy(name, VARDATA_ANY(endpoint), len);
	name[len] = '\0';
	cached = rb_cache_find(name, false);
	if (cached == NULL)
		return wait;
	slot = &reserve_shared->slots[cached->slot];
	now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->mutex);
	if (slot->incarnation == cached->incarnation && slot->key.relid == relid &&
		rb_slot_serves(slot, use_config, rate, capacity) &&
		slot->effective_rate > 0.0 && now < slot->line_at &&
		slot->accrued_at < slot->line_at)	/* a lease, not drained */
	{
		rb_slot_expire(slot, now);
		/* during the lease the line stands still: so does the slot's room */
		if (need <= rb_slot_capacity(slot) - slot->line_tokens - slot->pending)
		{
			/* a microsecond more than the arithmetic asks: accrual rounds */
			usecs = Max(1.0, ceil((need - slot->tokens) / slot->effective_rate *
								  USECS_PER_SEC) + 1.0);
			if ((double) now + usecs > (double) slot->line_at)
				usecs = -1.0;
		}
	}
	SpinLockRelease(&slot->mutex);
	if (usecs >= 0.0 && usecs / USECS_PER_SEC < wait)
		return usecs / USECS_PER_SEC;
	return wait;
}

/*
 * rb_reserve_cut
 *		Before a granted take of a row with a reserve is written at "now":
 *		move up to a batch of the whole tokens the take left into the
 *		reserve, and lease the row's refill to it (nothing, if the endpoint
 *		is not in its steady state: paused, cooling down, breaker not
 *		closed, or if "here" is false: the row is not this node's alone,
 *		on a table Citus distributed).  The row also counts the draws
 *		committed since the last refill.  Returns the tokens moved; the
 *		caller hands them over (rb_reserve_hand) once the row is written.
 */
double
rb_reserve_cut(RbBucket *bucket, TimestampTz now, bool here)
{
	RbBucketNow state;
	double		n;

	bucket->reserve.saved_takes = 0;
	bucket->reserve.saved_tokens = 0.0;
	bucket->reserve.leased = false;
	if (reserve_shared == NULL || !here || !rb_has_reserve(bucket) ||
		rb_is_quota(bucket))
		return 0.0;
	rb_bucket_now(bucket, now, &state);
	if (state.paused || state.breaker != RB_BREAKER_CLOSED ||
		state.cooldown_seconds > 0.0)
		return 0.0;
	n = Min((double) bucket->reserve_batch, floor(bucket->state.tokens));
	if (n < 1.0)
		n = 0.0;
	if (rb_reserve_lease_ms > 0)
	{
		TimestampTz until = now + (TimestampTz) rb_reserve_lease_ms * 1000;

		bucket->reserve.leased = true;
		if (until > bucket->state.refilled_at)
			bucket->state.refilled_at = until;
	}
	if (n == 0.0 && !bucket->reserve.leased)
		return 0.0;
	bucket->state.tokens -= n;
	if (bucket->reserve.found)
	{
		RbSlot	   *slot = &reserve_shared->slots[bucket->reserve.slot];

		SpinLockAcquire(&slot->mutex);
		if (slot->incarnation == bucket->reserve.incarnation)
		{
			bucket->reserve.saved_takes = slot->unsaved_takes;
			bucket->reserve.saved_tokens = slot->unsaved_tokens;
		}
		SpinLockRelease(&slot->mutex);
		bucket->takes_granted += bucket->reserve.saved_takes;
		bucket->tokens_granted += bucket->reserve.saved_tokens;
	}
	return n;
}

/*
 * A free slot, or else the least recently refilled one, whose key leaves
 * the index (what it held is lost); exclusive lock held.
 */
static int
rb_slot_take_back(void)
{
	int			best = -1;
	int			i;

	for (i = 0; i < rb_reserves_max; i++)
	{
		RbSlot	   *slot = &reserve_shared->slots[i];

		if (slot->incarnation == 0)
			return i;
		if (best < 0 ||
			slot->last_refill_at < reserve_shared->slots[best].last_refill_at)
			best = i;
	}
	hash_search(reserve_index, &reserve_shared->slots[best].key, HASH_REMOVE,
				NULL);
	return best;
}

/* The key's slot, given one if it has none; exclusive lock taken here. */
static int
rb_slot_for(const RbReserveKey *key, TimestampTz now)
{
	RbReserveEntry *entry;
	RbSlot	   *slot;
	bool		found;
	int			i;

	LWLockAcquire(reserve_shared->lock, LW_EXCLUSIVE);
	entry = hash_search(reserve_index, key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		i = entry->slot;
		LWLockRelease(reserve_shared->lock);
		return i;
	}
	i = rb_slot_take_back();
	entry = hash_search(reserve_index, key, HASH_ENTER, &found);
	entry->slot = i;
	slot = &reserve_shared->slots[i];
	SpinLockAcquire(&slot->mutex);
	rb_slot_drain(slot);
	slot->incarnation = reserve_shared->next_incarnation++;
	slot->key = *key;
	slot->unsaved_takes = 0;
	slot->unsaved_tokens = 0.0;
	slot->draws = slot->refills = slot->drains = 0;
	slot->tokens_drawn = 0.0;
	slot->created_at = now;
	slot->last_refill_at = now;
	slot->capacity_now = 0.0;	/* until the refill that got it describes it */
	SpinLockRelease(&slot->mutex);
	LWLockRelease(reserve_shared->lock);
	return i;
}

/*
 * Fill a slot's description of what its tokens answer, and of the row that
 * refilled it at "now": the rate it refills at and the capacity in force;
 * mutex held.
 */
static void
rb_slot_describe(RbSlot *slot, const RbBucket *bucket, bool use_config,
				 double req_rate, double req_capacity, double effective_rate,
				 double capacity_now)
{
	slot->from_config = use_config;
	slot->req_rate = req_rate;
	slot->req_capacity = req_capacity;
	slot->rate = bucket->rate;
	slot->capacity = bucket->capacity;
	slot->effective_rate = effective_rate;
	slot->capacity_now = capacity_now;
	slot->batch = (double) bucket->reserve_batch;
}

/*
 * The commit of a transaction that takes from a row with a reserve returns
 * only once it is as durable as synchronous_commit = on makes it: flushed
 * here, and with synchronous replication on the standbys.  The tokens a
 * refill moves become drawable only after that, so no crash or failover
 * can hand out again a token that a take was told it had.
 */
static void
rb_reserve_make_durable(void)
{
	if (synchronous_commit < SYNCHRONOUS_COMMIT_REMOTE_FLUSH)
		(void) set_config_option("synchronous_commit", "on", PGC_USERSET,
								 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0,
								 false);
	ForceSyncCommit();
	durable_commit = true;
}

/*
 * rb_reserve_hand
 *		The row of a granted take was written with "tokens" moved out of it
 *		(by rb_reserve_cut, maybe none): add them to the endpoint's reserve
 *		as pending, to be drawable when this transaction commits, durably
 *		(rb_reserve_make_durable).  A reserve filled for another request is
 *		drained first.
 */
void
rb_reserve_hand(RbBucket *bucket, Oid relid, double tokens, bool use_config,
				double req_rate, double req_capacity, TimestampTz now)
{
	RbReserveKey key;
	RbAction	action = {0};
	RbSlot	   *slot;
	double		rate;
	double		cap;
	int			i;

	if (reserve_shared == NULL || !rb_has_reserve(bucket))
		return;
	rb_reserve_make_durable();
	if ((tokens <= 0.0 && !bucket->reserve.leased) ||
		!rb_reserve_key(bucket->key, relid, &key))
		return;

	/*
	 * The lease refills the slot at the rate the row would have refilled at
	 * for this take: its own limits (written in the row), not the
	 * configured ceiling, which a take with lower limits of its own never
	 * refills at.  Nor past the capacity in force, which feedback or a
	 * burst the destination published may have lowered.
	 */
	rate = rb_bucket_rate_now(bucket, now);
	cap = rb_bucket_capacity_now(bucket, now);
	rb_actions_make_room();
	i = rb_slot_for(&key, now);
	slot = &reserve_shared->slots[i];
	SpinLockAcquire(&slot->mutex);
	if (!rb_slot_serves(slot, use_config, req_rate, req_capacity) ||
		slot->rate != bucket->rate || slot->capacity != bucket->capacity)
		rb_slot_drain(slot);
	/* what the lease refilled so far, at the rate it refilled at */
	rb_slot_expire(slot, now);
	rb_slot_describe(slot, bucket, use_config, req_rate, req_capacity, rate,
					 cap);
	slot->pending += tokens;
	/* known before this transaction's commit lets another writer in */
	slot->pending_refills++;
	slot->pending_line_at = Max(slot->pending_line_at,
								bucket->state.refilled_at);
	action.incarnation = slot->incarnation;
	action.generation = slot->generation;
	SpinLockRelease(&slot->mutex);

	action.slot = i;
	action.subid = GetCurrentSubTransactionId();
	action.refill = true;
	action.tokens = tokens;
	action.saved_takes = bucket->reserve.saved_takes;
	action.saved_tokens = bucket->reserve.saved_tokens;
	action.row_tokens = bucket->state.tokens;
	action.row_at = bucket->state.refilled_at;
	action.written_at = now;
	rb_action_add(&action);
	rb_cache_remember(&key, i, action.incarnation);
}

/*
 * Is this transaction's commit record durable as a refill needs: flushed,
 * and acknowledged by the synchronous standbys if there are any?  A wait
 * for them that was cancelled still commits (with a warning); its refill's
 * tokens must then not become drawable.
 */
static bool
rb_commit_is_durable(void)
{
	XLogRecPtr	commit = XactLastCommitEnd;
	bool		durable;

	if (commit == InvalidXLogRecPtr)
		return true;			/* nothing written, nothing to lose */
#if PG_VERSION_NUM >= 150000
	if (GetFlushRecPtr(NULL) < commit)
		return false;
#else
	if (GetFlushRecPtr() < commit)
		return false;
#endif
	if (WalSndCtl == NULL || max_wal_senders == 0 ||
		SyncRepStandbyNames == NULL || SyncRepStandbyNames[0] == '\0')
		return true;
	LWLockAcquire(SyncRepLock, LW_SHARED);
	durable = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH] >= commit;
	LWLockRelease(SyncRepLock);
	return durable;
}

/*
 * Settle one action at its transaction's end: committed ("durable": its
 * refills may become drawable), prepared, or rolled back.  True if waiters
 * may go on.
 */
static bool
rb_action_settle(const RbAction *a, bool commit, bool prepared, bool durable,
				 TimestampTz now)
{
	RbSlot	   *slot = &reserve_shared->slots[a->slot];
	bool		wake = false;

	SpinLockAcquire(&slot->mutex);
	if (slot->incarnation == a->incarnation && a->refill && commit && !prepared)
	{
		/* the row counted these draws, whatever became of the reserve */
		slot->unsaved_takes -= a->saved_takes;
		slot->unsaved_tokens -= a->saved_tokens;
	}
	if (slot->incarnation == a->incarnation && slot->generation == a->generation)
	{
		if (a->refill)
		{
			slot->pending -= a->tokens;
			if (--slot->pending_refills <= 0)
			{
				slot->pending_refills = 0;
				slot->pending_line_at = 0;
			}
			if (commit && !prepared && durable)
			{
				/* the slot as it stands under the line it had so far */
				rb_slot_expire(slot, now);
				slot->tokens += a->tokens;
				slot->refills++;
				slot->last_refill_at = now;
				if (a->row_at >= slot->line_at)
				{
					slot->line_tokens = a->row_tokens;
					slot->line_at = a->row_at;
				}
				/* a lease refills the slot from the write on */
				slot->accrued_at = Max(slot->accrued_at, a->written_at);
			}
			wake = true;
		}
		else
		{
			slot->drawn -= a->tokens;
			if (commit)
			{
				slot->draws += a->takes;
				slot->tokens_drawn += a->tokens;
				slot->unsaved_takes += a->takes;
				slot->unsaved_tokens += a->tokens;
			}
			else
				slot->tokens += a->tokens;
		}
	}
	SpinLockRelease(&slot->mutex);
	return wake;
}

/* Settle the actions of subtransaction "subid" (all, with InvalidSubTransactionId). */
static void
rb_actions_settle(SubTransactionId subid, bool commit, bool prepared)
{
	int			i;
	int			kept = 0;
	bool		refills = false;
	bool		durable = false;
	TimestampTz now = 0;

	/*
	 * Only a refill asks whether the commit is durable, and when it is now:
	 * a transaction that only drew (every take of a hot endpoint but about
	 * one per lease) asks neither, and so takes no lock on the WAL's flush
	 * position at its commit.
	 */
	for (i = 0; i < nactions; i++)
		if (actions[i].refill &&
			(subid == InvalidSubTransactionId || actions[i].subid == subid))
			refills = true;
	if (refills)
	{
		durable = commit && !prepared && rb_commit_is_durable();
		now = GetCurrentTimestamp();
	}

	for (i = 0; i < nactions; i++)
	{
		if (subid != InvalidSubTransactionId && actions[i].subid != subid)
		{
			actions[kept++] = actions[i];
			continue;
		}
		if (rb_action_settle(&actions[i], commit, prepared, durable, now))
			ConditionVariableBroadcast(&reserve_shared->slots[actions[i].slot].refilled);
	}
	nactions = kept;
}

static void
rb_reserve_xact(XactEvent event, void *arg pg_attribute_unused())
{
	/*
	 * Once more just before the commit: a function with a SET clause that
	 * called the take has undone the first setting on its way out.
	 */
	if (event == XACT_EVENT_PRE_COMMIT && durable_commit)
		rb_reserve_make_durable();
	else if (event != XACT_EVENT_PRE_COMMIT &&
			 event != XACT_EVENT_PARALLEL_PRE_COMMIT &&
			 event != XACT_EVENT_PRE_PREPARE)
		durable_commit = false;
	if (nactions == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			rb_actions_settle(InvalidSubTransactionId, true, false);
			break;
		case XACT_EVENT_PREPARE:
			rb_actions_settle(InvalidSubTransactionId, true, true);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			rb_actions_settle(InvalidSubTransactionId, false, false);
			break;
		default:
			break;
	}
}

static void
rb_reserve_subxact(SubXactEvent event, SubTransactionId mySubid,
				   SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	int			i;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		rb_actions_settle(mySubid, false, false);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = 0; i < nactions; i++)
			if (actions[i].subid == mySubid)
				actions[i].subid = parentSubid;
	}
}

/*
 * rb_reserve_forget
 *		The endpoint's reserve is no more (turned off, or its row deleted):
 *		its slot is freed and what it held is lost.
 */
void
rb_reserve_forget(text *endpoint, Oid relid)
{
	RbReserveKey key;
	RbReserveEntry *entry;

	if (reserve_shared == NULL || !rb_reserve_key(endpoint, relid, &key))
		return;
	LWLockAcquire(reserve_shared->lock, LW_EXCLUSIVE);
	entry = hash_search(reserve_index, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		RbSlot	   *slot = &reserve_shared->slots[entry->slot];

		SpinLockAcquire(&slot->mutex);
		rb_slot_drain(slot);
		slot->incarnation = 0;
		SpinLockRelease(&slot->mutex);
		ConditionVariableBroadcast(&slot->refilled);
		hash_search(reserve_index, &key, HASH_REMOVE, NULL);
	}
	LWLockRelease(reserve_shared->lock);
	rb_cache_forget(key.endpoint);
}

/* One slot as bucket_reserves shows it; mutex held. */
static void
rb_slot_info(const RbSlot *slot, RbReserveInfo *info)
{
	memcpy(info->endpoint, slot->key.endpoint, sizeof(info->endpoint));
	info->tokens = slot->tokens;
	info->pending = slot->pending;
	info->drawn = slot->drawn;
	info->batch = slot->batch;
	info->rate = slot->rate;
	info->capacity = slot->capacity;
	info->draws = slot->draws;
	info->tokens_drawn = slot->tokens_drawn;
	info->refills = slot->refills;
	info->drains = slot->drains;
	info->created_at = slot->created_at;
	info->last_refill_at = slot->last_refill_at;
}

/*
 * rb_reserve_list
 *		The reserves of this database's table "relid", palloc'd into
 *		*infos; returns how many.
 */
int
rb_reserve_list(Oid relid, RbReserveInfo **infos)
{
	int			n = 0;
	int			i;
	TimestampTz now;

	*infos = NULL;
	if (reserve_shared == NULL)
		return 0;
	*infos = palloc(sizeof(RbReserveInfo) * rb_reserves_max);
	now = GetCurrentTimestamp();
	LWLockAcquire(reserve_shared->lock, LW_SHARED);
	for (i = 0; i < rb_reserves_max; i++)
	{
		RbSlot	   *slot = &reserve_shared->slots[i];

		SpinLockAcquire(&slot->mutex);
		if (slot->incarnation != 0 && slot->key.dbid == MyDatabaseId &&
			slot->key.relid == relid)
		{
			rb_slot_expire(slot, now);
			rb_slot_info(slot, &(*infos)[n++]);
		}
		SpinLockRelease(&slot->mutex);
	}
	LWLockRelease(reserve_shared->lock);
	return n;
}
