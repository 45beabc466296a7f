/*-------------------------------------------------------------------------
 *
 * events.c
 *	  The events a bucket row's changes send: a NOTIFY on ratebucket_events
 *	  when an endpoint's breaker opens or closes, when it reaches or leaves
 *	  its floor, when its quota is spent or given back, when it is paused or
 *	  resumed (doc/events.md).
 *
 * Storage records what the events watch of every row it reads
 * (rb_events_read), and compares every row it writes with that
 * (rb_events_written): each change found is one NOTIFY, queued in the
 * writing transaction.  PostgreSQL delivers it when that transaction
 * commits, and drops it if the transaction, or the subtransaction that
 * wrote the row, rolls back; so a listener hears of exactly the changes
 * that were committed, in commit order.
 *
 * The watched state is what the row stores.  Changes that time alone makes
 * (a pause that ends, a rate that climbs off its floor, a quota window that
 * ends) are written, and so sent, by the first take or observe that writes
 * the row after them: the engine settles those columns then
 * (rb_adapt_settle).
 *
 * Nothing is sent for a stripe's row (its endpoint's row carries what the
 * events watch), when ratebucket.events is off, or where the table is
 * distributed by Citus (the storage layer does not call in then): there a
 * call runs on the coordinator or on the endpoint's worker, so an event
 * would reach only that node's listeners, and a node's transaction that
 * Citus prepares for a two-phase commit cannot have sent a NOTIFY.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/async.h"
#include "common/shortest_dec.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/json.h"
#if PG_VERSION_NUM >= 160000
#include "varatt.h"				/* in postgres.h before 18 */
#endif

#include "bucket/events.h"
#include "bucket/settings.h"

/* What the events watch of a row. */
static void
rb_event_state(const RbBucket *bucket, RbEventState *st)
{
	st->valid = true;
	st->quota_spent = rb_is_quota(bucket) && !(bucket->state.tokens >= 1.0);
	st->refilled_at = bucket->state.refilled_at;
	st->open_until = bucket->adapt.open_until;
	st->at_floor_since = bucket->adapt.at_floor_since;
	st->paused_until = bucket->adapt.paused_until;
}

/*
 * rb_events_read
 *		Record what the events watch of a row just read from the table.
 */
void
rb_events_read(RbBucket *bucket)
{
	rb_event_state(bucket, &bucket->as_read);
}

