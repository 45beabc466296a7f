/*
 * bench/claim_bench.c: events claimed per second by N worker threads, each
 * with its own PostgreSQL connection (and, for the Redis mode, its own Redis
 * connection), for a fixed time.  One driver for the three ways to claim, so
 * that every mode pays the same client overhead:
 *
 *   plain       one statement per claim, no limiter at all (the floor):
 *                 UPDATE webhook_events ... WHERE id IN (SELECT ... LIMIT $batch
 *                 FOR UPDATE SKIP LOCKED) RETURNING id, endpoint
 *   ratebucket  one statement per claim, ratebucket_queue's claim:
 *                 SELECT id, endpoint FROM claim_events($endpoints * $per_endpoint, $per_endpoint)
 *   redis       a plain claim followed by a per-event check against the Redis
 *               Lua token bucket (bench/token_bucket.lua), in one transaction:
 *                 BEGIN; SELECT ... LIMIT $batch FOR UPDATE SKIP LOCKED;
 *                 EVALSHA <sha> 1 bucket:<endpoint> <rate> <capacity> 1  (per event)
 *                 UPDATE ... status = 'sending' WHERE id = ANY(<granted>);
 *                 UPDATE ... next_attempt_at = now() + <wait> (the refused);
 *                 COMMIT
 *               -l sends the EVALSHAs of one batch as one pipeline instead.
 *
 * -I ROWS makes each mode the whole pipeline a sender runs per event:
 * enqueue, claim, record.  Each round, a worker first inserts as many events
 * as one claim asks for (-b, or -e x -p), in INSERTs of ROWS rows (1: one
 * per event; 100: one every other round at a batch of 50), to endpoints with
 * tokens (bench_endpoints.ready) in turn; then claims as its mode does; then
 * records every claimed event as delivered, in its own transaction:
 *   plain, redis  UPDATE webhook_events SET status = 'delivered', ...
 *                   WHERE id = ANY(<claimed>)
 *   ratebucket    record_deliveries(<claimed>, <200 each>, <their leases>):
 *                 the batch in one call, which locks its events in id order
 *                 and reports each answer to its bucket
 * and counts the events delivered.
 *
 * Every statement is prepared (PQprepare) once per connection.  The rate and
 * capacity of each endpoint, for the Redis mode, come from the table
 * bench_endpoints (endpoint, rate, capacity), read once at start: what a
 * sender keeps in its configuration.
 *
 * The threads connect, prepare, and warm up with one claim rolled back,
 * then wait on a barrier; the clock starts when all are ready, and after -s seconds a flag tells them to stop after
 * their current claim.  The elapsed time runs until the last thread is done,
 * so every counted event lies inside it.  Output: one line of key=value
 * pairs on stdout (bench/run-claim parses it), errors on stderr.
 *
 * The PostgreSQL connection comes from the environment (PGHOST, PGPORT,
 * PGDATABASE, PGUSER) or -d <conninfo>.
 *
 * Build: cc -O2 -Wall -Wextra -I$(pg_config --includedir) -o claim_bench \
 *            claim_bench.c -lpq -lhiredis -lpthread
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

enum mode { MODE_PLAIN, MODE_RATEBUCKET, MODE_REDIS };
static const char *const mode_names[] = {"plain", "ratebucket", "redis"};

/* Settings (command line). */
static enum mode mode;
static int nworkers = 8;
static double run_seconds = 5.0;
static int batch = 50;
static int max_endpoints = 10;
static int per_endpoint = 5;
static const char *conninfo = "";
static const char *redis_host = "127.0.0.1";
static int redis_port = 6379;
static const char *sha = NULL;
static int pipelined = 0;
static int insert_rows = 0;		/* -I: the pipeline, ROWS rows per INSERT */
static char *insert_endpoints;	/* the endpoints it inserts for, {a,b,...} */

/* Endpoint limits for the Redis mode, sorted by endpoint for bsearch. */
typedef struct endpoint_limits
{
	char	   *endpoint;
	char	   *rate;			/* as text, passed to Lua unchanged */
	char	   *capacity;
} endpoint_limits;
static endpoint_limits *limits;
static size_t nlimits;

static atomic_int stop_flag;

