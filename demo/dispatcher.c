/*
 * demo/dispatcher.c — the reference dispatcher: webhook delivery from a
 * PostgreSQL queue, rate-limited per destination by ratebucket.
 *
 * A C program to read and copy.  It runs the README's worker recipe against
 * the queue of ratebucket_queue (webhook_events, claim_events, record_deliveries,
 * next_due, requeue_expired, events_left).  Several workers run at once,
 * each a thread with its own PostgreSQL connection (libpq) and its own HTTP
 * client (a libcurl multi handle), each running this loop:
 *
 *   1. claim    SELECT … FROM claim_events(batch, per_endpoint, lease)
 *               One statement in autocommit, so one short transaction: it
 *               locks due events, spends their endpoints' tokens, and marks
 *               them 'sending' with a lease.  Its row and bucket locks last
 *               only as long as the statement.
 *   2. deliver  POST every claimed event to its endpoint, all at once,
 *               OUTSIDE any transaction.  A request takes milliseconds to
 *               seconds.  A transaction held open across it would keep the
 *               bucket rows locked, with every other worker waiting on them,
 *               and would hold back vacuum.  The lease stands in for the
 *               lock: if this worker dies, requeue_expired() puts the events
 *               back when the lease runs out.
 *   3. record   SELECT … FROM record_deliveries(ids, statuses, leases, …)
 *               The whole batch in one call, its answers as arrays, one
 *               statement in autocommit: one transaction and one commit
 *               flush per batch.  record_deliveries passes the
 *               destinations' answers to bucket_observe_batch (a 429 means
 *               a cooldown and a lower rate; failures feed the circuit
 *               breaker), decides what happens to each event, and returns
 *               each event's outcome.  It takes its locks in the claim's
 *               order by itself: the batch's event rows in id order, then
 *               their buckets in endpoint order.  Every transaction must
 *               take them in that order, or workers deadlock, each
 *               stalling for deadlock_timeout (see record_batch).
 *               A 429 is recorded as soon as it comes back, with the others
 *               of the batch that came back with it so far, not at the end
 *               of the batch (whose slowest request may take seconds): its
 *               cooldown must stop the other workers' requests to that
 *               destination now, or each of them draws another 429.
 *   4. sleep    When a claim finds nothing, next_due() says how long until
 *               something could be claimable (an event falls due, a bucket
 *               refills).  The worker sleeps that long, at most 1 s, or
 *               until a NOTIFY on webhook_events says that events arrived.
 *               A worker with nothing to do makes two or three queries a
 *               second.  It never polls in a tight loop.
 *
 * Refusals are not attempts.  An event the claim could not get a token for
 * is never returned: it stays pending with its attempt count unchanged.  A
 * request that never left (the host did not resolve, the connection was
 * refused, or the connect timed out) is recorded with sent = false: the
 * attempt is not counted, though the failure still counts toward the
 * endpoint's circuit breaker.  A request that left and got no answer
 * (timeout, reset) is recorded with status NULL, and it does count.
 *
 * Delivery is at least once.  If a worker dies between deliver and record,
 * or a batch outlives its lease, the events are delivered again.
 * Destinations deduplicate on the X-Event-Id header.
 *
 * Build:  make -C demo dispatcher    (libpq-dev, libcurl4-openssl-dev)
 * Run:    demo/dispatcher --dsn 'host=/tmp dbname=demo' --until-empty
 *
 *   --dsn DSN                libpq connection string ('' for the PG* env)
 *   --workers N              worker threads, one connection each (4)
 *   --batch N                claim_events' batch: events per claim (80)
 *   --per-endpoint N         claim_events' per_endpoint (10)
 *   --lease-seconds N        claim_events' lease; must outlast a request (30)
 *   --timeout-ms N           whole-request timeout (5000); connect: 1000
 *   --until-empty            exit once events_left() is 0: none in flight,
 *                            none pending that falls due before
 *                            --max-seconds ends (if given)
 *   --max-seconds N          exit after N seconds
 *   --quiet                  only errors and the final summary
 *   --claim-log FILE         write one line per request handed to
 *                            libcurl: event id, attempt, and when the
 *                            claim that took its tokens was sent
 *                            (CLOCK_MONOTONIC, microseconds): the tokens
 *                            were taken after that
 *   --by-endpoint            claim endpoint by endpoint (due_endpoints,
 *                            claim_endpoint, record_endpoint), as a queue
 *                            distributed over Citus needs (doc/citus.md):
 *                            a batch is one endpoint's --per-endpoint
 *                            events (at most --batch); no requeue_expired
 *                            (each claim gives its endpoint's expired
 *                            leases back), no next_due: a pass that found
 *                            nothing sleeps --poll-ms (100), or until a
 *                            NOTIFY (a distributed queue sends none)
 *
 * SIGINT or SIGTERM (and --max-seconds) stop the workers gracefully: each
 * worker finishes its batch in flight, delivering and recording it, then
 * exits.  A second signal exits at once, and the unrecorded events come
 * back when their leases expire.  The final summary goes to stdout.
 * Progress lines and errors go to stderr.  Exit status: 0; 1 if any worker
 * failed; 2 on a bad command line.
 *
 * Errors.  A PostgreSQL error is printed with the worker's number and ends
 * that worker (the others go on, and the exit status is 1): it means a lost
 * connection, a bug in the queue's SQL, or a missing privilege, and
 * retrying it silently would hide it.  The one exception is a serialization
 * failure or a deadlock (SQLSTATE 40001, 40P01): a claim or a batch record
 * that fails with one is retried once.
 *
 * One worker at a time also runs requeue_expired() every 5 s.
 *
 * Threads.  A worker owns its connection, its curl handles and its buffers.
 * What they share: the stop flag and the requeue schedule (C11 atomics),
 * the totals (a mutex, merged once per batch), and the options (written
 * before any thread starts).  SIGINT and SIGTERM are blocked in every
 * thread and taken by the main thread with sigtimedwait(), so no code runs
 * in a signal handler.
 */

#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <libpq-fe.h>

#define EXIT_FAILED 1           /* a worker failed */
#define EXIT_USAGE 2            /* bad command line */

#define CONNECT_TIMEOUT_MS 1000 /* TCP connect to a destination */
#define MIN_SLEEP 0.001         /* an idle worker sleeps at least 1 ms ... */
#define MAX_SLEEP 1.0           /* ... and at most 1 s between claims */
#define REQUEUE_EVERY_MS 5000   /* requeue_expired() period */
#define PROGRESS_EVERY_S 5.0    /* progress lines, unless --quiet */
#define MAX_BATCH 10000         /* --batch */
#define MAX_HEADER_VALUE 4096   /* longer captured header values are cut */
#define MAX_OUTCOMES 16         /* distinct outcomes counted ('success', ...) */
#define CHANNEL "webhook_events"    /* ratebucket_queue's trigger NOTIFYs this */
#define USER_AGENT "ratebucket-dispatcher/1.0"

/*
 * The statements, prepared once per connection.  The claim's ORDER BY puts
 * a batch in the order its bucket locks were taken (the endpoints' bytes,
 * COLLATE "C", as claim_events and bucket_take_all lock them): its requests
 * start in that order.  record_deliveries takes its locks in that order
 * whatever the order of its arrays.
 *
 * "record" passes the batch's answers as arrays, one element per event in
 * the claim's order ($1 ids, $2 HTTP statuses, $3 claimed leases, $4
 * Retry-After values, $5 headers, $6 sent flags), and $7, for each request,
 * how long before its lease's end it left, from which the statement makes
 * its sent_ats: each lease minus that (see answer_arrays).  The result has
 * a row per event, its id and its outcome, in the order given.
 */
enum { COL_ID, COL_ENDPOINT, COL_ATTEMPTS, COL_PAYLOAD, COL_LEASE, N_CLAIM_COLUMNS };

enum { MODE_ANY, MODE_BATCH, MODE_BY_ENDPOINT };

/*
 * A recorded batch's arrays, in the order of the arguments of
 * record_deliveries (and of record_endpoint, after its endpoint): one
 * element per event of the batch, in the claim's order.
 */
enum
{
    A_ID,                       /* event ids */
    A_STATUS,                   /* HTTP statuses, NULL: no response */
    A_LEASE,                    /* the leases claimed (lease_until) */
    A_RETRY_AFTER,              /* Retry-After values, or NULL */
    A_HEADERS,                  /* the rate-limit header fields (jsonb), or NULL */
    A_SENT,                     /* false: the request never left */
    A_SENT_AT,                  /* when it left: see answer_arrays */
    N_ANSWER_ARRAYS
};

