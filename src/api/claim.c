/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  SQL-callable bucket_claimable and bucket_grantable: the lock-free
 *	  filters of a worker's claim query (the peek is engine/peek.c's).
 *
 * A claim picks, in queue order, the endpoints of the best due events, then
 * locks up to so many events of each (FOR UPDATE SKIP LOCKED) and takes
 * their tokens with one bucket_take_upto per endpoint.  bucket_claimable is
 * its first step: called on every candidate event, in queue order, it says
 * how many events of that endpoint the claim may lock.  The first call for
 * an endpoint within one execution of the statement peeks the bucket's last
 * committed state once (no lock, nothing written) and answers the whole
 * tokens it holds now, at most "per_endpoint" (one while a half-open breaker
 * waits for its probe; 0 in a cooldown, a pause or an open breaker).
 * Every later call for that endpoint in the same execution answers NULL, so
 * each endpoint appears once, at its best event, and one busy endpoint
 * cannot fill a batch: the others get their turn.  (0 and NULL differ so
 * that a claim can tell an endpoint without tokens, whose events it may
 * reschedule, from one it has already seen.)
 *
 * The memory of what was answered lives in fn_extra, which the executor
 * allocates afresh for every execution of a statement: a prepared claim
 * starts clean each time.  (Not so in a PL/pgSQL expression such as
 * "x := bucket_claimable(...)": PL/pgSQL keeps a simple expression, and so
 * this memory, for the whole transaction.  Call it from a query.)  The
 * answer is a peek: the take under the row lock decides, and may grant
 * fewer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "api/args.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_claimable);
PG_FUNCTION_INFO_V1(ratebucket_grantable);

/* An endpoint seen by this execution of the statement. */
typedef struct RbSeen
{
	char	   *endpoint;		/* hash key: a pointer to the string */
} RbSeen;

static uint32
rb_seen_hash(const void *key, Size keysize pg_attribute_unused())
{
	const char *s = *(char *const *) key;

	return hash_bytes((const unsigned char *) s, (int) strlen(s));
}

static int
rb_seen_match(const void *key1, const void *key2, Size keysize pg_attribute_unused())
{
	return strcmp(*(char *const *) key1, *(char *const *) key2);
}

/* The endpoints this execution has answered for, created on first use. */
static HTAB *
rb_seen_table(FunctionCallInfo fcinfo)
{
	HTAB	   *seen = (HTAB *) fcinfo->flinfo->fn_extra;

	if (seen == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(char *);
		ctl.entrysize = sizeof(RbSeen);
		ctl.hash = rb_seen_hash;
		ctl.match = rb_seen_match;
		ctl.hcxt = fcinfo->flinfo->fn_mcxt;
		seen = hash_create("ratebucket claimable endpoints", 64, &ctl,
						   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
						   HASH_CONTEXT);
		fcinfo->flinfo->fn_extra = seen;
	}
	return seen;
}

/*
 * bucket_claimable(endpoint text, per_endpoint int) returns int
 * bucket_claimable(endpoint text, per_endpoint int, configured_only boolean)
 *		How many of this endpoint's events may this claim lock?  See the
 *		file header: the first call per endpoint and per execution peeks,
 *		later ones answer NULL.  With configured_only, an endpoint that has
 *		no configuration answers NULL too (a take of it by its configuration
 *		would be an error): the claim passes over its events as over those
 *		of an endpoint already seen, in the same peek.
 */
Datum
ratebucket_claimable(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	int32		per_endpoint = rb_arg_count(fcinfo, 1, "per_endpoint");
	bool		configured_only = false;
	HTAB	   *seen = rb_seen_table(fcinfo);
	char	   *key = text_to_cstring(endpoint);
	bool		found;

	if (PG_NARGS() > 2)
	{
		if (PG_ARGISNULL(2))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("configured_only must not be null")));
		configured_only = PG_GETARG_BOOL(2);
	}

	(void) hash_search(seen, &key, HASH_FIND, &found);
	if (found)
	{
		pfree(key);
		PG_RETURN_NULL();
	}

	/* remember it, in a copy that lives as long as the table */
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		char	   *stored = pstrdup(key);

		MemoryContextSwitchTo(oldcxt);
		(void) hash_search(seen, &stored, HASH_ENTER, &found);
	}
	pfree(key);

	if (configured_only)
	{
		int64		granted;

		/* an endpoint without a configuration: as if already seen */
		if (!rb_engine_peek_configured(endpoint, per_endpoint, &granted))
			PG_RETURN_NULL();
		PG_RETURN_INT32((int32) granted);
	}
	{
		double		granted;

		(void) rb_engine_peek(endpoint, 1.0, per_endpoint, &granted);
		PG_RETURN_INT32((int32) granted);
	}
}

/*
 * bucket_grantable(endpoint text, max_tokens int) returns int
 *		How many whole tokens, up to max_tokens, would a take of this
 *		configured bucket be granted now?  The peek of bucket_claimable
 *		without its memory: every call answers, so a claim can ask it of a
 *		bucket that several endpoints share (their account, say).  NULL if
 *		the endpoint is not configured.
 */
Datum
ratebucket_grantable(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	int32		max_tokens = rb_arg_count(fcinfo, 1, "max_tokens");
	int64		granted;

	if (!rb_engine_peek_configured(endpoint, max_tokens, &granted))
		PG_RETURN_NULL();
	PG_RETURN_INT32((int32) granted);
}