typedef struct worker
{
	pthread_t	thread;
	int			id;
	pthread_barrier_t *barrier;
	PGconn	   *pg;
	redisContext *redis;
	/* counters */
	long		claims;			/* claim transactions committed */
	long		empty_claims;	/* of which claimed nothing */
	long		events;			/* events claimed (status 'sending') */
	long		locked;			/* events locked (redis mode: checked in Redis) */
	long		refused;		/* redis mode: events Redis refused, deferred */
	long		retries;		/* claims rolled back on deadlock/serialization */
	long		inserted;		/* pipeline: events enqueued */
	long		delivered;		/* pipeline: events recorded as delivered */
	long		owed;			/* pipeline: events to insert, not inserted yet */
	long		next_endpoint;	/* pipeline: where its inserts go next */
	int			failed;
	char		error[512];
} worker;

static const char plain_sql[] =
	"UPDATE webhook_events e "
	"SET status = 'sending', lease_until = now() + interval '30 s' "
	"WHERE e.id IN (SELECT id FROM webhook_events "
	"               WHERE status = 'pending' AND next_attempt_at <= now() "
	"               ORDER BY priority DESC, next_attempt_at "
	"               LIMIT $1 FOR UPDATE SKIP LOCKED) "
	"RETURNING e.id, e.endpoint";

/*
 * The ratebucket claim: claim_events(batch, per_endpoint), or with -F
 * another function of the same arguments (bench/by_endpoint.sql's
 * claim_by_endpoint).
 */
static const char *claim_function = "claim_events";
static char ratebucket_sql[160];

static const char redis_lock_sql[] =
	"SELECT id, endpoint FROM webhook_events "
	"WHERE status = 'pending' AND next_attempt_at <= now() "
	"ORDER BY priority DESC, next_attempt_at "
	"LIMIT $1 FOR UPDATE SKIP LOCKED";

static const char redis_grant_sql[] =
	"UPDATE webhook_events "
	"SET status = 'sending', lease_until = now() + interval '30 s' "
	"WHERE id = ANY ($1::bigint[])";

/* The pipeline's statements. */
static const char insert_sql[] =
	"INSERT INTO webhook_events (endpoint) "
	"SELECT ($1::text[])[1 + g % cardinality($1::text[])] "
	"FROM generate_series($2::bigint, $2::bigint + $3::int - 1) AS g";

static const char deliver_sql[] =
	"UPDATE webhook_events "
	"SET status = 'delivered', attempts = attempts + 1, last_status = 200, "
	"    delivered_at = clock_timestamp(), lease_until = NULL "
	"WHERE id = ANY ($1::bigint[])";

static const char record_sql[] =
	"SELECT count(*) FILTER (WHERE r.outcome = 'success') "
	"FROM record_deliveries($1::bigint[], "
	"                       array_fill(200, ARRAY[cardinality($1::bigint[])]), "
	"                       $2::timestamptz[]) r";

static const char redis_defer_sql[] =
	"UPDATE webhook_events e "
	"SET next_attempt_at = now() + make_interval(secs => r.wait) "
	"FROM unnest($1::bigint[], $2::float8[]) AS r(id, wait) "
	"WHERE e.id = r.id";

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void
fail(worker *w, const char *fmt,...)
{
	va_list		ap;

	if (w->failed)
		return;
	va_start(ap, fmt);
	vsnprintf(w->error, sizeof(w->error), fmt, ap);
	va_end(ap);
	w->failed = 1;
	atomic_store(&stop_flag, 1);
}

/* A growable text buffer for array literals. */
typedef struct strbuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
} strbuf;

static void
sb_reset(strbuf *sb)
{
	sb->len = 0;
	if (sb->data)
		sb->data[0] = '\0';
}

static void
sb_printf(strbuf *sb, const char *fmt,...)
{
	for (;;)
	{
		va_list		ap;
		int			n;
		size_t		room = sb->cap - sb->len;

		if (sb->cap > 0)
		{
			va_start(ap, fmt);
			n = vsnprintf(sb->data + sb->len, room, fmt, ap);
			va_end(ap);
			if (n < 0)
			{
				fprintf(stderr, "claim_bench: vsnprintf failed\n");
				exit(2);
			}
			if ((size_t) n < room)
			{
				sb->len += (size_t) n;
				return;
			}
		}
		sb->cap = sb->cap ? sb->cap * 2 : 1024;
		sb->data = realloc(sb->data, sb->cap);
		if (sb->data == NULL)
		{
			fprintf(stderr, "claim_bench: out of memory\n");
			exit(2);
		}
	}
}