static const struct
{
    const char *name;
    const char *sql;
    int nparams;
    int mode;                   /* prepared in that mode (MODE_ANY: both) */
} statements[] = {
    {"claim",
     "SELECT id, endpoint, attempts, payload, lease_until"
     " FROM claim_events($1::int, $2::int, $3::interval)"
     " ORDER BY endpoint COLLATE \"C\", id", 3, MODE_BATCH},
    {"record",
     "SELECT event_id, outcome FROM record_deliveries($1::bigint[], $2::int[],"
     " $3::timestamptz[], $4::text[], $5::jsonb[], $6::boolean[],"
     " ARRAY(SELECT l - make_interval(secs => s)"
     " FROM unnest($3::timestamptz[], $7::float8[]) WITH ORDINALITY AS a(l, s, o)"
     " ORDER BY o))", 7, MODE_BATCH},
    {"next_due", "SELECT next_due()", 0, MODE_BATCH},
    {"events_left", "SELECT events_left(clock_timestamp() + make_interval(secs => $1::float8))", 1,
     MODE_ANY},
    {"requeue_expired", "SELECT requeue_expired()", 0, MODE_BATCH},
    /* --by-endpoint: each a bare call, which Citus runs on the endpoint's node */
    {"due_endpoints", "SELECT endpoint FROM due_endpoints($1::int)", 1, MODE_BY_ENDPOINT},
    {"claim_endpoint",
     "SELECT id, endpoint, attempts, payload, lease_until"
     " FROM claim_endpoint($1::text, $2::int, $3::interval)", 3, MODE_BY_ENDPOINT},
    {"record_endpoint",
     "SELECT event_id, outcome FROM record_endpoint($1::text, $2::bigint[], $3::int[],"
     " $4::timestamptz[], $5::text[], $6::jsonb[], $7::boolean[], $8::timestamptz[])", 8,
     MODE_BY_ENDPOINT},
};

/*
 * The response header fields passed on to record_deliveries, matched without
 * regard to case.  Retry-After goes in its own argument.  The others go in
 * the headers object, under the names as the destination spelled them.
 */
static const char *const captured_names[] = {
    "Retry-After",
    "RateLimit",
    "RateLimit-Policy",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
};
#define N_CAPTURED ((int) (sizeof(captured_names) / sizeof(captured_names[0])))
#define H_RETRY_AFTER 0

/* ------------------------------------------------------------- types -- */

/* A growable byte buffer, always NUL-terminated, reused between batches. */
typedef struct Buf
{
    char *data;
    size_t len;
    size_t cap;
} Buf;

/* One captured response header field. */
typedef struct Captured
{
    bool present;
    char name[32];              /* as spelled by the destination */
    Buf value;                  /* raw bytes; repeated fields joined by ", " */
} Captured;

/*
 * One HTTP request.  Each worker keeps one per event of its largest batch,
 * created at start and reused: the easy handles, and the connections their
 * multi handle keeps alive, outlive the batch.
 */
typedef struct Request
{
    CURL *easy;
    struct curl_slist *headers; /* this request's header list */
    bool active;                /* added to the multi handle */
    int row;                    /* its event: a row of the claim's result */
    CURLcode result;
    long status;                /* the HTTP status, 0: no response */
    bool sent;                  /* false: it never left (see request_left) */
    double sent_mono;           /* now_s() when it was handed to libcurl */
    bool done;                  /* its outcome is known */
    bool recorded;              /* recorded already (a 429, at once) */
    bool take;                  /* in the record being built (answer_arrays) */
    Captured captured[N_CAPTURED];
    char error[CURL_ERROR_SIZE];
} Request;

/* How many events were recorded with one outcome ('success', ...). */
typedef struct OutcomeCount
{
    char name[32];
    long long count;
} OutcomeCount;

/* Counters.  Each worker fills its own and adds them to the totals. */
typedef struct Stats
{
    long long claims;           /* claim_events calls */
    long long claims_nonempty;  /* ... that returned events */
    long long claimed;          /* events claimed */
    long long recorded;         /* events recorded (committed) */
    long long http_2xx, http_429, http_5xx, http_other;
    long long no_response;      /* sent, but no answer */
    long long not_sent;         /* never left */
    double claim_s, deliver_s, record_s;    /* worker time in each step */
    int noutcomes;
    OutcomeCount outcomes[MAX_OUTCOMES];
    long long outcomes_other;   /* beyond MAX_OUTCOMES distinct values */
} Stats;

typedef struct Worker
{
    int num;
    pthread_t thread;
    bool started;
    bool failed;
    PGconn *conn;
    CURLM *multi;
    Request *requests;
    int nrequests;              /* created so far (all, after worker_init) */
    PGresult *batch;            /* the claim's result, kept until recorded */
    double claimed_mono;        /* now_s() as the claim was sent */
    double early_record_s;      /* this batch's records while in flight (429s) */
    bool notified;              /* a NOTIFY came since the last claim began */
    Buf json;                   /* scratch: an event's headers */
    Buf text;                   /* scratch: an event's Retry-After */
    double transport_logged_at; /* rate limit of transport error messages */
    long transport_unlogged;
    /* --by-endpoint: the endpoints of the current pass (due_endpoints) */
    PGresult *endpoints;
    int pass_start;             /* this worker's first endpoint of the pass */
    int pass_next;              /* endpoints of the pass tried so far */
    long long pass_claimed;     /* events claimed in the pass */
    Buf arrays[N_ANSWER_ARRAYS];    /* scratch: the batch's answers (answer_arrays) */
} Worker;

/* ------------------------------------------------------ shared state -- */

static struct
{
    const char *dsn;
    int workers;
    int batch;
    int per_endpoint;
    int lease_seconds;
    int timeout_ms;
    bool until_empty;
    double max_seconds;         /* 0: no limit */
    bool quiet;
    bool by_endpoint;           /* claim endpoint by endpoint */
    int poll_ms;                /* --by-endpoint: sleep when nothing claimable */
    const char *claim_log;      /* --claim-log: the file's path, or NULL */
} opt = {NULL, 4, 80, 10, 30, 5000, false, 0, false, false, 100, NULL};

static FILE *claim_log;         /* opened before the threads start */
static pthread_mutex_t claim_log_lock = PTHREAD_MUTEX_INITIALIZER;
static bool claim_log_failed;   /* guarded by claim_log_lock */

static double start_time;       /* set before the threads start */
static atomic_bool stopping;    /* finish the batch in flight, then exit */
static const char *stop_reason; /* written once, by whoever set stopping */
static int stop_pipe[2] = {-1, -1}; /* written to on stop: wakes sleepers */
static atomic_int workers_running;
static atomic_llong next_requeue_ms;    /* when requeue_expired() is due */

static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;
static Stats totals;            /* guarded by totals_lock */

/* ------------------------------------------------------------ helpers -- */

static double
now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One line on stderr, written with a single call so threads do not mix. */
static void
vlog(int worker, const char *fmt, va_list ap)
{
    char line[2048];
    size_t n;

    n = (size_t) snprintf(line, sizeof(line), "[%9.3f] ", now_s() - start_time);
    if (worker >= 0 && n < sizeof(line))
        n += (size_t) snprintf(line + n, sizeof(line) - n, "worker %d: ", worker);
    if (n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    fprintf(stderr, "%s\n", line);
}

__attribute__((format(printf, 2, 3)))
static void
log_error(int worker, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vlog(worker, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 2, 3)))
static void
log_info(int worker, const char *fmt, ...)
{
    va_list ap;

    if (opt.quiet)
        return;
    va_start(ap, fmt);
    vlog(worker, fmt, ap);
    va_end(ap);
}

static void
out_of_memory(void)
{
    fputs("dispatcher: out of memory\n", stderr);
    abort();
}

static void
buf_reserve(Buf *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    size_t cap = b->cap ? b->cap : 64;
    char *p;

    if (need <= b->cap)
        return;
    while (cap < need)
        cap *= 2;
    p = realloc(b->data, cap);
    if (p == NULL)
        out_of_memory();
    b->data = p;
    b->cap = cap;
}

static void
buf_reset(Buf *b)
{
    buf_reserve(b, 0);
    b->len = 0;
    b->data[0] = '\0';
}