/* A time as JSON: an ISO 8601 string in UTC, or null for none or infinity. */
static void
rb_json_time(StringInfo buf, const char *name, TimestampTz t)
{
	struct pg_tm tm;
	fsec_t		fsec;

	appendStringInfo(buf, ",\"%s\":", name);
	if (t == RB_NO_TIME || TIMESTAMP_NOT_FINITE(t) ||
		timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
	{
		/* none, never, or a year ISO 8601's four digits cannot write */
		appendStringInfoString(buf, "null");
		return;
	}
	appendStringInfo(buf, "\"%04d-%02d-%02dT%02d:%02d:%02d.%06dZ\"",
					 tm.tm_year, tm.tm_mon, tm.tm_mday,
					 tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

/* A number as JSON (null if it were NaN or infinite). */
static void
rb_json_number(StringInfo buf, const char *name, double v)
{
	char		digits[DOUBLE_SHORTEST_DECIMAL_LEN];

	appendStringInfo(buf, ",\"%s\":", name);
	if (isnan(v) || isinf(v))
		appendStringInfoString(buf, "null");
	else
	{
		/* the shortest form that reads back exactly, as float8out writes */
		double_to_shortest_decimal_buf(v, digits);
		appendStringInfoString(buf, digits);
	}
}

/* Start a payload: the event, the endpoint, when. */
static void
rb_event_begin(StringInfo buf, const char *event, text *key, TimestampTz at)
{
	resetStringInfo(buf);
	appendStringInfo(buf, "{\"event\":\"%s\",\"endpoint\":", event);
	escape_json(buf, text_to_cstring(key));
	rb_json_time(buf, "at", at);
}

/* Finish a payload and queue its NOTIFY. */
static void
rb_event_send(StringInfo buf)
{
	appendStringInfoChar(buf, '}');
	Async_Notify(RB_EVENTS_CHANNEL, buf->data);
}

/*
 * A quota's events: spent (with when it resets), or given back, with "left"
 * tokens left.
 */
static void
rb_quota_event(StringInfo buf, text *key, const RbBucket *bucket,
			   TimestampTz at, bool spent, double left)
{
	rb_event_begin(buf, spent ? "quota_spent" : "quota_reset", key, at);
	if (rb_is_quota(bucket))
	{
		appendStringInfo(buf, ",\"period\":\"%s\"", bucket->quota_period);
		rb_json_number(buf, "quota", bucket->conf_capacity);
		rb_json_number(buf, "left", left);
		if (spent)
		{
			TimestampTz start;
			TimestampTz end;

			rb_bucket_quota_window(bucket, bucket->state.refilled_at,
								   &start, &end);
			rb_json_time(buf, "resets_at", end);
		}
	}
	else
		appendStringInfoString(buf, ",\"period\":null,\"quota\":null,\"left\":null");
	rb_event_send(buf);
}

/* Was a quota row spent in one window and written, spent, in a later one? */
static bool
rb_quota_new_window(const RbBucket *bucket, const RbEventState *before,
					const RbEventState *after)
{
	TimestampTz start_before;
	TimestampTz start_after;
	TimestampTz end;

	if (!before->quota_spent || before->refilled_at == after->refilled_at ||
		before->refilled_at == RB_NO_TIME)
		return false;
	rb_bucket_quota_window(bucket, before->refilled_at, &start_before, &end);
	rb_bucket_quota_window(bucket, after->refilled_at, &start_after, &end);
	return start_after > start_before;
}

/*
 * The breaker's events: a new open period (a trip, or a probe that failed),
 * or closed.
 */
static void
rb_breaker_event(StringInfo buf, text *key, const RbBucket *bucket,
				 TimestampTz at, int64 open_until)
{
	rb_event_begin(buf, open_until == RB_NO_TIME ?
				   "breaker_closed" : "breaker_opened", key, at);
	if (open_until != RB_NO_TIME)
	{
		rb_json_time(buf, "until", open_until);
		appendStringInfo(buf, ",\"trips\":%d", bucket->adapt.breaker_trips);
	}
	rb_event_send(buf);
}

/*
 * The floor's events: left, reached, or both when it was reached anew (it
 * had left its floor, which the write that would have said so settled just
 * now, rb_bucket_settle).
 */
static void
rb_floor_event(StringInfo buf, text *key, const RbBucket *bucket,
			   TimestampTz at, int64 since_before, int64 since)
{
	RbPolicy	policy;
	double		ceiling;

	if (since_before != RB_NO_TIME && since != RB_NO_TIME)
	{
		rb_event_begin(buf, "floor_left", key, at);
		rb_event_send(buf);
	}
	rb_event_begin(buf, since == RB_NO_TIME ? "floor_left" : "floor_reached",
				   key, at);
	if (since != RB_NO_TIME)
	{
		ceiling = rb_bucket_ceiling(bucket);
		rb_bucket_policy(bucket, ceiling, &policy);
		rb_json_time(buf, "since", since);
		/* the configured floor as given, not through its factor */
		rb_json_number(buf, "floor_rate", isnan(bucket->conf_floor_rate) ?
					   ceiling * policy.floor_factor :
					   Min(bucket->conf_floor_rate, ceiling));
	}
	rb_event_send(buf);
}

/* The pause's events: paused (again, when it changes), or resumed. */
static void
rb_pause_event(StringInfo buf, text *key, TimestampTz at, int64 paused_until)
{
	rb_event_begin(buf, paused_until == RB_NO_TIME ? "resumed" : "paused",
				   key, at);
	if (paused_until != RB_NO_TIME)
		rb_json_time(buf, "until", paused_until);
	rb_event_send(buf);
}

/*
 * rb_events_written
 *		The row of "key" was just written as *bucket: send an event for
 *		each change of what the events watch since it was read (or since
 *		nothing, for a new row).  Called by storage for every row written,
 *		except on a distributed table.
 */
void
rb_events_written(text *key, const RbBucket *bucket)
{
	RbEventState before = {false, false, RB_NO_TIME, RB_NO_TIME, RB_NO_TIME,
	RB_NO_TIME};
	RbEventState after;
	StringInfoData buf;
	TimestampTz at;

	if (!rb_events)
		return;
	/* a stripe's key is longer than any endpoint's (bucket/stripe.c) */
	if (VARSIZE_ANY_EXHDR(key) > RB_MAX_ENDPOINT_BYTES)
		return;
	if (bucket->as_read.valid)
		before = bucket->as_read;
	rb_event_state(bucket, &after);
	if (before.open_until == after.open_until &&
		before.at_floor_since == after.at_floor_since &&
		before.paused_until == after.paused_until &&
		before.quota_spent == after.quota_spent &&
		!(after.quota_spent && before.refilled_at != after.refilled_at))
		return;					/* the usual write */

	at = GetCurrentTimestamp();
	initStringInfo(&buf);
	if (before.open_until != after.open_until)
		rb_breaker_event(&buf, key, bucket, at, after.open_until);
	if (before.at_floor_since != after.at_floor_since)
		rb_floor_event(&buf, key, bucket, at, before.at_floor_since,
					   after.at_floor_since);
	if (before.paused_until != after.paused_until)
		rb_pause_event(&buf, key, at, after.paused_until);
	if (before.quota_spent != after.quota_spent)
		rb_quota_event(&buf, key, bucket, at, after.quota_spent,
					   bucket->state.tokens);
	else if (after.quota_spent && rb_quota_new_window(bucket, &before, &after))
	{
		/* spent again, whole, by the first take of a new window */
		rb_quota_event(&buf, key, bucket, at, false, bucket->conf_capacity);
		rb_quota_event(&buf, key, bucket, at, true, bucket->state.tokens);
	}
	pfree(buf.data);
}