/* Deadlock or serialization failure: roll back and claim again. */
static int
is_retryable(const PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return state && (strcmp(state, "40P01") == 0 || strcmp(state, "40001") == 0);
}

static int
prepare(worker *w, const char *name, const char *sql, int nparams)
{
	PGresult   *res = PQprepare(w->pg, name, sql, nparams, NULL);
	int			ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		fail(w, "worker %d: prepare %s: %s", w->id, name, PQerrorMessage(w->pg));
	PQclear(res);
	return ok;
}

/* Run a prepared statement that returns no rows (BEGIN, COMMIT, UPDATE). */
static int
exec_command(worker *w, const char *name, int nparams, const char *const *params,
			 int *retry)
{
	PGresult   *res = PQexecPrepared(w->pg, name, nparams, params, NULL, NULL, 0);
	int			ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
	{
		if (retry && is_retryable(res))
			*retry = 1;
		else
			fail(w, "worker %d: %s: %s", w->id, name, PQerrorMessage(w->pg));
	}
	PQclear(res);
	return ok;
}

static const endpoint_limits *
find_limits(const char *endpoint)
{
	size_t		lo = 0,
				hi = nlimits;

	while (lo < hi)
	{
		size_t		mid = lo + (hi - lo) / 2;
		int			c = strcmp(endpoint, limits[mid].endpoint);

		if (c == 0)
			return &limits[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/*
 * One claim statement (plain, ratebucket): rows returned are events claimed.
 * Returns the rows for the caller to read and clear, or NULL (a failure, or
 * keep false).
 */
static PGresult *
claim_one_statement(worker *w, const char *name, int nparams,
					const char *const *params, int keep)
{
	PGresult   *res = PQexecPrepared(w->pg, name, nparams, params, NULL, NULL, 0);

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		int			n = PQntuples(res);

		w->claims++;
		w->events += n;
		w->locked += n;
		if (n == 0)
			w->empty_claims++;
		if (keep)
			return res;
	}
	else if (is_retryable(res))
		w->retries++;
	else
		fail(w, "worker %d: %s: %s", w->id, name, PQerrorMessage(w->pg));
	PQclear(res);
	return NULL;
}

/* Parse one Lua reply {granted, tokens, wait}: 1 granted, 0 refused, -1 error. */
static int
parse_lua_reply(worker *w, redisReply *r, double *wait)
{
	if (r == NULL)
	{
		fail(w, "worker %d: redis: %s", w->id,
			 w->redis->errstr[0] ? w->redis->errstr : "no reply");
		return -1;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
		r->element[0]->type != REDIS_REPLY_INTEGER ||
		r->element[2]->type != REDIS_REPLY_STRING)
	{
		fail(w, "worker %d: unexpected reply from EVALSHA (type %d): %s", w->id,
			 r->type, r->type == REDIS_REPLY_ERROR ? r->str : "");
		return -1;
	}
	*wait = strtod(r->element[2]->str, NULL);
	return r->element[0]->integer == 1 ? 1 : 0;
}

/* The Redis mode: lock a batch, ask Redis per event, claim or defer. */
static void
claim_redis(worker *w, const char *batch_param, strbuf *granted,
			strbuf *refused_ids, strbuf *refused_waits)
{
	PGresult   *res;
	int			n,
				i,
				ngranted = 0,
				nrefused = 0,
				retry = 0;
	const char *params[2];

	if (!exec_command(w, "begin", 0, NULL, NULL))
		return;
	res = PQexecPrepared(w->pg, "lock", 1, &batch_param, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (is_retryable(res))
			retry = 1;
		else
			fail(w, "worker %d: lock: %s", w->id, PQerrorMessage(w->pg));
		PQclear(res);
		goto rollback;
	}
	n = PQntuples(res);
	w->locked += n;
	sb_reset(granted);
	sb_reset(refused_ids);
	sb_reset(refused_waits);
	sb_printf(granted, "{");
	sb_printf(refused_ids, "{");
	sb_printf(refused_waits, "{");

	if (pipelined)
	{
		for (i = 0; i < n; i++)
		{
			const char *ep = PQgetvalue(res, i, 1);
			const endpoint_limits *l = find_limits(ep);

			if (l == NULL)
			{
				fail(w, "worker %d: endpoint %s not in bench_endpoints", w->id, ep);
				PQclear(res);
				goto rollback;
			}
			if (redisAppendCommand(w->redis, "EVALSHA %s 1 bucket:%s %s %s 1",
								   sha, ep, l->rate, l->capacity) != REDIS_OK)
			{
				fail(w, "worker %d: redisAppendCommand failed", w->id);
				PQclear(res);
				goto rollback;
			}
		}
	}
	for (i = 0; i < n; i++)
	{
		const char *id = PQgetvalue(res, i, 0);
		const char *ep = PQgetvalue(res, i, 1);
		redisReply *r = NULL;
		double		wait = 0;
		int			got;

		if (pipelined)
		{
			void	   *reply = NULL;

			if (redisGetReply(w->redis, &reply) == REDIS_OK)
				r = reply;
		}
		else
		{
			const endpoint_limits *l = find_limits(ep);

			if (l == NULL)
			{
				fail(w, "worker %d: endpoint %s not in bench_endpoints", w->id, ep);
				PQclear(res);
				goto rollback;
			}
			r = redisCommand(w->redis, "EVALSHA %s 1 bucket:%s %s %s 1",
							 sha, ep, l->rate, l->capacity);
		}
		got = parse_lua_reply(w, r, &wait);
		if (r)
			freeReplyObject(r);
		if (got < 0)
		{
			PQclear(res);
			goto rollback;
		}
		if (got)
			sb_printf(granted, "%s%s", ngranted++ ? "," : "", id);
		else
		{
			sb_printf(refused_ids, "%s%s", nrefused ? "," : "", id);
			sb_printf(refused_waits, "%s%.6f", nrefused ? "," : "", wait);
			nrefused++;
		}
	}
	PQclear(res);
	sb_printf(granted, "}");
	sb_printf(refused_ids, "}");
	sb_printf(refused_waits, "}");

	if (ngranted > 0)
	{
		params[0] = granted->data;
		if (!exec_command(w, "grant", 1, params, &retry))
			goto rollback;
	}
	if (nrefused > 0)
	{
		params[0] = refused_ids->data;
		params[1] = refused_waits->data;
		if (!exec_command(w, "defer", 2, params, &retry))
			goto rollback;
	}
	if (!exec_command(w, "commit", 0, NULL, &retry))
		goto rollback;
	w->claims++;
	w->events += ngranted;
	w->refused += nrefused;
	if (ngranted == 0)
		w->empty_claims++;
	return;

rollback:
	if (retry)
		w->retries++;
	{
		PGresult   *rb = PQexec(w->pg, "ROLLBACK");

		PQclear(rb);
	}
}

/* A statement that returns rows, all of them wanted: NULL on failure. */
static PGresult *
query_rows(worker *w, const char *name, int nparams, const char *const *params,
		   int *retry)
{
	PGresult   *res = PQexecPrepared(w->pg, name, nparams, params, NULL, NULL, 0);

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		return res;
	if (retry && is_retryable(res))
		*retry = 1;
	else
		fail(w, "worker %d: %s: %s", w->id, name, PQerrorMessage(w->pg));
	PQclear(res);
	return NULL;
}

/* The pipeline, step 1: the events one claim asks for, ROWS per INSERT. */
static void
pipeline_enqueue(worker *w, long events)
{
	char		start[32],
				rows[16];
	const char *params[3] = {insert_endpoints, start, rows};

	w->owed += events;
	snprintf(rows, sizeof(rows), "%d", insert_rows);
	while (!w->failed && w->owed >= insert_rows)
	{
		snprintf(start, sizeof(start), "%ld", w->next_endpoint);
		if (!exec_command(w, "insert", 3, params, NULL))
			return;
		w->next_endpoint += insert_rows;
		w->owed -= insert_rows;
		w->inserted += insert_rows;
	}
}

/* The pipeline, step 3: the claimed events ({id,...}, and their leases) delivered. */
static void
pipeline_record(worker *w, const char *ids, const char *leases, long n)
{
	const char *params[2] = {ids, leases};
	PGresult   *res;
	int			retry = 0;

	if (n == 0)
		return;
	if (mode != MODE_RATEBUCKET)
	{
		if (exec_command(w, "deliver", 1, params, NULL))
			w->delivered += n;
		return;
	}
	for (;;)
	{
		retry = 0;
		res = query_rows(w, "record", 2, params, &retry);
		if (res)
		{
			w->delivered += strtol(PQgetvalue(res, 0, 0), NULL, 10);
			PQclear(res);
			return;
		}
		if (!retry)
			return;
		w->retries++;
	}
}

/* One round of the pipeline: enqueue, claim, record. */
static void
pipeline_round(worker *w, const char *const *claim_params, strbuf *ids, strbuf *leases,
			   strbuf *granted, strbuf *refused_ids, strbuf *refused_waits)
{
	long		n = 0;

	pipeline_enqueue(w, mode == MODE_RATEBUCKET ? (long) max_endpoints * per_endpoint : batch);
	if (w->failed)
		return;
	if (mode == MODE_REDIS)
	{
		long		before = w->events;

		claim_redis(w, claim_params[0], granted, refused_ids, refused_waits);
		n = w->events - before;
		pipeline_record(w, granted->data, NULL, n);
		return;
	}
	else
	{
		PGresult   *res = claim_one_statement(w, "claim", mode == MODE_RATEBUCKET ? 2 : 1,
											  claim_params, 1);
		int			i;

		if (res == NULL)
			return;
		n = PQntuples(res);
		sb_reset(ids);
		sb_reset(leases);
		sb_printf(ids, "{");
		sb_printf(leases, "{");
		for (i = 0; i < n; i++)
		{
			sb_printf(ids, "%s%s", i ? "," : "", PQgetvalue(res, i, 0));
			if (mode == MODE_RATEBUCKET)
				sb_printf(leases, "%s\"%s\"", i ? "," : "", PQgetvalue(res, i, 2));
		}
		sb_printf(ids, "}");
		sb_printf(leases, "}");
		PQclear(res);
	}
	pipeline_record(w, ids->data, leases->data, n);
}

/* One claim of the mode, rolled back, and a PING to Redis. */
static void
warm_up(worker *w, const char *batch_param, const char *endpoints_param,
		const char *per_endpoint_param)
{
	PGresult   *res;
	const char *params[2];

	res = PQexec(w->pg, "BEGIN");
	PQclear(res);
	if (mode == MODE_RATEBUCKET)
	{
		params[0] = endpoints_param;
		params[1] = per_endpoint_param;
		res = PQexecPrepared(w->pg, "claim", 2, params, NULL, NULL, 0);
	}
	else
	{
		params[0] = batch_param;
		res = PQexecPrepared(w->pg, mode == MODE_PLAIN ? "claim" : "lock", 1,
							 params, NULL, NULL, 0);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fail(w, "worker %d: warm-up claim: %s", w->id, PQerrorMessage(w->pg));
	PQclear(res);
	res = PQexec(w->pg, "ROLLBACK");
	PQclear(res);
	if (w->redis && !w->failed)
	{
		redisReply *r = redisCommand(w->redis, "PING");

		if (r == NULL)
			fail(w, "worker %d: redis PING: %s", w->id, w->redis->errstr);
		else
			freeReplyObject(r);
	}
}

static void *
worker_main(void *arg)
{
	worker	   *w = arg;
	char		batch_param[16],
				endpoints_param[16],
				per_endpoint_param[16];
	const char *params[2];
	strbuf		granted = {0},
				refused_ids = {0},
				refused_waits = {0},
				ids = {0},
				leases = {0};

	snprintf(batch_param, sizeof(batch_param), "%d", batch);
	snprintf(endpoints_param, sizeof(endpoints_param), "%d", max_endpoints);
	snprintf(per_endpoint_param, sizeof(per_endpoint_param), "%d", per_endpoint);

	/* Set up: connect, prepare. */
	w->pg = PQconnectdb(conninfo);
	if (PQstatus(w->pg) != CONNECTION_OK)
		fail(w, "worker %d: connect: %s", w->id, PQerrorMessage(w->pg));
	else if (insert_rows > 0 &&
			 !(prepare(w, "insert", insert_sql, 3) &&
			   (mode == MODE_RATEBUCKET
				? prepare(w, "record", record_sql, 2)
				: prepare(w, "deliver", deliver_sql, 1))))
		;						/* fail() said why */
	else if (mode == MODE_PLAIN)
		prepare(w, "claim", plain_sql, 1);
	else if (mode == MODE_RATEBUCKET)
		prepare(w, "claim", ratebucket_sql, 2);
	else
	{
		if (prepare(w, "begin", "BEGIN", 0) &&
			prepare(w, "commit", "COMMIT", 0) &&
			prepare(w, "lock", redis_lock_sql, 1) &&
			prepare(w, "grant", redis_grant_sql, 1) &&
			prepare(w, "defer", redis_defer_sql, 2))
		{
			struct timeval tv = {5, 0};

			w->redis = redisConnectWithTimeout(redis_host, redis_port, tv);
			if (w->redis == NULL || w->redis->err)
				fail(w, "worker %d: redis connect %s:%d: %s", w->id, redis_host,
					 redis_port, w->redis ? w->redis->errstr : "out of memory");
		}
	}

	/*
	 * Warm up, in a transaction rolled back: the first claim of a new
	 * connection loads catalog caches, the extension's library and its
	 * saved plans; none of that belongs to the measurement.
	 */
	if (!w->failed)
		warm_up(w, batch_param, endpoints_param, per_endpoint_param);

	pthread_barrier_wait(w->barrier);	/* the clock starts */

	w->next_endpoint = (long) w->id * 7919;
	while (!w->failed && !atomic_load(&stop_flag))
	{
		if (insert_rows > 0)
		{
			const char *claim_params[2];

			if (mode == MODE_RATEBUCKET)
			{
				claim_params[0] = endpoints_param;
				claim_params[1] = per_endpoint_param;
			}
			else
				claim_params[0] = batch_param;
			pipeline_round(w, claim_params, &ids, &leases, &granted, &refused_ids,
						   &refused_waits);
			continue;
		}
		switch (mode)
		{
			case MODE_PLAIN:
				params[0] = batch_param;
				claim_one_statement(w, "claim", 1, params, 0);
				break;
			case MODE_RATEBUCKET:
				params[0] = endpoints_param;
				params[1] = per_endpoint_param;
				claim_one_statement(w, "claim", 2, params, 0);
				break;
			case MODE_REDIS:
				claim_redis(w, batch_param, &granted, &refused_ids, &refused_waits);
				break;
		}
	}

	free(granted.data);
	free(refused_ids.data);
	free(refused_waits.data);
	free(ids.data);
	free(leases.data);
	return NULL;
}

/* The pipeline's endpoints: those of bench_endpoints with tokens, {a,b,...}. */
static int
load_insert_endpoints(void)
{
	PGconn	   *c = PQconnectdb(conninfo);
	PGresult   *res;
	int			ok = 0;

	if (PQstatus(c) != CONNECTION_OK)
		fprintf(stderr, "claim_bench: connect: %s", PQerrorMessage(c));
	else
	{
		res = PQexec(c, "SELECT '{' || string_agg(endpoint, ',' ORDER BY endpoint) || '}' "
					 "FROM bench_endpoints WHERE ready");
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQgetisnull(res, 0, 0))
			fprintf(stderr, "claim_bench: no endpoint with tokens in bench_endpoints: %s",
					PQerrorMessage(c));
		else if ((insert_endpoints = strdup(PQgetvalue(res, 0, 0))) != NULL)
			ok = 1;
		PQclear(res);
	}
	PQfinish(c);
	return ok;
}

/* Read bench_endpoints (endpoint, rate, capacity) into the sorted array. */
static int
load_limits(void)
{
	PGconn	   *c = PQconnectdb(conninfo);
	PGresult   *res;
	int			i;

	if (PQstatus(c) != CONNECTION_OK)
	{
		fprintf(stderr, "claim_bench: connect: %s", PQerrorMessage(c));
		PQfinish(c);
		return 0;
	}
	/* ORDER BY ... COLLATE "C": the order strcmp uses */
	res = PQexec(c, "SELECT endpoint, rate::text, capacity::text FROM bench_endpoints "
				 "ORDER BY endpoint COLLATE \"C\"");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "claim_bench: reading bench_endpoints: %s", PQerrorMessage(c));
		PQclear(res);
		PQfinish(c);
		return 0;
	}
	nlimits = (size_t) PQntuples(res);
	limits = calloc(nlimits ? nlimits : 1, sizeof(*limits));
	if (limits == NULL)
	{
		fprintf(stderr, "claim_bench: out of memory\n");
		exit(2);
	}
	for (i = 0; i < (int) nlimits; i++)
	{
		limits[i].endpoint = strdup(PQgetvalue(res, i, 0));
		limits[i].rate = strdup(PQgetvalue(res, i, 1));
		limits[i].capacity = strdup(PQgetvalue(res, i, 2));
		if (!limits[i].endpoint || !limits[i].rate || !limits[i].capacity)
		{
			fprintf(stderr, "claim_bench: out of memory\n");
			exit(2);
		}
	}
	PQclear(res);
	PQfinish(c);
	return 1;
}