static void
buf_append(Buf *b, const char *s, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void
buf_putc(Buf *b, char c)
{
    buf_append(b, &c, 1);
}

static void
buf_free(Buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/*
 * Header bytes outside ASCII are obs-text (RFC 9110), read as ISO-8859-1.
 * Converting them, instead of passing them through, means a destination
 * cannot make the record fail with invalid UTF-8.  NUL bytes are dropped:
 * PostgreSQL text cannot hold them.
 */
static void
append_latin1_as_utf8(Buf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
    {
        unsigned char c = (unsigned char) s[i];

        if (c == 0)
            continue;
        if (c < 0x80)
            buf_putc(b, (char) c);
        else
        {
            buf_putc(b, (char) (0xC0 | (c >> 6)));
            buf_putc(b, (char) (0x80 | (c & 0x3F)));
        }
    }
}

/* A JSON string: quotes, backslashes and control bytes escaped; bytes
 * above 0x7E as \u00XX (ISO-8859-1, as above); NUL dropped. */
static void
append_json_string(Buf *b, const char *s, size_t n)
{
    buf_putc(b, '"');
    for (size_t i = 0; i < n; i++)
    {
        unsigned char c = (unsigned char) s[i];
        char esc[8];

        if (c == 0)
            continue;
        if (c == '"' || c == '\\')
        {
            buf_putc(b, '\\');
            buf_putc(b, (char) c);
        }
        else if (c < 0x20 || c > 0x7E)
        {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            buf_append(b, esc, 6);
        }
        else
            buf_putc(b, (char) c);
    }
    buf_putc(b, '"');
}

/* ----------------------------------------------------------- counters -- */

static void
stats_add_outcome(Stats *s, const char *value, long long count)
{
    char name[sizeof(s->outcomes[0].name)];
    int i;

    snprintf(name, sizeof(name), "%s", value);
    for (i = 0; i < s->noutcomes; i++)
        if (strcmp(s->outcomes[i].name, name) == 0)
            break;
    if (i == s->noutcomes)
    {
        if (i == MAX_OUTCOMES)
        {
            s->outcomes_other += count;
            return;
        }
        memcpy(s->outcomes[i].name, name, sizeof(name));
        s->outcomes[i].count = 0;
        s->noutcomes++;
    }
    s->outcomes[i].count += count;
}

static void
stats_add(Stats *to, const Stats *from)
{
    to->claims += from->claims;
    to->claims_nonempty += from->claims_nonempty;
    to->claimed += from->claimed;
    to->recorded += from->recorded;
    to->http_2xx += from->http_2xx;
    to->http_429 += from->http_429;
    to->http_5xx += from->http_5xx;
    to->http_other += from->http_other;
    to->no_response += from->no_response;
    to->not_sent += from->not_sent;
    to->claim_s += from->claim_s;
    to->deliver_s += from->deliver_s;
    to->record_s += from->record_s;
    for (int i = 0; i < from->noutcomes; i++)
        stats_add_outcome(to, from->outcomes[i].name, from->outcomes[i].count);
    to->outcomes_other += from->outcomes_other;
}

/* Add a worker's counters to the totals and clear them. */
static void
stats_flush(Stats *s)
{
    pthread_mutex_lock(&totals_lock);
    stats_add(&totals, s);
    pthread_mutex_unlock(&totals_lock);
    memset(s, 0, sizeof(*s));
}

static void
stats_snapshot(Stats *s)
{
    pthread_mutex_lock(&totals_lock);
    *s = totals;
    pthread_mutex_unlock(&totals_lock);
}

/* --------------------------------------------------------------- stop -- */

static bool
stop_requested(void)
{
    return atomic_load(&stopping);
}

/* Ask every worker to finish its batch in flight and exit.  Idempotent. */
static void
request_stop(const char *reason)
{
    if (atomic_exchange(&stopping, true))
        return;
    stop_reason = reason;
    /* The byte is never read: the pipe stays readable, so every poll()
     * on it returns at once from now on. */
    if (write(stop_pipe[1], "x", 1) != 1)
        log_error(-1, "could not wake the workers: %s (they notice within 1 s)",
                  strerror(errno));
    log_info(-1, "stopping (%s): finishing the batches in flight", reason);
}

/* ---------------------------------------------------------- PostgreSQL -- */

/* The length of a libpq message without its trailing newline. */
static int
msg_len(const char *msg)
{
    size_t n = strlen(msg);

    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        n--;
    return (int) n;
}

static void
report_pg_error(Worker *w, const char *what, const PGresult *res)
{
    const char *msg = res ? PQresultErrorMessage(res) : "";
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    if (PQstatus(w->conn) == CONNECTION_BAD)
    {
        msg = PQerrorMessage(w->conn);
        log_error(w->num, "%s: lost the connection to PostgreSQL: %.*s",
                  what, msg_len(msg), msg);
        return;
    }
    if (*msg == '\0')
        msg = PQerrorMessage(w->conn);
    log_error(w->num, "%s failed: %.*s%s%s%s", what, msg_len(msg), msg,
              state ? " (SQLSTATE " : "", state ? state : "", state ? ")" : "");
}

/* Serialization failure or deadlock: the transaction may simply be run again. */
static bool
retryable(const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    return state != NULL &&
        (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
}

/*
 * Take the notifications libpq has read so far off its queue.  Every query
 * may bring some (they arrive between transactions), and a busy worker must
 * not let them pile up.  One is enough to know that events may have arrived.
 */
static void
drain_notifies(Worker *w)
{
    PGnotify *n;

    while ((n = PQnotifies(w->conn)) != NULL)
    {
        w->notified = true;
        PQfreemem(n);
    }
}

/* Run a prepared statement.  The caller checks and clears the result. */
static PGresult *
run_prepared(Worker *w, const char *stmt, int nparams, const char *const *values)
{
    PGresult *res = PQexecPrepared(w->conn, stmt, nparams, values, NULL, NULL, 0);

    drain_notifies(w);
    return res;
}

/* BEGIN, COMMIT, ROLLBACK, LISTEN.  On failure, returns false and leaves the
 * result in *failed for the caller to report and clear. */
static bool
run_command(Worker *w, const char *sql, PGresult **failed)
{
    PGresult *res = PQexec(w->conn, sql);

    drain_notifies(w);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
    {
        *failed = res;
        return false;
    }
    PQclear(res);
    return true;
}

/*
 * A single-value query: next_due(), events_left(), requeue_expired().
 * Returns 1 with *value set, 0 for NULL, -1 on error (reported, or left in
 * *failed when the caller wants to look at it).
 */
static int
query_value_with(Worker *w, const char *stmt, int nparams,
                 const char *const *params, double *value, PGresult **failed)
{
    PGresult *res = run_prepared(w, stmt, nparams, params);
    int rc;

    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
        PQnfields(res) != 1)
    {
        if (failed != NULL && PQresultStatus(res) != PGRES_TUPLES_OK)
        {
            *failed = res;
            return -1;
        }
        if (PQresultStatus(res) == PGRES_TUPLES_OK)
            log_error(w->num, "%s: expected one value, got %d rows of %d columns",
                      stmt, PQntuples(res), PQnfields(res));
        else
            report_pg_error(w, stmt, res);
        PQclear(res);
        return -1;
    }
    rc = PQgetisnull(res, 0, 0) ? 0 : 1;
    if (rc == 1)
        *value = strtod(PQgetvalue(res, 0, 0), NULL);
    PQclear(res);
    return rc;
}

static int
query_value(Worker *w, const char *stmt, double *value, PGresult **failed)
{
    return query_value_with(w, stmt, 0, NULL, value, failed);
}

/* Server notices and warnings, and a FATAL that arrives while the worker
 * is idle, with the worker's number (libpq's default prints them bare). */
static void
on_notice(void *arg, const char *message)
{
    const Worker *w = arg;

    log_error(w->num, "%.*s", msg_len(message), message);
}

static bool
worker_connect(Worker *w)
{
    /* fallback_application_name yields to one in the DSN; client_encoding
     * comes after the DSN so it wins: payloads are sent as UTF-8 JSON. */
    static const char *const keys[] = {
        "fallback_application_name", "dbname", "client_encoding", NULL
    };
    const char *const values[] = {"ratebucket-dispatcher", opt.dsn, "UTF8", NULL};
    PGresult *res = NULL;

    w->conn = PQconnectdbParams(keys, values, 1);
    if (w->conn == NULL)
        out_of_memory();
    PQsetNoticeProcessor(w->conn, on_notice, w);
    if (PQstatus(w->conn) != CONNECTION_OK)
    {
        const char *msg = PQerrorMessage(w->conn);

        log_error(w->num, "could not connect to PostgreSQL: %.*s", msg_len(msg), msg);
        return false;
    }
    for (size_t i = 0; i < sizeof(statements) / sizeof(statements[0]); i++)
    {
        if (statements[i].mode != MODE_ANY &&
            statements[i].mode != (opt.by_endpoint ? MODE_BY_ENDPOINT : MODE_BATCH))
            continue;
        res = PQprepare(w->conn, statements[i].name, statements[i].sql,
                        statements[i].nparams, NULL);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
        {
            char what[64];

            snprintf(what, sizeof(what), "preparing %s", statements[i].name);
            report_pg_error(w, what, res);
            PQclear(res);
            return false;
        }
        PQclear(res);
    }
    /* --by-endpoint shifts lease times (record_endpoint's sent_ats): in UTC */
    if (opt.by_endpoint && !run_command(w, "SET TimeZone = 'UTC'; SET DateStyle = 'ISO'", &res))
    {
        report_pg_error(w, "SET TimeZone", res);
        PQclear(res);
        return false;
    }
    if (!run_command(w, "LISTEN " CHANNEL, &res))
    {
        report_pg_error(w, "LISTEN " CHANNEL, res);
        PQclear(res);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- HTTP -- */

#define TRY_SETOPT(w, h, option, value) \
    do { \
        CURLcode rc_ = curl_easy_setopt((h), (option), (value)); \
        if (rc_ != CURLE_OK) \
        { \
            log_error((w)->num, "curl_easy_setopt(%s): %s", #option, \
                      curl_easy_strerror(rc_)); \
            return false; \
        } \
    } while (0)

/* Response bodies are read and thrown away (the default writes them to
 * stdout). */
static size_t
discard_body(char *data, size_t size, size_t nmemb, void *arg)
{
    return size * nmemb;
}

static void
clear_captured(Request *r)
{
    for (int i = 0; i < N_CAPTURED; i++)
    {
        r->captured[i].present = false;
        r->captured[i].value.len = 0;
    }
}

/* Keep one field's value, trimmed; a repeated field is joined with ", ",
 * as HTTP combines field lines.  A value is cut at MAX_HEADER_VALUE bytes
 * (sane ones are short), so a destination cannot make it grow unbounded. */
static void
capture(Captured *c, const char *name, size_t namelen,
        const char *value, const char *end)
{
    size_t n;

    while (value < end && (*value == ' ' || *value == '\t'))
        value++;
    while (end > value && (end[-1] == '\r' || end[-1] == '\n' ||
                           end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (!c->present)
    {
        memcpy(c->name, name, namelen);
        c->name[namelen] = '\0';
        c->present = true;
        buf_reset(&c->value);
    }
    else
        buf_append(&c->value, ", ", 2);
    n = (size_t) (end - value);
    if (c->value.len + n > MAX_HEADER_VALUE)
        n = c->value.len < MAX_HEADER_VALUE ? MAX_HEADER_VALUE - c->value.len : 0;
    buf_append(&c->value, value, n);
}

/*
 * libcurl calls this once per header line of the response.  A status line
 * begins a new response: after a 1xx interim response only the final
 * response's fields count.
 */
static size_t
on_header(char *data, size_t size, size_t nitems, void *arg)
{
    Request *r = arg;
    size_t len = size * nitems;
    const char *colon;
    size_t namelen;

    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0)
    {
        clear_captured(r);
        return len;
    }
    colon = memchr(data, ':', len);
    if (colon == NULL)
        return len;             /* the blank line that ends the header */
    namelen = (size_t) (colon - data);
    for (int i = 0; i < N_CAPTURED; i++)
    {
        if (strlen(captured_names[i]) == namelen &&
            strncasecmp(data, captured_names[i], namelen) == 0)
        {
            capture(&r->captured[i], data, namelen, colon + 1, data + len);
            break;
        }
    }
    return len;
}

/* The options every request of this handle shares, set once. */
static bool
request_init(Worker *w, Request *r)
{
    long connect_ms = opt.timeout_ms < CONNECT_TIMEOUT_MS ? opt.timeout_ms : CONNECT_TIMEOUT_MS;

    r->easy = curl_easy_init();
    if (r->easy == NULL)
    {
        log_error(w->num, "curl_easy_init failed");
        return false;
    }
    /* no signals: libcurl would otherwise use SIGALRM for DNS timeouts,
     * which is unsafe with threads */
    TRY_SETOPT(w, r->easy, CURLOPT_NOSIGNAL, 1L);
    TRY_SETOPT(w, r->easy, CURLOPT_TIMEOUT_MS, (long) opt.timeout_ms);
    TRY_SETOPT(w, r->easy, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    TRY_SETOPT(w, r->easy, CURLOPT_WRITEFUNCTION, discard_body);
    TRY_SETOPT(w, r->easy, CURLOPT_HEADERFUNCTION, on_header);
    TRY_SETOPT(w, r->easy, CURLOPT_HEADERDATA, r);
    TRY_SETOPT(w, r->easy, CURLOPT_PRIVATE, r);
    TRY_SETOPT(w, r->easy, CURLOPT_ERRORBUFFER, r->error);
    TRY_SETOPT(w, r->easy, CURLOPT_USERAGENT, USER_AGENT);
    /* a redirect is an answer (3xx, neutral), not a new destination */
    TRY_SETOPT(w, r->easy, CURLOPT_FOLLOWLOCATION, 0L);
    /* the endpoint comes from a table: http and https only, never file:// */
#if LIBCURL_VERSION_NUM >= 0x075500
    TRY_SETOPT(w, r->easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    TRY_SETOPT(w, r->easy, CURLOPT_PROTOCOLS, (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    return true;
}

static bool
add_header(Request *r, const char *line)
{
    struct curl_slist *l = curl_slist_append(r->headers, line);

    if (l == NULL)
        return false;
    r->headers = l;
    return true;
}

/* Set up the request for one claimed event and hand it to the multi handle. */
static bool
start_request(Worker *w, Request *r, int row)
{
    const PGresult *b = w->batch;
    const char *id = PQgetvalue(b, row, COL_ID);
    long attempt = strtol(PQgetvalue(b, row, COL_ATTEMPTS), NULL, 10) + 1;
    const char *body = PQgetvalue(b, row, COL_PAYLOAD);
    curl_off_t body_len = PQgetlength(b, row, COL_PAYLOAD);
    char line[64];
    CURLMcode mc;

    if (PQgetisnull(b, row, COL_PAYLOAD))
    {
        body = "null";
        body_len = 4;
    }
    r->row = row;
    r->result = CURLE_OK;
    r->status = 0;
    r->sent = true;
    r->error[0] = '\0';
    clear_captured(r);

    if (!add_header(r, "Content-Type: application/json"))
        goto no_memory;
    snprintf(line, sizeof(line), "X-Event-Id: %s", id);
    if (!add_header(r, line))
        goto no_memory;
    snprintf(line, sizeof(line), "X-Attempt: %ld", attempt);
    if (!add_header(r, line))
        goto no_memory;
    /* no "Expect: 100-continue" round trip before the body */
    if (!add_header(r, "Expect:"))
        goto no_memory;

    TRY_SETOPT(w, r->easy, CURLOPT_URL, PQgetvalue(b, row, COL_ENDPOINT));
    TRY_SETOPT(w, r->easy, CURLOPT_HTTPHEADER, r->headers);
    /* not copied: the body lives in the claim's PGresult until recorded */
    TRY_SETOPT(w, r->easy, CURLOPT_POSTFIELDSIZE_LARGE, body_len);
    TRY_SETOPT(w, r->easy, CURLOPT_POSTFIELDS, body);

    mc = curl_multi_add_handle(w->multi, r->easy);
    if (mc != CURLM_OK)
    {
        log_error(w->num, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
        return false;
    }
    r->active = true;
    r->sent_mono = now_s();
    if (claim_log != NULL)
    {
        pthread_mutex_lock(&claim_log_lock);
        if (fprintf(claim_log, "%s,%ld,%lld\n", id, attempt,
                    (long long) llround(w->claimed_mono * 1e6)) < 0)
            claim_log_failed = true;
        pthread_mutex_unlock(&claim_log_lock);
    }
    return true;

no_memory:
    log_error(w->num, "curl_slist_append: out of memory");
    return false;
}

/*
 * Did the request leave?  Not if curl could not resolve the host or connect
 * to it, nor if it timed out before writing a byte of the request (in the
 * connect).  In those cases the destination never saw it, so the attempt
 * must not count.  Any other outcome (an answer, a timeout after sending, a
 * reset) may have reached the destination.
 */
static bool
request_left(CURL *easy, CURLcode result)
{
    long request_bytes = -1;

    switch (result)
    {
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_CONNECT:
            return false;
        case CURLE_OPERATION_TIMEDOUT:
            return !(curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &request_bytes) == CURLE_OK &&
                     request_bytes == 0);
        default:
            return true;
    }
}

static void
finish_request(Worker *w, Request *r, CURLcode result)
{
    long status = 0;
    CURLMcode mc;

    r->result = result;
    r->sent = request_left(r->easy, result);
    if (curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK)
        status = 0;
    /*
     * A final status that arrived is the destination's answer, even if the
     * rest of the response was then cut off.  A 1xx alone is no answer.
     */
    if (!r->sent || (result != CURLE_OK && status < 200))
        status = 0;
    r->status = status;
    mc = curl_multi_remove_handle(w->multi, r->easy);
    if (mc != CURLM_OK)
        log_error(w->num, "curl_multi_remove_handle: %s", curl_multi_strerror(mc));
    r->active = false;
    r->done = true;
    curl_slist_free_all(r->headers);
    r->headers = NULL;
}

/* Finish the requests libcurl reports done. */
static void
collect_finished(Worker *w)
{
    CURLMsg *m;
    int left;

    while ((m = curl_multi_info_read(w->multi, &left)) != NULL)
    {
        char *p = NULL;

        if (m->msg != CURLMSG_DONE)
            continue;
        if (curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &p) != CURLE_OK || p == NULL)
        {
            log_error(w->num, "a finished transfer without its request");
            continue;
        }
        /* m is invalid once its handle is removed: pass its result on */
        finish_request(w, (Request *) p, m->data.result);
    }
}

/* At most one transport error line per worker per second, with a count of
 * those not shown: a destination that is down fails every request. */
static void
log_transport_error(Worker *w, const Request *r)
{
    double now = now_s();

    if (opt.quiet)
        return;
    if (now - w->transport_logged_at < 1.0)
    {
        w->transport_unlogged++;
        return;
    }
    log_info(w->num, "event %s to %s: %s (%s)%s",
             PQgetvalue(w->batch, r->row, COL_ID),
             PQgetvalue(w->batch, r->row, COL_ENDPOINT),
             r->error[0] ? r->error : curl_easy_strerror(r->result),
             !r->sent ? "not sent" : r->status ? "answered" : "no response",
             w->transport_unlogged ? " (and more, not shown)" : "");
    w->transport_logged_at = now;
    w->transport_unlogged = 0;
}

static int record_batch(Worker *w, int n, Stats *st);

/*
 * The requests of the batch to record next: every one done and not
 * recorded yet (throttled_only: if one of them is a 429).  Sets each
 * one's take; returns how many.
 */
static int
mark_take(Worker *w, int n, bool throttled_only)
{
    int taken = 0;
    bool throttled = false;

    for (int i = 0; i < n; i++)
    {
        Request *r = &w->requests[i];

        r->take = r->done && !r->recorded;
        taken += r->take;
        throttled |= r->take && r->status == 429;
    }
    if (throttled_only && !throttled)
    {
        for (int i = 0; i < n; i++)
            w->requests[i].take = false;
        return 0;
    }
    return taken;
}

/*
 * While the batch is in flight: record at once the answers back so far if
 * one is a 429 (see the header).  Its time counts as recording.  If it
 * fails, they are recorded with the rest of the batch.
 */
static void
record_throttled(Worker *w, int n, Stats *st)
{
    double t0;

    if (mark_take(w, n, true) == 0)
        return;
    t0 = now_s();
    if (record_batch(w, n, st) == 0)
        for (int i = 0; i < n; i++)
            w->requests[i].recorded |= w->requests[i].take;
    w->early_record_s += now_s() - t0;
}

/*
 * Deliver the claimed batch: all its requests at once on the worker's multi
 * handle, which keeps connections alive from one batch to the next.
 * Returns when every request has an outcome.
 */
static void
deliver(Worker *w, int n, Stats *st)
{
    int running = 0;

    for (int i = 0; i < n; i++)
    {
        Request *r = &w->requests[i];

        r->done = false;
        r->recorded = false;
        if (!start_request(w, r, i))
        {
            r->done = true;
            /* it never left: recorded as not sent */
            curl_slist_free_all(r->headers);
            r->headers = NULL;
            r->result = CURLE_FAILED_INIT;
            r->sent = false;
            r->status = 0;
        }
    }

    for (;;)
    {
        CURLMcode mc = curl_multi_perform(w->multi, &running);

        if (mc != CURLM_OK)
        {
            log_error(w->num, "curl_multi_perform: %s", curl_multi_strerror(mc));
            break;
        }
        collect_finished(w);
        if (running == 0)
            break;
        if (!opt.by_endpoint)
            record_throttled(w, n, st);
        mc = curl_multi_poll(w->multi, NULL, 0, 1000, NULL);
        if (mc != CURLM_OK)
        {
            log_error(w->num, "curl_multi_poll: %s", curl_multi_strerror(mc));
            break;
        }
    }

    for (int i = 0; i < n; i++)
    {
        Request *r = &w->requests[i];

        if (r->active)
        {
            /* only after a libcurl error above: whether it left is unknown,
             * so it counts as an attempt without an answer */
            finish_request(w, r, CURLE_SEND_ERROR);
            r->sent = true;
        }
        if (!r->sent)
            st->not_sent++;
        else if (r->status == 0)
            st->no_response++;
        else if (r->status >= 200 && r->status < 300)
            st->http_2xx++;
        else if (r->status == 429)
            st->http_429++;
        else if (r->status >= 500 && r->status < 600)
            st->http_5xx++;
        else
            st->http_other++;
        if (r->result != CURLE_OK)
            log_transport_error(w, r);
    }
}

/* ------------------------------------------------------------- record -- */

/* An event's Retry-After: the raw value received, or NULL. */
static const char *
retry_after_arg(Worker *w, const Request *r)
{
    const Captured *c = &r->captured[H_RETRY_AFTER];

    if (!c->present)
        return NULL;
    buf_reset(&w->text);
    append_latin1_as_utf8(&w->text, c->value.data, c->value.len);
    return w->text.data;
}

/* An event's headers, a JSON object: {"X-RateLimit-Remaining": "0", ...}
 * of the rate-limit fields received, or NULL when there were none. */
static const char *
headers_arg(Worker *w, const Request *r)
{
    bool any = false;

    buf_reset(&w->json);
    buf_putc(&w->json, '{');
    for (int i = 0; i < N_CAPTURED; i++)
    {
        const Captured *c = &r->captured[i];

        if (i == H_RETRY_AFTER || !c->present)
            continue;
        if (any)
            buf_append(&w->json, ", ", 2);
        append_json_string(&w->json, c->name, strlen(c->name));
        buf_append(&w->json, ": ", 2);
        append_json_string(&w->json, c->value.data, c->value.len);
        any = true;
    }
    buf_putc(&w->json, '}');
    return any ? w->json.data : NULL;
}

/*
 * An array literal, element by element: array_open, array_elem for each,
 * array_close.  Every element is NULL or double-quoted, with its double
 * quotes and backslashes escaped by a backslash, so any text goes in as
 * it is: a Retry-After value, a timestamp, a JSON object (whose own
 * backslashes, as in \u00e9, are escaped again here and arrive intact).
 */
static void
array_open(Buf *b)
{
    buf_reset(b);
    buf_putc(b, '{');
}

static void
array_elem(Buf *b, const char *value)
{
    if (b->len > 1)
        buf_putc(b, ',');
    if (value == NULL)
    {
        buf_append(b, "NULL", 4);
        return;
    }
    buf_putc(b, '"');
    for (const char *c = value; *c != '\0'; c++)
    {
        if (*c == '"' || *c == '\\')
            buf_putc(b, '\\');
        buf_putc(b, *c);
    }
    buf_putc(b, '"');
}

static const char *
array_close(Buf *b)
{
    buf_putc(b, '}');
    return b->data;
}

/*
 * --by-endpoint: a timestamp of the session (TimeZone UTC, DateStyle ISO:
 * "2026-01-02 03:04:05.678901+00") minus secs, in the same form, into out.
 * False if it does not parse.
 */
static bool
timestamp_minus(const char *ts, double secs, char *out, size_t outsize)
{
    struct tm tm = {0};
    double sec;
    int n = 0;
    double t;
    time_t whole;
    long micros;

    if (sscanf(ts, "%d-%d-%d %d:%d:%lf%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &sec, &n) != 6 || strncmp(ts + n, "+00", 3) != 0)
        return false;
    {
        /* days since 1970-01-01 of a proleptic Gregorian date (timegm is not POSIX) */
        long y = tm.tm_year - (tm.tm_mon <= 2);
        long era = (y >= 0 ? y : y - 399) / 400;
        long yoe = y - era * 400;
        long doy = (153 * (tm.tm_mon + (tm.tm_mon > 2 ? -3 : 9)) + 2) / 5 + tm.tm_mday - 1;
        long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        long days = era * 146097 + doe - 719468;

        t = (double) days * 86400.0 + tm.tm_hour * 3600.0 + tm.tm_min * 60.0 + sec - secs;
    }
    whole = (time_t) floor(t);
    micros = lround((t - (double) whole) * 1e6);
    if (micros >= 1000000)
    {
        whole++;
        micros -= 1000000;
    }
    gmtime_r(&whole, &tm);
    return snprintf(out, outsize, "%04d-%02d-%02d %02d:%02d:%02d.%06ld+00",
                    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                    tm.tm_min, tm.tm_sec, micros) < (int) outsize;
}

/*
 * The batch's answers into w->arrays (A_ID ... A_SENT_AT), each an array
 * literal with one element per event, in the claim's order.
 *
 * When each request left, on the database's clock: its lease ends
 * lease_seconds after the claim's transaction began, and the request left
 * (sent_mono - claimed_mono) after that.  By batch, A_SENT_AT holds how
 * long before its lease's end each request left, in seconds, and the
 * "record" statement subtracts it from the lease.  --by-endpoint passes
 * the times themselves (record_endpoint is a bare call, for Citus to route
 * to the endpoint's node), computed here from the leases, which its
 * session receives in UTC.
 */
static void
answer_arrays(Worker *w, int n)
{
    for (int a = 0; a < N_ANSWER_ARRAYS; a++)
        array_open(&w->arrays[a]);
    for (int i = 0; i < n; i++)
    {
        const Request *r = &w->requests[i];
        const char *lease;
        double before_end;
        char status[24], sent_at[64];

        if (!r->take)
            continue;
        lease = PQgetvalue(w->batch, r->row, COL_LEASE);
        before_end = opt.lease_seconds - (r->sent_mono - w->claimed_mono);
        snprintf(status, sizeof(status), "%ld", r->status);
        array_elem(&w->arrays[A_ID], PQgetvalue(w->batch, r->row, COL_ID));
        array_elem(&w->arrays[A_STATUS], r->status > 0 ? status : NULL);
        /* the lease this worker claimed it with: a later claim's is not ours */
        array_elem(&w->arrays[A_LEASE], lease);
        array_elem(&w->arrays[A_RETRY_AFTER], retry_after_arg(w, r));
        array_elem(&w->arrays[A_HEADERS], headers_arg(w, r));
        array_elem(&w->arrays[A_SENT], r->sent ? "true" : "false");
        if (opt.by_endpoint)
            array_elem(&w->arrays[A_SENT_AT],
                       timestamp_minus(lease, before_end, sent_at, sizeof(sent_at)) ?
                       sent_at : NULL);
        else
        {
            snprintf(sent_at, sizeof(sent_at), "%.6f", before_end);
            array_elem(&w->arrays[A_SENT_AT], sent_at);
        }
    }
    for (int a = 0; a < N_ANSWER_ARRAYS; a++)
        array_close(&w->arrays[a]);
}

/*
 * Check the result of a batch's record (record_deliveries or
 * record_endpoint: a row per event, its id and its outcome), count its
 * outcomes into *st, and clear it.  Returns 0 if the batch was recorded, 1
 * after a serialization failure or a deadlock (nothing changed; it may be
 * run again), -1 on any other error.  Errors are reported.
 */
static int
record_result(Worker *w, const char *what, PGresult *res, int n, Stats *st)
{
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != n || PQnfields(res) != 2)
    {
        int rc = retryable(res) ? 1 : -1;

        if (PQresultStatus(res) == PGRES_TUPLES_OK)
            log_error(w->num, "%s returned %d rows of %d columns, expected %d of 2",
                      what, PQntuples(res), PQnfields(res), n);
        else
            report_pg_error(w, what, res);
        PQclear(res);
        return PQstatus(w->conn) == CONNECTION_OK ? rc : -1;
    }
    for (int i = 0; i < n; i++)
        stats_add_outcome(st, PQgetisnull(res, i, 1) ? "(null)" : PQgetvalue(res, i, 1), 1);
    st->recorded += n;
    PQclear(res);
    return 0;
}

/*
 * Record a delivered batch with one record_deliveries call: one statement
 * in autocommit, so one transaction.  Returns as record_result.
 *
 * Lock order.  Every transaction takes event rows first, then buckets in
 * endpoint order; otherwise workers deadlock, and PostgreSQL notices only
 * after deadlock_timeout (1 s), stalling both.  A claim holds event-row
 * locks while it waits for bucket locks: its own events, and also events
 * other workers claimed since its snapshot (under READ COMMITTED, FOR
 * UPDATE SKIP LOCKED locks the newest version of a row it saw as pending,
 * and keeps that lock when the row turns out not to qualify).  A record
 * that held bucket A while it waited for such an event would deadlock with
 * a claim waiting for bucket A.  record_deliveries takes its locks in the
 * claim's order by itself: all the batch's events first, in id order, then
 * their buckets, each once, in endpoint order.
 */
static int
record_batch(Worker *w, int n, Stats *st)
{
    const char *values[N_ANSWER_ARRAYS];
    int taken = 0;

    for (int i = 0; i < n; i++)
        taken += w->requests[i].take;
    answer_arrays(w, n);
    for (int a = 0; a < N_ANSWER_ARRAYS; a++)
        values[a] = w->arrays[a].data;
    return record_result(w, "record_deliveries", run_prepared(w, "record", N_ANSWER_ARRAYS, values),
                         taken, st);
}

/* ------------------------------------------------------ by endpoint -- */

/*
 * --by-endpoint: the claim and the record of one endpoint at a time
 * (due_endpoints, claim_endpoint, record_endpoint; doc/claim.md), each a
 * bare statement in autocommit, as a distributed queue needs them (on
 * Citus each runs on the endpoint's node, doc/citus.md).  A pass walks the
 * endpoints due_endpoints listed, from a place of its own for each worker
 * (so that workers spread over them), claiming up to --per-endpoint events
 * of one endpoint per batch; a pass that claimed nothing ends in a sleep
 * of --poll-ms, or until a NOTIFY (which a distributed queue never sends).
 * claim_endpoint gives its endpoint's expired leases back by itself.
 */

/* Claim the next endpoint's events into w->batch: their number, 0 when a
 * whole pass found none (sleep), -1 on error. */
static int
claim_by_endpoint(Worker *w, Stats *st)
{
    char max[16], per[16], lease[32];

    snprintf(max, sizeof(max), "%d", opt.workers * 8 < 1000 ? opt.workers * 8 : 1000);
    snprintf(per, sizeof(per), "%d", opt.per_endpoint < opt.batch ? opt.per_endpoint : opt.batch);
    snprintf(lease, sizeof(lease), "%d seconds", opt.lease_seconds);
    PQclear(w->batch);
    w->batch = NULL;
    w->notified = false;
    while (!stop_requested())
    {
        const char *values[3];
        PGresult *res;
        int n;

        if (w->endpoints == NULL || w->pass_next >= PQntuples(w->endpoints))
        {
            bool idle = w->endpoints != NULL && w->pass_claimed == 0;
            const char *params[1] = {max};

            PQclear(w->endpoints);
            w->endpoints = NULL;
            if (idle)
                return 0;
            res = run_prepared(w, "due_endpoints", 1, params);
            if (PQresultStatus(res) != PGRES_TUPLES_OK || PQnfields(res) != 1)
            {
                report_pg_error(w, "due_endpoints", res);
                PQclear(res);
                return -1;
            }
            if (PQntuples(res) == 0)
            {
                PQclear(res);
                return 0;
            }
            w->endpoints = res;
            w->pass_start = w->num % PQntuples(res);
            w->pass_next = 0;
            w->pass_claimed = 0;
        }
        values[0] = PQgetvalue(w->endpoints,
                               (w->pass_start + w->pass_next) % PQntuples(w->endpoints), 0);
        values[1] = per;
        values[2] = lease;
        w->pass_next++;
        w->claimed_mono = now_s();
        res = run_prepared(w, "claim_endpoint", 3, values);
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
        {
            report_pg_error(w, "claim_endpoint", res);
            if (retryable(res))
            {
                PQclear(res);
                continue;       /* that endpoint again at the next pass */
            }
            PQclear(res);
            return -1;
        }
        n = PQntuples(res);
        if (PQnfields(res) != N_CLAIM_COLUMNS || n > w->nrequests)
        {
            log_error(w->num, "claim_endpoint returned %d rows of %d columns,"
                      " expected at most %d of %d", n, PQnfields(res), w->nrequests,
                      N_CLAIM_COLUMNS);
            PQclear(res);
            return -1;
        }
        st->claims++;
        if (n == 0)
        {
            PQclear(res);
            continue;
        }
        w->batch = res;
        w->pass_claimed += n;
        st->claims_nonempty++;
        st->claimed += n;
        return n;
    }
    return 0;
}

/* Record a batch of one endpoint with one record_endpoint, a bare call in
 * autocommit.  Returns as record_result. */
static int
record_endpoint_once(Worker *w, int n, Stats *st)
{
    const char *values[1 + N_ANSWER_ARRAYS];

    answer_arrays(w, n);
    values[0] = PQgetvalue(w->batch, 0, COL_ENDPOINT);
    for (int a = 0; a < N_ANSWER_ARRAYS; a++)
        values[1 + a] = w->arrays[a].data;
    return record_result(w, "record_endpoint",
                         run_prepared(w, "record_endpoint", 1 + N_ANSWER_ARRAYS, values), n, st);
}

static int
record(Worker *w, int n, Stats *st)
{
    int (*once)(Worker *, int, Stats *) = opt.by_endpoint ? record_endpoint_once : record_batch;
    int rc;
    int taken = mark_take(w, n, false);

    /* what a 429 did not record already (all of it, by endpoint) */
    if (taken == 0)
        return 0;
    rc = once(w, n, st);

    if (rc > 0)
    {
        log_error(w->num, "recording the batch again, once");
        rc = once(w, n, st);
    }
    if (rc != 0)
        log_error(w->num, "%d delivered event%s not recorded: delivered again"
                  " once the lease expires", taken, taken == 1 ? "" : "s");
    return rc == 0 ? 0 : -1;
}

/* -------------------------------------------------------------- claim -- */

/* Claim a batch into w->batch.  Returns its size, or -1 on error. */
static int
claim(Worker *w, Stats *st)
{
    char batch[16], per[16], lease[32];
    const char *values[3] = {batch, per, lease};
    PGresult *res;

    snprintf(batch, sizeof(batch), "%d", opt.batch);
    snprintf(per, sizeof(per), "%d", opt.per_endpoint);
    snprintf(lease, sizeof(lease), "%d seconds", opt.lease_seconds);

    PQclear(w->batch);
    w->batch = NULL;
    w->notified = false;        /* from now on, a NOTIFY may be news */
    for (int try = 0;; try++)
    {
        w->claimed_mono = now_s();
        res = run_prepared(w, "claim", 3, values);
        if (PQresultStatus(res) == PGRES_TUPLES_OK)
            break;
        if (try == 0 && retryable(res))
        {
            report_pg_error(w, "claim_events", res);
            log_error(w->num, "claiming again, once");
            PQclear(res);
            continue;
        }
        report_pg_error(w, "claim_events", res);
        PQclear(res);
        return -1;
    }
    if (PQnfields(res) != N_CLAIM_COLUMNS)
    {
        log_error(w->num, "claim_events returned %d columns, expected %d",
                  PQnfields(res), N_CLAIM_COLUMNS);
        PQclear(res);
        return -1;
    }
    if (PQntuples(res) > w->nrequests)
    {
        /* claim_events returns at most batch events */
        log_error(w->num, "claim_events returned %d events, more than the %d asked for",
                  PQntuples(res), w->nrequests);
        PQclear(res);
        return -1;
    }
    w->batch = res;
    st->claims++;
    if (PQntuples(res) > 0)
    {
        st->claims_nonempty++;
        st->claimed += PQntuples(res);
    }
    return PQntuples(res);
}

/*
 * requeue_expired() every REQUEUE_EVERY_MS, by whichever worker comes first
 * (compare-and-swap on the schedule), so it keeps running even if a worker
 * died.  A deadlock or serialization failure here is harmless: it runs again
 * at the next period.
 */
static int
maybe_requeue(Worker *w)
{
    long long now = now_ms();
    long long due = atomic_load(&next_requeue_ms);
    PGresult *failed = NULL;
    double n = 0;

    if (now < due ||
        !atomic_compare_exchange_strong(&next_requeue_ms, &due, now + REQUEUE_EVERY_MS))
        return 0;
    if (query_value(w, "requeue_expired", &n, &failed) < 0)
    {
        if (failed == NULL)
            return -1;
        report_pg_error(w, "requeue_expired", failed);
        if (retryable(failed))
        {
            PQclear(failed);
            return 0;
        }
        PQclear(failed);
        return -1;
    }
    if (n > 0)
        log_info(w->num, "requeue_expired() put back %.0f event%s whose lease expired",
                 n, n == 1 ? "" : "s");
    return 0;
}

/* -------------------------------------------------------------- sleep -- */

/*
 * Sleep until a NOTIFY arrives (no earlier than min_s: see worker_loop), or
 * for wait_s, or until a stop.  Returns 1 when woken by a NOTIFY, 0
 * otherwise, -1 if the connection was lost.
 */
static int
wait_for_work(Worker *w, double wait_s, double min_s)
{
    double start = now_s();
    double deadline = start + wait_s;
    double earliest = start + min_s;
    int sock = PQsocket(w->conn);

    if (sock < 0)
    {
        report_pg_error(w, "waiting", NULL);
        return -1;
    }
    for (;;)
    {
        double now = now_s();
        double until = w->notified ? fmin(earliest, deadline) : deadline;
        struct pollfd fds[2] = {
            {.fd = sock, .events = POLLIN},
            {.fd = stop_pipe[0], .events = POLLIN},
        };
        int rc;

        if (stop_requested())
            return 0;
        if (w->notified && now >= earliest)
            return 1;
        if (now >= deadline)
            return 0;
        rc = poll(fds, 2, (int) ceil((until - now) * 1000.0));
        if (rc < 0)
        {
            if (errno == EINTR)
                continue;
            log_error(w->num, "poll: %s", strerror(errno));
            return -1;
        }
        if (fds[0].revents != 0)
        {
            /* read what the server sent: notifications, or the end */
            if (!PQconsumeInput(w->conn))
            {
                report_pg_error(w, "waiting for notifications", NULL);
                return -1;
            }
            drain_notifies(w);
        }
    }
}

/* ------------------------------------------------------------- worker -- */

static bool
worker_init(Worker *w)
{
    int batch = opt.batch;
    CURLMcode mc;

    if (!worker_connect(w))
        return false;
    w->multi = curl_multi_init();
    if (w->multi == NULL)
    {
        log_error(w->num, "curl_multi_init failed");
        return false;
    }
    /* keep one idle connection per concurrent request for the next batch */
    mc = curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long) batch);
    if (mc != CURLM_OK)
    {
        log_error(w->num, "curl_multi_setopt: %s", curl_multi_strerror(mc));
        return false;
    }
    w->requests = calloc((size_t) batch, sizeof(Request));
    if (w->requests == NULL)
        out_of_memory();
    for (int i = 0; i < batch; i++)
    {
        w->nrequests = i + 1;
        if (!request_init(w, &w->requests[i]))
            return false;
    }
    log_info(w->num, "connected (backend pid %d)", PQbackendPID(w->conn));
    return true;
}

/*
 * The loop: claim, deliver, record; when there is nothing to claim, sleep
 * until next_due() or a NOTIFY.
 *
 * Never spin.  If next_due() says something is due already but the claim
 * keeps finding nothing (the due events are locked by other workers, or a
 * lease expired and waits for requeue_expired), or NOTIFYs keep waking the
 * worker for nothing, the shortest sleep doubles from 1 ms up to 1 s with
 * each such empty claim, and NOTIFYs wake the worker no sooner.  It goes
 * back to 1 ms after a claim that returns events, after a wake-up at a due
 * time next_due() gave (another worker was first: that is no spin, and
 * a worker that slept past due times would delay them, a whole token at
 * an endpoint with a bucket of one), or after an idle second.
 */
static int
worker_loop(Worker *w)
{
    Stats st = {0};
    double min_sleep = MIN_SLEEP;
    bool expected_work = false; /* the last wake-up promised something */

    while (!stop_requested())
    {
        double due = 0, left = 0;
        double sleep_s;
        int n, rc;

        double t0, t1, t2;

        /* (by endpoint, each claim gives its endpoint's expired leases back) */
        if (!opt.by_endpoint && maybe_requeue(w) < 0)
            goto failed;
        t0 = now_s();
        n = opt.by_endpoint ? claim_by_endpoint(w, &st) : claim(w, &st);
        if (n < 0)
            goto failed;
        t1 = now_s();
        st.claim_s += t1 - t0;
        if (n > 0)
        {
            w->early_record_s = 0.0;
            deliver(w, n, &st);
            t2 = now_s();
            st.deliver_s += t2 - t1 - w->early_record_s;
            rc = record(w, n, &st);
            st.record_s += now_s() - t2 + w->early_record_s;
            stats_flush(&st);
            if (rc < 0)
                goto failed;
            min_sleep = MIN_SLEEP;
            continue;
        }
        stats_flush(&st);

        /* nothing claimable */
        min_sleep = expected_work ? fmin(min_sleep * 2, MAX_SLEEP) : MIN_SLEEP;
        if (opt.until_empty)
        {
            /*
             * Left for this run: in flight, or due before --max-seconds
             * ends (events a spent quota holds until tomorrow are not).
             */
            char horizon[64];
            const char *params[1] = {NULL};

            if (opt.max_seconds > 0)
            {
                snprintf(horizon, sizeof(horizon), "%.3f",
                         fmax(0.0, start_time + opt.max_seconds - now_s()));
                params[0] = horizon;
            }
            if (query_value_with(w, "events_left", 1, params, &left, NULL) < 0)
                goto failed;
            if (left == 0)
            {
                request_stop("no events left");
                break;
            }
        }
        if (opt.by_endpoint)
        {
            /* no next_due (it reads every bucket in one statement): poll */
            if (wait_for_work(w, opt.poll_ms / 1000.0, 0) < 0)
                goto failed;
            continue;
        }
        rc = query_value(w, "next_due", &due, NULL);
        if (rc < 0)
            goto failed;
        if (rc == 0)            /* NULL: nothing pending */
            sleep_s = MAX_SLEEP;
        else if (due > min_sleep)   /* a due time ahead: wake up then */
            sleep_s = fmin(due, MAX_SLEEP);
        else
            sleep_s = min_sleep;
        /* due already (or about to be): an empty claim after it is a spin */
        expected_work = rc == 1 && due <= MIN_SLEEP;
        rc = wait_for_work(w, sleep_s, min_sleep);
        if (rc < 0)
            goto failed;
        if (rc > 0)
            expected_work = true;
    }
    return 0;

failed:
    stats_flush(&st);
    return -1;
}

static void
worker_cleanup(Worker *w)
{
    for (int i = 0; i < w->nrequests; i++)
    {
        Request *r = &w->requests[i];

        if (r->active)
            curl_multi_remove_handle(w->multi, r->easy);
        curl_easy_cleanup(r->easy);
        curl_slist_free_all(r->headers);
        for (int j = 0; j < N_CAPTURED; j++)
            buf_free(&r->captured[j].value);
    }
    free(w->requests);
    w->requests = NULL;
    if (w->multi != NULL)
    {
        CURLMcode mc = curl_multi_cleanup(w->multi);

        if (mc != CURLM_OK)
            log_error(w->num, "curl_multi_cleanup: %s", curl_multi_strerror(mc));
        w->multi = NULL;
    }
    PQclear(w->batch);
    w->batch = NULL;
    PQclear(w->endpoints);
    w->endpoints = NULL;
    for (int a = 0; a < N_ANSWER_ARRAYS; a++)
        buf_free(&w->arrays[a]);
    if (w->conn != NULL)
        PQfinish(w->conn);
    w->conn = NULL;
    buf_free(&w->json);
    buf_free(&w->text);
}

static void *
worker_main(void *arg)
{
    Worker *w = arg;

    w->failed = !worker_init(w) || worker_loop(w) < 0;
    if (w->failed)
        log_error(w->num, "stopped after an error");
    worker_cleanup(w);
    atomic_fetch_sub(&workers_running, 1);
    return NULL;
}

/* ---------------------------------------------------------------- main -- */

static void
print_progress(double *last_t, long long *last_recorded)
{
    Stats s;
    double t = now_s() - start_time;

    stats_snapshot(&s);
    log_info(-1, "%lld claimed, %lld recorded (%.0f/s); 2xx %lld, 429 %lld, 5xx %lld,"
             " other %lld, no response %lld, not sent %lld",
             s.claimed, s.recorded,
             t > *last_t ? (s.recorded - *last_recorded) / (t - *last_t) : 0.0,
             s.http_2xx, s.http_429, s.http_5xx, s.http_other,
             s.no_response, s.not_sent);
    *last_t = t;
    *last_recorded = s.recorded;
}

/*
 * The main thread, while the workers run: it takes SIGINT and SIGTERM
 * (blocked everywhere, so they queue for sigtimedwait), enforces
 * --max-seconds and prints progress.
 */
static void
supervise(const sigset_t *signals)
{
    double next_progress = start_time + PROGRESS_EVERY_S;
    double last_t = 0;
    long long last_recorded = 0;
    int received = 0;

    while (atomic_load(&workers_running) > 0)
    {
        struct timespec tick = {0, 100 * 1000 * 1000};
        int sig = sigtimedwait(signals, NULL, &tick);
        double now;

        if (sig > 0)
        {
            if (++received == 1)
                request_stop(sig == SIGINT ? "SIGINT" : "SIGTERM");
            else
            {
                log_error(-1, "second signal: exiting now; the events in flight"
                          " go back to the queue when their leases expire");
                _exit(128 + sig);
            }
        }
        else if (errno != EAGAIN && errno != EINTR)
            log_error(-1, "sigtimedwait: %s", strerror(errno));
        now = now_s();
        if (opt.max_seconds > 0 && now - start_time >= opt.max_seconds)
            request_stop("--max-seconds");
        if (!opt.quiet && now >= next_progress)
        {
            print_progress(&last_t, &last_recorded);
            next_progress += PROGRESS_EVERY_S;
        }
    }
}

static int
compare_outcomes(const void *a, const void *b)
{
    return strcmp(((const OutcomeCount *) a)->name, ((const OutcomeCount *) b)->name);
}

static void
print_summary(double elapsed, int failed)
{
    Stats s;

    stats_snapshot(&s);
    qsort(s.outcomes, (size_t) s.noutcomes, sizeof(s.outcomes[0]), compare_outcomes);
    printf("dispatcher: %d workers (%d failed), stopped by: %s\n",
           opt.workers, failed, stop_reason ? stop_reason : "worker errors");
    printf("  claims             %12lld  (%lld returned events)\n",
           s.claims, s.claims_nonempty);
    printf("  events claimed     %12lld\n", s.claimed);
    printf("  events recorded    %12lld\n", s.recorded);
    printf("  HTTP 2xx           %12lld\n", s.http_2xx);
    printf("  HTTP 429           %12lld\n", s.http_429);
    printf("  HTTP 5xx           %12lld\n", s.http_5xx);
    printf("  HTTP other         %12lld\n", s.http_other);
    printf("  no response        %12lld\n", s.no_response);
    printf("  not sent           %12lld\n", s.not_sent);
    for (int i = 0; i < s.noutcomes; i++)
        printf("  outcome %-10s %12lld\n", s.outcomes[i].name, s.outcomes[i].count);
    if (s.outcomes_other > 0)
        printf("  outcome (others)   %12lld\n", s.outcomes_other);
    printf("  worker seconds     %12.1f claiming, %.1f delivering, %.1f recording\n",
           s.claim_s, s.deliver_s, s.record_s);
    printf("  elapsed seconds    %12.2f\n", elapsed);
    printf("  events/s           %12.1f\n", elapsed > 0 ? s.recorded / elapsed : 0.0);
    fflush(stdout);
}

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: dispatcher --dsn DSN [--workers 4] [--batch 80]\n"
            "                  [--per-endpoint 10] [--lease-seconds 30] [--timeout-ms 5000]\n"
            "                  [--until-empty] [--max-seconds N] [--quiet]\n"
            "                  [--by-endpoint [--poll-ms 100]] [--claim-log FILE]\n"
            "Delivers the events of webhook_events (ratebucket_queue) over HTTP.\n");
}

static int
parse_int_option(const char *name, const char *s, long min, long max)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < min || v > max)
    {
        fprintf(stderr, "dispatcher: --%s must be an integer from %ld to %ld\n",
                name, min, max);
        exit(EXIT_USAGE);
    }
    return (int) v;
}

static void
parse_options(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"dsn", required_argument, NULL, 'd'},
        {"workers", required_argument, NULL, 'w'},
        {"batch", required_argument, NULL, 'b'},
        {"per-endpoint", required_argument, NULL, 'p'},
        {"lease-seconds", required_argument, NULL, 'l'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"until-empty", no_argument, NULL, 'u'},
        {"max-seconds", required_argument, NULL, 'm'},
        {"quiet", no_argument, NULL, 'q'},
        {"by-endpoint", no_argument, NULL, 'e'},
        {"poll-ms", required_argument, NULL, 'P'},
        {"claim-log", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}
    };
    int c;
    char *end;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1)
    {
        switch (c)
        {
            case 'd':
                opt.dsn = optarg;
                break;
            case 'w':
                opt.workers = parse_int_option("workers", optarg, 1, 256);
                break;
            case 'b':
                opt.batch = parse_int_option("batch", optarg, 1, MAX_BATCH);
                break;
            case 'p':
                opt.per_endpoint = parse_int_option("per-endpoint", optarg, 1, 1000);
                break;
            case 'l':
                opt.lease_seconds = parse_int_option("lease-seconds", optarg, 1, 86400);
                break;
            case 't':
                opt.timeout_ms = parse_int_option("timeout-ms", optarg, 1, 3600000);
                break;
            case 'u':
                opt.until_empty = true;
                break;
            case 'm':
                errno = 0;
                opt.max_seconds = strtod(optarg, &end);
                if (end == optarg || *end != '\0' || errno != 0 ||
                    !(opt.max_seconds > 0) || !isfinite(opt.max_seconds))
                {
                    fprintf(stderr, "dispatcher: --max-seconds must be a positive number\n");
                    exit(EXIT_USAGE);
                }
                break;
            case 'q':
                opt.quiet = true;
                break;
            case 'e':
                opt.by_endpoint = true;
                break;
            case 'P':
                opt.poll_ms = parse_int_option("poll-ms", optarg, 1, 60000);
                break;
            case 'c':
                opt.claim_log = optarg;
                break;
            case 'h':
                usage(stdout);
                exit(0);
            default:
                usage(stderr);
                exit(EXIT_USAGE);
        }
    }
    if (optind < argc || opt.dsn == NULL)
    {
        if (opt.dsn == NULL)
            fprintf(stderr, "dispatcher: --dsn is required ('' to use the PG* environment)\n");
        else
            fprintf(stderr, "dispatcher: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        exit(EXIT_USAGE);
    }
    /* the requests of a batch run concurrently: a batch lasts at most one
     * timeout, plus the claim and the record */
    if ((long) opt.lease_seconds * 1000 < (long) opt.timeout_ms + 1000)
    {
        fprintf(stderr, "dispatcher: --lease-seconds must outlast --timeout-ms by at least"
                " a second, or other workers could take events still being delivered\n");
        exit(EXIT_USAGE);
    }
}

int
main(int argc, char **argv)
{
    Worker *workers;
    sigset_t signals;
    struct sigaction ignore = {.sa_handler = SIG_IGN};
    CURLcode cc;
    int failed = 0;
    double elapsed;

    parse_options(argc, argv);

    if (!PQisthreadsafe())
    {
        fputs("dispatcher: this libpq is not thread-safe\n", stderr);
        return EXIT_FAILED;
    }
    /* once, before any thread: it is not thread-safe */
    cc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (cc != CURLE_OK)
    {
        fprintf(stderr, "dispatcher: curl_global_init: %s\n", curl_easy_strerror(cc));
        return EXIT_FAILED;
    }
    if (pipe(stop_pipe) != 0)
    {
        fprintf(stderr, "dispatcher: pipe: %s\n", strerror(errno));
        return EXIT_FAILED;
    }
    /* a destination or the server hanging up must not kill the process */
    if (sigaction(SIGPIPE, &ignore, NULL) != 0)
    {
        fprintf(stderr, "dispatcher: sigaction: %s\n", strerror(errno));
        return EXIT_FAILED;
    }
    /* block SIGINT and SIGTERM in every thread (they inherit the mask);
     * supervise() takes them with sigtimedwait */
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &signals, NULL) != 0)
    {
        fputs("dispatcher: pthread_sigmask failed\n", stderr);
        return EXIT_FAILED;
    }

    if (opt.claim_log != NULL && (claim_log = fopen(opt.claim_log, "w")) == NULL)
    {
        fprintf(stderr, "dispatcher: cannot write %s: %s\n", opt.claim_log, strerror(errno));
        return EXIT_FAILED;
    }

    workers = calloc((size_t) opt.workers, sizeof(Worker));
    if (workers == NULL)
        out_of_memory();
    start_time = now_s();
    atomic_store(&workers_running, opt.workers);
    for (int i = 0; i < opt.workers; i++)
    {
        int rc;

        workers[i].num = i;
        workers[i].transport_logged_at = -1e9;
        rc = pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]);
        if (rc != 0)
        {
            log_error(i, "could not start: %s", strerror(rc));
            workers[i].failed = true;
            atomic_fetch_sub(&workers_running, 1);
            request_stop("a worker could not start");
            continue;
        }
        workers[i].started = true;
    }

    supervise(&signals);

    for (int i = 0; i < opt.workers; i++)
    {
        if (workers[i].started)
            pthread_join(workers[i].thread, NULL);
        if (workers[i].failed)
            failed++;
    }
    elapsed = now_s() - start_time;
    print_summary(elapsed, failed);
    if (claim_log != NULL && (fclose(claim_log) != 0 || claim_log_failed))
    {
        fprintf(stderr, "dispatcher: could not write %s\n", opt.claim_log);
        failed++;
    }

    free(workers);
    close(stop_pipe[0]);
    close(stop_pipe[1]);
    curl_global_cleanup();
    return failed > 0 ? EXIT_FAILED : 0;
}