static void
usage(FILE *f)
{
	fprintf(f,
			"usage: claim_bench plain|ratebucket|redis [options]\n"
			"  -w N        worker threads, one connection each (8)\n"
			"  -s SECONDS  how long to claim (5)\n"
			"  -b N        batch: the LIMIT of the plain and redis claims (50)\n"
			"  -e N        ratebucket: claim_events max_endpoints (10)\n"
			"  -p N        ratebucket: claim_events per_endpoint (5)\n"
			"  -F NAME     ratebucket: call NAME(batch, per_endpoint) instead of\n"
			"              claim_events (a plain identifier)\n"
			"  -d CONNINFO PostgreSQL connection (default: from PG* variables)\n"
			"  -H HOST     redis host (127.0.0.1)\n"
			"  -P PORT     redis port (6379)\n"
			"  -S SHA      SHA1 of bench/token_bucket.lua, loaded with SCRIPT LOAD\n"
			"  -l          redis: pipeline the EVALSHAs of one batch\n"
			"  -I ROWS     the whole pipeline: enqueue (ROWS rows per INSERT), claim,\n"
			"              record every claimed event as delivered\n");
}

static int
int_arg(const char *s, const char *what, int min)
{
	char	   *end;
	long		v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > 1000000)
	{
		fprintf(stderr, "claim_bench: bad %s: %s\n", what, s);
		exit(2);
	}
	return (int) v;
}

int
main(int argc, char **argv)
{
	int			opt,
				i,
				rc = 0;
	worker	   *workers;
	pthread_barrier_t barrier;
	double		t0,
				t1;
	long		claims = 0,
				empty = 0,
				events = 0,
				locked = 0,
				refused = 0,
				retries = 0,
				inserted = 0,
				delivered = 0;
	struct timespec nap;
	char	   *end;
	struct rusage ru;

	if (argc < 2)
	{
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "plain") == 0)
		mode = MODE_PLAIN;
	else if (strcmp(argv[1], "ratebucket") == 0)
		mode = MODE_RATEBUCKET;
	else if (strcmp(argv[1], "redis") == 0)
		mode = MODE_REDIS;
	else if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)
	{
		usage(stdout);
		return 0;
	}
	else
	{
		usage(stderr);
		return 2;
	}
	optind = 2;
	while ((opt = getopt(argc, argv, "w:s:b:e:p:F:d:H:P:S:lI:")) != -1)
	{
		switch (opt)
		{
			case 'w':
				nworkers = int_arg(optarg, "workers", 1);
				break;
			case 's':
				run_seconds = strtod(optarg, &end);
				if (*end || run_seconds <= 0)
				{
					fprintf(stderr, "claim_bench: bad seconds: %s\n", optarg);
					return 2;
				}
				break;
			case 'b':
				batch = int_arg(optarg, "batch", 1);
				break;
			case 'e':
				max_endpoints = int_arg(optarg, "endpoints", 1);
				break;
			case 'p':
				per_endpoint = int_arg(optarg, "per_endpoint", 1);
				break;
			case 'F':
				if (optarg[0] == '\0' || strlen(optarg) > 63 ||
					strspn(optarg, "abcdefghijklmnopqrstuvwxyz_0123456789") != strlen(optarg) ||
					(optarg[0] >= '0' && optarg[0] <= '9'))
				{
					fprintf(stderr, "claim_bench: -F wants a plain lower-case identifier: %s\n", optarg);
					return 2;
				}
				claim_function = optarg;
				break;
			case 'd':
				conninfo = optarg;
				break;
			case 'H':
				redis_host = optarg;
				break;
			case 'P':
				redis_port = int_arg(optarg, "redis port", 1);
				break;
			case 'S':
				sha = optarg;
				break;
			case 'l':
				pipelined = 1;
				break;
			case 'I':
				insert_rows = int_arg(optarg, "rows per insert", 1);
				break;
			default:
				usage(stderr);
				return 2;
		}
	}
	if (optind != argc)
	{
		usage(stderr);
		return 2;
	}
	snprintf(ratebucket_sql, sizeof(ratebucket_sql),
			 "SELECT id, endpoint, lease_until FROM %s($1::int * $2::int, $2::int)",
			 claim_function);
	if (insert_rows > 0 && !load_insert_endpoints())
		return 1;
	if (mode == MODE_REDIS)
	{
		if (sha == NULL)
		{
			fprintf(stderr, "claim_bench: the redis mode needs -S <sha>\n");
			return 2;
		}
		if (!load_limits())
			return 1;
	}

	workers = calloc((size_t) nworkers, sizeof(*workers));
	if (workers == NULL || pthread_barrier_init(&barrier, NULL, (unsigned) nworkers + 1) != 0)
	{
		fprintf(stderr, "claim_bench: cannot set up %d workers\n", nworkers);
		return 2;
	}
	for (i = 0; i < nworkers; i++)
	{
		workers[i].id = i;
		workers[i].barrier = &barrier;
		if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0)
		{
			fprintf(stderr, "claim_bench: pthread_create failed\n");
			return 2;			/* the barrier would never open */
		}
	}
	pthread_barrier_wait(&barrier);
	t0 = now_seconds();
	/* Sleep until the end of the run (or until a worker fails). */
	while (!atomic_load(&stop_flag))
	{
		double		left = t0 + run_seconds - now_seconds();

		if (left <= 0)
			break;
		if (left > 0.05)
			left = 0.05;
		nap.tv_sec = 0;
		nap.tv_nsec = (long) (left * 1e9);
		nanosleep(&nap, NULL);
	}
	atomic_store(&stop_flag, 1);
	for (i = 0; i < nworkers; i++)
		pthread_join(workers[i].thread, NULL);
	t1 = now_seconds();

	for (i = 0; i < nworkers; i++)
	{
		worker	   *w = &workers[i];

		if (w->failed)
		{
			fprintf(stderr, "claim_bench: %s\n", w->error);
			rc = 1;
		}
		claims += w->claims;
		empty += w->empty_claims;
		events += w->events;
		locked += w->locked;
		refused += w->refused;
		retries += w->retries;
		inserted += w->inserted;
		delivered += w->delivered;
		if (w->redis)
			redisFree(w->redis);
		PQfinish(w->pg);
	}
	/* the driver's own CPU time, setup included: what the client cost */
	getrusage(RUSAGE_SELF, &ru);
	printf("mode=%s%s workers=%d seconds=%.3f claims=%ld empty_claims=%ld "
		   "events=%ld locked=%ld refused=%ld retries=%ld "
		   "events_per_s=%.1f claims_per_s=%.1f ms_per_claim=%.3f client_cpu_s=%.3f "
		   "inserted=%ld delivered=%ld delivered_per_s=%.1f\n",
		   mode_names[mode], (mode == MODE_REDIS && pipelined) ? "-pipelined" : "",
		   nworkers, t1 - t0, claims, empty, events, locked, refused, retries,
		   events / (t1 - t0), claims / (t1 - t0),
		   claims ? 1000.0 * nworkers * (t1 - t0) / (double) claims : 0.0,
		   (double) ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
		   (double) ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
		   inserted, delivered, delivered / (t1 - t0));
	return rc;
}
