/*
 * demo/simulator.c — a destination simulator for webhook delivery.
 *
 * An HTTP server on 127.0.0.1 that plays many webhook destinations at once.
 * Each destination ("endpoint") enforces its own true rate limit with its
 * own token bucket, kept here in memory: the simulator knows nothing of
 * ratebucket or PostgreSQL.  A dispatcher POSTs events to it; the demo and
 * the tests read its request log to see what each destination really saw.
 *
 * Build and run:
 *
 *   make -C demo simulator
 *   demo/simulator --port 8080 --config endpoints.conf --log requests.csv \
 *                  [--seed N] [--ready-file FILE]
 *
 *   curl -i -X POST -H 'X-Event-Id: 1' -H 'X-Attempt: 1' -d '{}' \
 *        http://127.0.0.1:8080/ep01
 *   curl http://127.0.0.1:8080/_stats
 *
 * --port        the main port, on 127.0.0.1 only.  If a port is taken the
 *               simulator exits with status 2.
 * --config      the endpoints (below).  A bad config exits with status 2.
 * --log         the request log, created or truncated (below).
 * --seed        seed of the failure draws of fail=P (default 1).
 * --ready-file  written once every listener that should be up at start is
 *               listening, three lines: the pid, then the moment t_us 0
 *               of the log stands for (the start) on two clocks, so that
 *               other clocks can be put on the log's axis: the wall clock
 *               (CLOCK_REALTIME, microseconds since the Unix epoch) and
 *               CLOCK_MONOTONIC (microseconds, the clock the log counts
 *               on, which other processes of this machine share); removed
 *               at exit.
 * It runs until SIGTERM or SIGINT, then closes its listeners and their
 * connections (waiting for requests being handled; an answer still held by
 * delay_ms is logged but may not reach the client), flushes the log and
 * exits 0.  Exit status 2: bad command line or config, or a port taken;
 * 1: any other failure (the log could not be written, ...).
 *
 * Config: one endpoint a line, a name ([A-Za-z0-9_.-], at most 64) then
 * key=value options; '#' starts a comment.
 *
 *   ep01 rate=50  burst=50  mode=seconds
 *   ep02 rate=20  burst=10  mode=date
 *   ep03 rate=5   burst=5   mode=ratelimit
 *   ep04 rate=100 burst=100 fail=0.15
 *   ep05 rate=30  burst=30  delay_ms=400
 *   ep06 rate=40  burst=40  down=0-10 port=8081
 *   ep07 rate=40  burst=20  change=18:0.5,36:1
 *   ep08 rate=25  burst=10  mode=bare
 *   ep09 rate=6   burst=60  window=sliding:10 mode=bare
 *   ep10 rate=10  burst=100 window=fixed:10
 *
 *   rate=R       requests per second the bucket refills, required
 *                (a number, 1e-6 to 1e9)
 *   burst=B      bucket size, required (a number, 1 to 1e12); the bucket
 *                starts full.  A 429 spends nothing.
 *   mode=M       how a 429 says when to come back (default seconds):
 *                  seconds    Retry-After: N
 *                  date       Retry-After: <IMF-fixdate of now + N,
 *                             rounded up to the next whole second>
 *                  ratelimit  RateLimit: limit=<B>, remaining=0, reset=<N>
 *                             RateLimit-Policy: <B>;w=<W>
 *                             and on 2xx: RateLimit: limit=<B>,
 *                             remaining=<tokens left>, reset=<s until full>
 *                             RateLimit-Policy: <B>;w=<W>
 *                             The policy q;w=W means q requests per W
 *                             seconds, in bursts of q: the true limit, so
 *                             B must be a whole number and W = B/R a whole
 *                             number of seconds >= 1 (R=30 B=30: 30;w=1),
 *                             else the config is refused
 *                  bare       nothing: a 429 with no Retry-After and no
 *                             rate-limit field (nor any on 2xx)
 *                N = max(1, ceil(seconds until the bucket holds a token, at
 *                the rate of the moment)); <B> and <R> are the burst and the
 *                rate of the moment (see change=)
 *   window=K:W   not a token bucket but a window of W seconds (a whole
 *                number, 1 to 3600) that admits burst= requests (a whole
 *                number, at most 1e6), and rate= must be burst / W:
 *                  sliding    at most burst requests in any W seconds
 *                  fixed      at most burst requests in each W seconds
 *                             of the wall clock (windows start at the
 *                             multiples of W since the Unix epoch)
 *                Every request counts, the refused ones too: a sender that
 *                keeps knocking keeps the window full.  N for the 429's
 *                headers is the time until the window admits again (at
 *                least 1).  Not with mode=ratelimit nor change=.
 *   fail=P       of the requests the bucket admits (they spend a token), a
 *                fraction P answers 503 (no Retry-After) or 500, alternately;
 *                drawn from a per-endpoint generator seeded by --seed
 *   delay_ms=D   every answer of this endpoint leaves D ms after the request
 *                was admitted or refused (other endpoints are not slowed)
 *   port=P2      serve this endpoint on its own listener 127.0.0.1:P2 (and
 *                only there: on the main port it is 404, as are the other
 *                endpoints on P2)
 *   down=A-B     with port=: P2 refuses connections from t=A to t=B seconds
 *                (A may be 0: closed at start, opened at B; with A > 0 the
 *                connections open at A are dropped).  The port stays bound
 *                meanwhile, so that nothing else takes it.  A taken port=
 *                is reported at start like the main port.
 *   change=T1:F1[,T2:F2...]
 *                the limit changes during the run: from T seconds after the
 *                start on, the rate and the burst are F times rate= and
 *                burst= (F > 0; T increasing; at most 16 steps; each F x
 *                rate and F x burst within the bounds above).  The bucket is
 *                refilled up to T at the old rate, then holds at most the
 *                new burst (a larger burst fills at the new rate from
 *                there).  With mode=ratelimit, W stays B/R and F x B must
 *                be a whole number.  change=18:0.5,36:1: half the limit
 *                from 18 s to 36 s, the configured one before and after.
 *
 * Requests: the path's first segment names the endpoint (/ep01; /ep01/x is
 * ep01 too); any method; the body is read and discarded.  Unknown names
 * answer 404.  /_stats on the main port answers JSON, not logged:
 *   {"uptime_s": 12.345, "not_found": 0, "endpoints": {"ep01": {"requests":
 *    n, "ok": n, "throttled": n, "failed": n}, ...}}
 * (requests = ok + throttled + failed; 404s are only in not_found).
 *
 * Log: one CSV line per request received and decided (404 and 429
 * included), written before the answer is sent; no header line:
 *
 *   t_us,endpoint,event_id,attempt,status
 *
 * t_us is microseconds from the simulator's start (CLOCK_MONOTONIC) to the
 * moment the limiter admitted or refused the request; event_id and attempt
 * are the X-Event-Id and X-Attempt headers (empty if missing or not an
 * integer); for a 404 the endpoint is the path's first segment (at most 64
 * characters) with any character outside [A-Za-z0-9_.-] replaced by '?',
 * or '?' if empty.  Lines of one endpoint are in t_us order.  The log is flushed every 200 ms, every 1000 lines, and
 * at exit.
 *
 * Threading: libmicrohttpd runs one thread per connection, so a slow
 * endpoint's sleep holds only its own connection.  Each bucket has a mutex;
 * the log has one.  The main thread only waits for signals and, every 10 ms,
 * opens or closes the down= listeners and flushes the log.
 */

#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <microhttpd.h>

#define EXIT_USAGE 2            /* bad command line, bad config, port taken */
#define MAX_NAME 64             /* longest endpoint name */
#define MIN_RATE 1e-6           /* these bounds keep every header value */
#define MAX_RATE 1e9            /* (seconds, counts) well inside int64 */
#define MAX_BURST 1e12
#define TICK_MS 10              /* main loop period */
#define FLUSH_EVERY_MS 200      /* log flush period */
#define FLUSH_EVERY_LINES 1000  /* ... or this many lines, whichever first */
#define CONNECTION_LIMIT 1000   /* per listener */
#define IDLE_TIMEOUT_S 300      /* idle keep-alive connections closed after */
#define MAX_CHANGES 16          /* steps of one change= schedule */

/* ------------------------------------------------------------ types -- */

enum retry_mode
{
    MODE_SECONDS,               /* Retry-After: N */
    MODE_DATE,                  /* Retry-After: <IMF-fixdate> */
    MODE_RATELIMIT,             /* RateLimit and RateLimit-Policy */
    MODE_BARE                   /* no field at all */
};

enum limiter_kind
{
    LIMIT_BUCKET,               /* a token bucket: rate=, burst= */
    LIMIT_SLIDING,              /* burst= requests in any window_s seconds */
    LIMIT_FIXED                 /* burst= requests per window_s of the wall clock */
};

/* One step of a change= schedule: from at_s on, the limit is factor x the
 * configured one. */
struct change
{
    double at_s;                /* seconds since start */
    double factor;
};

struct endpoint
{
    /* configuration: set before any thread starts, read-only after */
    char name[MAX_NAME + 1];
    int line;                   /* in the config file, for messages */
    double rate;                /* tokens per second, as configured */
    double burst;               /* bucket size, as configured */
    enum retry_mode mode;
    long long window_s;         /* mode=ratelimit: burst / rate, whole seconds;
                                 * window=: its length */
    enum limiter_kind kind;     /* window=, else LIMIT_BUCKET */
    struct change changes[MAX_CHANGES]; /* change=, in time order */
    int n_changes;
    double fail_p;              /* fraction of admitted requests that fail */
    unsigned delay_ms;
    int port;                   /* own listener's port, 0: the main port */
    bool has_down;
    double down_from, down_until;   /* seconds since start */

    /* state, guarded by lock */
    pthread_mutex_t lock;
    double cur_rate, cur_burst; /* the limit now: configured x the last change */
    int next_change;            /* changes[] not yet applied start here */
    double tokens;
    int64_t refilled_ns;        /* when tokens was last brought up to date */
    uint64_t rng;               /* splitmix64 state */
    int64_t *arrivals;          /* window=sliding: the last burst= requests'
                                 * times (ns since start), a ring */
    long n_arrivals;            /* how many it holds (at most burst=) */
    long next_arrival;          /* where the next one goes: the oldest */
    int64_t window_no;          /* window=fixed: the window counted */
    long window_count;          /* requests counted in it */
    uint64_t failures;          /* failed answers so far: 503, 500, 503, ... */
    uint64_t n_requests, n_ok, n_throttled, n_failed;
};

/* The request log: a buffered FILE * behind a mutex. */
struct request_log
{
    pthread_mutex_t lock;
    FILE *f;                    /* guarded by lock */
    unsigned unflushed;         /* lines since the last flush; guarded */
    bool write_error;           /* guarded */
    uint64_t n_not_found;       /* 404 answers; guarded */
};

struct simulator;

/*
 * One listening port: the main port (serves == NULL) or the own port of one
 * endpoint.  Opened and closed by the main thread only; the handler threads
 * read sim and serves, which never change.
 */
struct listener
{
    struct simulator *sim;
    struct endpoint *serves;    /* NULL: every endpoint without port= */
    int port;
    int fd;                     /* our socket while not serving, else -1 */
    struct MHD_Daemon *daemon;  /* non-NULL while serving */
    bool reported_failure;      /* a failure to reopen was printed */
};

/* Bodies shared by every request: created at start, read-only after. */
struct canned
{
    struct MHD_Response *ok, *not_found, *error500, *error503;
};

struct simulator
{
    int64_t t0_ns;              /* CLOCK_MONOTONIC at start */
    int64_t t0_wall_us;         /* CLOCK_REALTIME at start, microseconds */
    uint64_t seed;
    struct endpoint *endpoints; /* config order */
    size_t n_endpoints;
    struct endpoint **by_name;  /* sorted by name, for bsearch */
    struct listener *listeners;
    size_t n_listeners;
    struct request_log log;
    struct canned canned;
};

/* What the limiter decided for one request. */
struct verdict
{
    unsigned status;
    int64_t retry_s;            /* 429: N, seconds until a token */
    int64_t remaining;          /* 2xx: whole tokens left */
    int64_t reset_s;            /* 2xx: seconds until the bucket is full */
    long long limit;            /* the burst at that moment, whole requests */
};

struct options
{
    int port;
    const char *config_path;
    const char *log_path;
    const char *ready_path;
    uint64_t seed;
};

/* ---------------------------------------------------------- helpers -- */

static void
fail_exit(int status, const char *fmt, ...)
{
    va_list ap;

    fputs("simulator: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

static void *
xcalloc(size_t n, size_t size)
{
    void *p = calloc(n == 0 ? 1 : n, size);

    if (p == NULL)
        fail_exit(EXIT_FAILURE, "out of memory");
    return p;
}

static int64_t
monotonic_ns(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        fail_exit(EXIT_FAILURE, "clock_gettime: %s", strerror(errno));
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t
wall_clock_us(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        fail_exit(EXIT_FAILURE, "clock_gettime: %s", strerror(errno));
    return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t
since_start_ns(const struct simulator *sim)
{
    return monotonic_ns() - sim->t0_ns;
}

static void
sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void
lock(pthread_mutex_t *m)
{
    int rc = pthread_mutex_lock(m);

    if (rc != 0)
        fail_exit(EXIT_FAILURE, "pthread_mutex_lock: %s", strerror(rc));
}

static void
unlock(pthread_mutex_t *m)
{
    int rc = pthread_mutex_unlock(m);

    if (rc != 0)
        fail_exit(EXIT_FAILURE, "pthread_mutex_unlock: %s", strerror(rc));
}

static void
init_mutex(pthread_mutex_t *m)
{
    int rc = pthread_mutex_init(m, NULL);

    if (rc != 0)
        fail_exit(EXIT_FAILURE, "pthread_mutex_init: %s", strerror(rc));
}

/* splitmix64: small, fast, and good enough for failure draws. */
static uint64_t
splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));

    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* A uniform double in [0, 1). */
static double
random_unit(uint64_t *state)
{
    return (double) (splitmix64(state) >> 11) * 0x1.0p-53;
}

/* FNV-1a, to give each endpoint its own failure sequence. */
static uint64_t
hash_name(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);

    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char) *s) * UINT64_C(0x100000001b3);
    return h;
}

static bool
is_name_char(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
        (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

/* An integer header value as logged: [-]digits, at most 20 digits. */
static bool
is_integer_text(const char *s)
{
    size_t n = 0;

    if (s == NULL)
        return false;
    if (*s == '-')
        s++;
    for (; s[n] != '\0'; n++)
        if (s[n] < '0' || s[n] > '9')
            return false;
    return n >= 1 && n <= 20;
}

/* ----------------------------------------------------------- config -- */

static bool
parse_double(const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool
parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* "A-B", two seconds values, 0 <= A < B. */
static bool
parse_window(const char *s, double *from, double *until)
{
    char buf[64];
    char *dash;

    if (strlen(s) >= sizeof(buf))
        return false;
    strcpy(buf, s);
    dash = strchr(buf, '-');
    if (dash == NULL)
        return false;
    *dash = '\0';
    return parse_double(buf, from) && parse_double(dash + 1, until) &&
        *from >= 0 && *until > *from;
}

/*
 * "T1:F1,T2:F2,...": at most MAX_CHANGES steps, 0 <= T1 < T2 < ..., each
 * F > 0.  Whether F x rate and F x burst are valid limits is checked once
 * the whole line is read.
 */
static bool
parse_changes(const char *s, struct endpoint *ep)
{
    char buf[512];
    char *save, *item;

    if (strlen(s) >= sizeof(buf))
        return false;
    strcpy(buf, s);
    ep->n_changes = 0;
    for (item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save))
    {
        char *colon = strchr(item, ':');
        struct change c;

        if (colon == NULL || ep->n_changes == MAX_CHANGES)
            return false;
        *colon = '\0';
        if (!parse_double(item, &c.at_s) || !parse_double(colon + 1, &c.factor) ||
            c.at_s < 0 || c.factor <= 0)
            return false;
        if (ep->n_changes > 0 && c.at_s <= ep->changes[ep->n_changes - 1].at_s)
            return false;
        ep->changes[ep->n_changes++] = c;
    }
    return ep->n_changes > 0;
}

static void
config_error(const char *path, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "simulator: %s:%d: ", path, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_USAGE);
}

/* Apply one key=value to an endpoint; exits on error. */
static void
apply_option(struct endpoint *ep, const char *key, const char *value,
             const char *path, int line)
{
    long l;

    if (strcmp(key, "rate") == 0)
    {
        if (!parse_double(value, &ep->rate) || ep->rate < MIN_RATE || ep->rate > MAX_RATE)
            config_error(path, line, "rate must be a number in [%g, %g], not '%s'",
                         MIN_RATE, MAX_RATE, value);
    }
    else if (strcmp(key, "burst") == 0)
    {
        if (!parse_double(value, &ep->burst) || ep->burst < 1 || ep->burst > MAX_BURST)
            config_error(path, line, "burst must be a number in [1, %g], not '%s'",
                         MAX_BURST, value);
    }
    else if (strcmp(key, "mode") == 0)
    {
        if (strcmp(value, "seconds") == 0)
            ep->mode = MODE_SECONDS;
        else if (strcmp(value, "date") == 0)
            ep->mode = MODE_DATE;
        else if (strcmp(value, "ratelimit") == 0)
            ep->mode = MODE_RATELIMIT;
        else if (strcmp(value, "bare") == 0)
            ep->mode = MODE_BARE;
        else
            config_error(path, line, "mode must be seconds, date, ratelimit or bare, not '%s'",
                         value);
    }
    else if (strcmp(key, "window") == 0)
    {
        const char *colon = strchr(value, ':');

        if (colon != NULL && strncmp(value, "sliding:", 8) == 0)
            ep->kind = LIMIT_SLIDING;
        else if (colon != NULL && strncmp(value, "fixed:", 6) == 0)
            ep->kind = LIMIT_FIXED;
        if (ep->kind == LIMIT_BUCKET || !parse_long(colon + 1, 1, 3600, &l))
            config_error(path, line, "window must be sliding:W or fixed:W, W whole seconds "
                         "1..3600, not '%s'", value);
        ep->window_s = l;
    }
    else if (strcmp(key, "fail") == 0)
    {
        if (!parse_double(value, &ep->fail_p) || ep->fail_p < 0 || ep->fail_p > 1)
            config_error(path, line, "fail must be a fraction in [0, 1], not '%s'", value);
    }
    else if (strcmp(key, "delay_ms") == 0)
    {
        if (!parse_long(value, 0, 600000, &l))
            config_error(path, line, "delay_ms must be an integer 0..600000, not '%s'", value);
        ep->delay_ms = (unsigned) l;
    }
    else if (strcmp(key, "port") == 0)
    {
        if (!parse_long(value, 1, 65535, &l))
            config_error(path, line, "port must be 1..65535, not '%s'", value);
        ep->port = (int) l;
    }
    else if (strcmp(key, "down") == 0)
    {
        if (!parse_window(value, &ep->down_from, &ep->down_until))
            config_error(path, line, "down must be A-B seconds with 0 <= A < B, not '%s'", value);
        ep->has_down = true;
    }
    else if (strcmp(key, "change") == 0)
    {
        if (!parse_changes(value, ep))
            config_error(path, line, "change must be T:F[,T:F...] (at most %d, 0 <= T "
                         "increasing, F > 0), not '%s'", MAX_CHANGES, value);
    }
    else
        config_error(path, line, "unknown key '%s' (known: rate burst mode window fail "
                     "delay_ms down port change)", key);
}

/* Is x a whole number (to a relative 1e-9, for values read as decimals)? */
static bool
is_whole(double x)
{
    return fabs(x - round(x)) <= 1e-9 * fmax(1, fabs(x));
}

/*
 * mode=ratelimit publishes RateLimit-Policy: <B>;w=<W>, which means a rate
 * of B/W and a burst of B: the burst must be a whole number of requests and
 * burst / rate a whole number W >= 1 of seconds, at every step of change=
 * too (a change scales rate and burst alike, so W stays; B x F must stay
 * whole).  Sets ep->window_s; exits with status 2 otherwise.
 */
static void
check_policy(struct endpoint *ep, const char *path, int line)
{
    double w = ep->burst / ep->rate;

    if (!is_whole(ep->burst))
        config_error(path, line, "mode=ratelimit: burst must be a whole number, not %g",
                     ep->burst);
    if (!is_whole(w) || round(w) < 1)
        config_error(path, line, "mode=ratelimit: burst / rate must be a whole number of "
                     "seconds >= 1 (its policy is <burst>;w=<burst / rate>), not %g / %g = %g",
                     ep->burst, ep->rate, w);
    ep->window_s = (long long) round(w);
    for (int i = 0; i < ep->n_changes; i++)
        if (!is_whole(ep->changes[i].factor * ep->burst))
            config_error(path, line, "mode=ratelimit: change at %g s makes the burst %g, "
                         "not a whole number", ep->changes[i].at_s,
                         ep->changes[i].factor * ep->burst);
}

/*
 * window=: burst= whole (the count a window admits) and rate= its mean,
 * burst / W; no RateLimit fields to publish, no change= of the limit.
 */
static void
check_window(struct endpoint *ep, const char *path, int line)
{
    if (!is_whole(ep->burst) || ep->burst > 1e6)
        config_error(path, line, "window=: burst must be a whole number of requests up to "
                     "1e6, not %g", ep->burst);
    if (fabs(ep->rate * (double) ep->window_s - ep->burst) > 1e-9 * ep->burst)
        config_error(path, line, "window=: rate must be burst / W = %g, not %g",
                     ep->burst / (double) ep->window_s, ep->rate);
    if (ep->mode == MODE_RATELIMIT)
        config_error(path, line, "window= does not go with mode=ratelimit");
    if (ep->n_changes > 0)
        config_error(path, line, "window= does not go with change=");
}

/* Parse the rest of a config line (after the name, strtok_r state in save). */
static void
parse_endpoint_options(struct endpoint *ep, char **save, const char *path, int line)
{
    static const char *const keys[] = {"rate", "burst", "mode", "window", "fail", "delay_ms",
                                       "down", "port", "change"};
    bool seen[sizeof(keys) / sizeof(keys[0])] = {false};
    char *tok;

    while ((tok = strtok_r(NULL, " \t\r\n", save)) != NULL)
    {
        char *eq = strchr(tok, '=');
        size_t i;

        if (eq == NULL || eq == tok)
            config_error(path, line, "expected key=value, not '%s'", tok);
        *eq = '\0';
        for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (strcmp(tok, keys[i]) == 0)
            {
                if (seen[i])
                    config_error(path, line, "%s given twice", tok);
                seen[i] = true;
            }
        apply_option(ep, tok, eq + 1, path, line);
    }
    if (ep->rate == 0)
        config_error(path, line, "rate= is required");
    if (ep->burst == 0)
        config_error(path, line, "burst= is required");
    if (ep->has_down && ep->port == 0)
        config_error(path, line, "down= needs port=: a down endpoint has its own listener");
    for (int i = 0; i < ep->n_changes; i++)
    {
        double f = ep->changes[i].factor;

        if (f * ep->rate < MIN_RATE || f * ep->rate > MAX_RATE ||
            f * ep->burst < 1 || f * ep->burst > MAX_BURST)
            config_error(path, line, "change at %g s: rate %g and burst %g are out of bounds",
                         ep->changes[i].at_s, f * ep->rate, f * ep->burst);
    }
    if (ep->kind != LIMIT_BUCKET)
        check_window(ep, path, line);
    else if (ep->mode == MODE_RATELIMIT)
        check_policy(ep, path, line);
}

static struct endpoint *
find_by_name(struct endpoint *eps, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(eps[i].name, name) == 0)
            return &eps[i];
    return NULL;
}

/* Read the config file into sim->endpoints; exits with status 2 on error. */
static void
load_config(struct simulator *sim, const char *path, int main_port)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t cap = 0, alloc = 0;
    int line = 0;

    if (f == NULL)
        fail_exit(EXIT_USAGE, "cannot open config %s: %s", path, strerror(errno));
    while (getline(&buf, &cap, f) != -1)
    {
        char *save, *name, *hash;
        struct endpoint *ep;

        line++;
        if ((hash = strchr(buf, '#')) != NULL)
            *hash = '\0';
        name = strtok_r(buf, " \t\r\n", &save);
        if (name == NULL)
            continue;           /* blank or comment */

        if (strlen(name) > MAX_NAME)
            config_error(path, line, "name longer than %d characters", MAX_NAME);
        for (const char *c = name; *c != '\0'; c++)
            if (!is_name_char((unsigned char) *c))
                config_error(path, line, "name '%s': only A-Z a-z 0-9 _ . - allowed", name);
        if (strcmp(name, "_stats") == 0)
            config_error(path, line, "the name _stats is reserved");
        if (find_by_name(sim->endpoints, sim->n_endpoints, name) != NULL)
            config_error(path, line, "duplicate endpoint '%s'", name);

        if (sim->n_endpoints == alloc)
        {
            alloc = alloc == 0 ? 16 : 2 * alloc;
            sim->endpoints = realloc(sim->endpoints, alloc * sizeof(*sim->endpoints));
            if (sim->endpoints == NULL)
                fail_exit(EXIT_FAILURE, "out of memory");
        }
        ep = &sim->endpoints[sim->n_endpoints++];
        memset(ep, 0, sizeof(*ep));
        strcpy(ep->name, name);
        ep->line = line;
        ep->mode = MODE_SECONDS;
        parse_endpoint_options(ep, &save, path, line);
    }
    if (ferror(f))
        fail_exit(EXIT_USAGE, "cannot read config %s: %s", path, strerror(errno));
    free(buf);
    fclose(f);

    if (sim->n_endpoints == 0)
        fail_exit(EXIT_USAGE, "%s: no endpoints", path);
    for (size_t i = 0; i < sim->n_endpoints; i++)
    {
        struct endpoint *ep = &sim->endpoints[i];

        if (ep->port == 0)
            continue;
        if (ep->port == main_port)
            config_error(path, ep->line, "port=%d is the main port", ep->port);
        for (size_t j = 0; j < i; j++)
            if (sim->endpoints[j].port == ep->port)
                config_error(path, ep->line, "port=%d already used by %s (line %d)",
                             ep->port, sim->endpoints[j].name, sim->endpoints[j].line);
    }
}

static int
compare_names(const void *a, const void *b)
{
    const struct endpoint *const *x = a;
    const struct endpoint *const *y = b;

    return strcmp((*x)->name, (*y)->name);
}

static int
compare_key_name(const void *key, const void *elem)
{
    const struct endpoint *const *e = elem;

    return strcmp(key, (*e)->name);
}

/* Fill the buckets, seed the generators, build the name index. */
static void
init_endpoints(struct simulator *sim)
{
    sim->by_name = xcalloc(sim->n_endpoints, sizeof(*sim->by_name));
    for (size_t i = 0; i < sim->n_endpoints; i++)
    {
        struct endpoint *ep = &sim->endpoints[i];

        init_mutex(&ep->lock);
        ep->cur_rate = ep->rate;
        ep->cur_burst = ep->burst;
        ep->next_change = 0;
        ep->tokens = ep->burst;
        ep->refilled_ns = 0;
        ep->rng = sim->seed ^ hash_name(ep->name);
        if (ep->kind == LIMIT_SLIDING)
            ep->arrivals = xcalloc((size_t) llround(ep->burst), sizeof(*ep->arrivals));
        ep->window_no = -1;
        sim->by_name[i] = ep;
    }
    qsort(sim->by_name, sim->n_endpoints, sizeof(*sim->by_name), compare_names);
}

static struct endpoint *
lookup_endpoint(const struct simulator *sim, const char *name)
{
    struct endpoint **hit = bsearch(name, sim->by_name, sim->n_endpoints,
                                    sizeof(*sim->by_name), compare_key_name);

    return hit == NULL ? NULL : *hit;
}

/* ------------------------------------------------------- request log -- */

static void
log_open(struct request_log *log, const char *path)
{
    init_mutex(&log->lock);
    log->f = fopen(path, "w");
    if (log->f == NULL)
        fail_exit(EXIT_FAILURE, "cannot open log %s: %s", path, strerror(errno));
    if (setvbuf(log->f, NULL, _IOFBF, 1 << 20) != 0)
        fail_exit(EXIT_FAILURE, "setvbuf on the log failed");
}

/* Flush; the caller holds log->lock. */
static void
log_flush_locked(struct request_log *log)
{
    if (fflush(log->f) != 0 && !log->write_error)
    {
        log->write_error = true;
        fprintf(stderr, "simulator: writing the log: %s\n", strerror(errno));
    }
    log->unflushed = 0;
}

static void
log_flush(struct request_log *log)
{
    lock(&log->lock);
    log_flush_locked(log);
    unlock(&log->lock);
}

/* Append one line. */
static void
log_write(struct request_log *log, int64_t t_ns, const char *endpoint,
          const char *event_id, const char *attempt, unsigned status)
{
    lock(&log->lock);
    if (fprintf(log->f, "%" PRId64 ",%s,%s,%s,%u\n", t_ns / 1000, endpoint,
                event_id, attempt, status) < 0 && !log->write_error)
    {
        log->write_error = true;
        fprintf(stderr, "simulator: writing the log: %s\n", strerror(errno));
    }
    if (status == MHD_HTTP_NOT_FOUND)
        log->n_not_found++;
    if (++log->unflushed >= FLUSH_EVERY_LINES)
        log_flush_locked(log);
    unlock(&log->lock);
}

/* Close at exit, when no other thread is left; false on any write error. */
static bool
log_close(struct request_log *log)
{
    bool ok;

    log_flush_locked(log);
    ok = !log->write_error;
    if (fclose(log->f) != 0)
    {
        fprintf(stderr, "simulator: closing the log: %s\n", strerror(errno));
        ok = false;
    }
    log->f = NULL;
    pthread_mutex_destroy(&log->lock);
    return ok;
}

/* ----------------------------------------------------------- limiter -- */

/* Refill at the current limit from refilled_ns to until_ns. */
static void
refill_to(struct endpoint *ep, int64_t until_ns)
{
    double elapsed = (double) (until_ns - ep->refilled_ns) / 1e9;

    if (elapsed > 0)
    {
        ep->tokens = fmin(ep->cur_burst, ep->tokens + elapsed * ep->cur_rate);
        ep->refilled_ns = until_ns;
    }
}

/*
 * Bring the bucket up to now; the caller holds ep->lock.  Each change=
 * step passed since the last refill is applied at its own time: the refill
 * up to it at the old limit, then the new rate and burst (the tokens cut to
 * a smaller burst; a larger one fills at the new rate from there).
 */
static void
refill(struct endpoint *ep, int64_t now_ns)
{
    while (ep->next_change < ep->n_changes)
    {
        const struct change *c = &ep->changes[ep->next_change];
        int64_t at_ns = (int64_t) llround(c->at_s * 1e9);

        if (at_ns > now_ns)
            break;
        refill_to(ep, at_ns);
        ep->cur_rate = c->factor * ep->rate;
        ep->cur_burst = c->factor * ep->burst;
        ep->tokens = fmin(ep->tokens, ep->cur_burst);
        ep->next_change++;
    }
    refill_to(ep, now_ns);
}

/* Status of a request the bucket admitted: 200, or a drawn failure. */
static unsigned
admitted_status(struct endpoint *ep)
{
    if (ep->fail_p > 0 && random_unit(&ep->rng) < ep->fail_p)
        return ep->failures++ % 2 == 0 ? MHD_HTTP_SERVICE_UNAVAILABLE
            : MHD_HTTP_INTERNAL_SERVER_ERROR;
    return MHD_HTTP_OK;
}

/*
 * window=sliding: may a request at now_ns pass?  It is counted either way
 * (it takes the place of the oldest of the last burst= requests); if
 * refused, *retry_s is the time until the window admits again.
 */
static bool
sliding_admits(struct endpoint *ep, int64_t now_ns, int64_t *retry_s)
{
    long n = llround(ep->burst);
    int64_t window_ns = ep->window_s * 1000000000LL;
    bool admit = ep->n_arrivals < n ||
        ep->arrivals[ep->next_arrival] <= now_ns - window_ns;

    ep->arrivals[ep->next_arrival] = now_ns;
    ep->next_arrival = (ep->next_arrival + 1) % n;
    if (ep->n_arrivals < n)
        ep->n_arrivals++;
    if (!admit)
    {
        /* the oldest of the last n, this one included, must leave first */
        int64_t free_ns = ep->arrivals[ep->next_arrival] + window_ns - now_ns;

        *retry_s = (free_ns + 999999999LL) / 1000000000LL;
    }
    return admit;
}

/*
 * window=fixed: may a request at now_ns pass?  Windows are window_s long
 * on the wall clock; every request counts in its own.
 */
static bool
fixed_admits(struct simulator *sim, struct endpoint *ep, int64_t now_ns,
             int64_t *retry_s)
{
    int64_t wall_us = sim->t0_wall_us + now_ns / 1000;
    int64_t window_us = ep->window_s * 1000000LL;
    int64_t no = wall_us / window_us;

    if (no != ep->window_no)
    {
        ep->window_no = no;
        ep->window_count = 0;
    }
    if (ep->window_count++ < llround(ep->burst))
        return true;
    *retry_s = ((no + 1) * window_us - wall_us + 999999) / 1000000;
    return false;
}

/*
 * Admit or refuse one request to ep by its window (window=), count it and
 * log it; the caller holds ep->lock.
 */
static struct verdict
window_decide(struct simulator *sim, struct endpoint *ep, int64_t now_ns)
{
    struct verdict v = {0};
    bool admit = ep->kind == LIMIT_SLIDING ? sliding_admits(ep, now_ns, &v.retry_s)
        : fixed_admits(sim, ep, now_ns, &v.retry_s);

    v.limit = llround(ep->burst);
    if (admit)
    {
        v.status = admitted_status(ep);
        if (v.status == MHD_HTTP_OK)
            ep->n_ok++;
        else
            ep->n_failed++;
    }
    else
    {
        ep->n_throttled++;
        v.status = MHD_HTTP_TOO_MANY_REQUESTS;
        if (v.retry_s < 1)
            v.retry_s = 1;
    }
    return v;
}

/*
 * Admit or refuse one request to ep, count it and log it, all under the
 * endpoint's lock so that its lines are in time order.  A request a token
 * bucket refuses spends nothing (a window counts it: window_decide).
 */
static struct verdict
limiter_decide(struct simulator *sim, struct endpoint *ep,
               const char *event_id, const char *attempt)
{
    struct verdict v = {0};
    int64_t now_ns;

    lock(&ep->lock);
    now_ns = since_start_ns(sim);
    ep->n_requests++;
    if (ep->kind != LIMIT_BUCKET)
    {
        v = window_decide(sim, ep, now_ns);
        log_write(&sim->log, now_ns, ep->name, event_id, attempt, v.status);
        unlock(&ep->lock);
        return v;
    }
    refill(ep, now_ns);
    v.limit = llround(ep->cur_burst);
    if (ep->tokens >= 1)
    {
        ep->tokens -= 1;
        v.status = admitted_status(ep);
        if (v.status == MHD_HTTP_OK)
            ep->n_ok++;
        else
            ep->n_failed++;
        v.remaining = (int64_t) floor(ep->tokens);
        v.reset_s = (int64_t) ceil((ep->cur_burst - ep->tokens) / ep->cur_rate);
    }
    else
    {
        double wait_s = (1 - ep->tokens) / ep->cur_rate;

        ep->n_throttled++;
        v.status = MHD_HTTP_TOO_MANY_REQUESTS;
        v.retry_s = (int64_t) ceil(wait_s);
        if (v.retry_s < 1)
            v.retry_s = 1;
    }
    log_write(&sim->log, now_ns, ep->name, event_id, attempt, v.status);
    unlock(&ep->lock);
    return v;
}

/* --------------------------------------------------------- responses -- */

static struct MHD_Response *
text_response(const char *body)
{
    struct MHD_Response *r;

    r = MHD_create_response_from_buffer(strlen(body), (void *) body,
                                        MHD_RESPMEM_PERSISTENT);
    if (r == NULL)
        return NULL;
    if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain") != MHD_YES)
    {
        MHD_destroy_response(r);
        return NULL;
    }
    return r;
}

static void
canned_create(struct canned *c)
{
    c->ok = text_response("ok\n");
    c->not_found = text_response("no such endpoint\n");
    c->error500 = text_response("internal server error (simulated)\n");
    c->error503 = text_response("service unavailable (simulated)\n");
    if (c->ok == NULL || c->not_found == NULL || c->error500 == NULL || c->error503 == NULL)
        fail_exit(EXIT_FAILURE, "cannot create responses");
}

static void
canned_destroy(struct canned *c)
{
    MHD_destroy_response(c->ok);
    MHD_destroy_response(c->not_found);
    MHD_destroy_response(c->error500);
    MHD_destroy_response(c->error503);
}

/* Queue a response we own, then drop our reference. */
static enum MHD_Result
queue_and_release(struct MHD_Connection *conn, unsigned status,
                  struct MHD_Response *r)
{
    enum MHD_Result ret = MHD_queue_response(conn, status, r);

    MHD_destroy_response(r);
    return ret;
}

/* IMF-fixdate (RFC 9110), locale-free: "Sun, 06 Nov 1994 08:49:37 GMT". */
static bool
format_http_date(time_t t, char *out, size_t size)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct tm tm;
    int n;

    if (gmtime_r(&t, &tm) == NULL)
        return false;
    n = snprintf(out, size, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                 days[tm.tm_wday], tm.tm_mday, months[tm.tm_mon],
                 tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return n > 0 && (size_t) n < size;
}

/*
 * Wall-clock now + seconds, rounded up to the whole second an HTTP-date can
 * name: a sender that waits until that date is never early.
 */
static time_t
wall_clock_after(int64_t seconds)
{
    struct timespec now;

    if (clock_gettime(CLOCK_REALTIME, &now) != 0)
        return time(NULL) + (time_t) seconds + 1;
    return now.tv_sec + (time_t) seconds + (now.tv_nsec > 0 ? 1 : 0);
}

/*
 * The limit as the RateLimit fields print it: the burst now, in whole
 * requests (check_policy made it whole; rounded, not cut, since a factor of
 * change= may leave it a hair off).
 */
static long long
limit_field(const struct verdict *v)
{
    return v->limit;
}

/* RateLimit-Policy: <B>;w=<W>, the rate B/W and the burst B now. */
static bool
add_policy(struct MHD_Response *r, const struct endpoint *ep, const struct verdict *v)
{
    char value[64];

    snprintf(value, sizeof(value), "%lld;w=%lld", limit_field(v), ep->window_s);
    return MHD_add_response_header(r, "RateLimit-Policy", value) == MHD_YES;
}

/* The 429 of ep, with the headers of its mode. */
static struct MHD_Response *
throttled_response(const struct endpoint *ep, const struct verdict *v)
{
    struct MHD_Response *r = text_response("too many requests\n");
    char value[128];
    bool ok = r != NULL;

    switch (ep->mode)
    {
    case MODE_SECONDS:
        snprintf(value, sizeof(value), "%" PRId64, v->retry_s);
        ok = ok && MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, value) == MHD_YES;
        break;
    case MODE_DATE:
        ok = ok && format_http_date(wall_clock_after(v->retry_s), value, sizeof(value)) &&
            MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, value) == MHD_YES;
        break;
    case MODE_RATELIMIT:
        snprintf(value, sizeof(value), "limit=%lld, remaining=0, reset=%" PRId64,
                 limit_field(v), v->retry_s);
        ok = ok && MHD_add_response_header(r, "RateLimit", value) == MHD_YES;
        ok = ok && add_policy(r, ep, v);
        break;
    case MODE_BARE:
        break;                  /* a 429 and nothing else */
    }
    if (!ok && r != NULL)
    {
        MHD_destroy_response(r);
        r = NULL;
    }
    return r;
}

/* A 200 of a ratelimit-mode endpoint: RateLimit with what is left, and
 * the policy. */
static struct MHD_Response *
ok_ratelimit_response(const struct endpoint *ep, const struct verdict *v)
{
    struct MHD_Response *r = text_response("ok\n");
    char value[128];

    if (r == NULL)
        return NULL;
    snprintf(value, sizeof(value), "limit=%lld, remaining=%" PRId64 ", reset=%" PRId64,
             limit_field(v), v->remaining, v->reset_s);
    if (MHD_add_response_header(r, "RateLimit", value) != MHD_YES || !add_policy(r, ep, v))
    {
        MHD_destroy_response(r);
        return NULL;
    }
    return r;
}

/* Send the answer the limiter decided on. */
static enum MHD_Result
send_verdict(struct MHD_Connection *conn, const struct simulator *sim,
             const struct endpoint *ep, const struct verdict *v)
{
    struct MHD_Response *r;

    switch (v->status)
    {
    case MHD_HTTP_TOO_MANY_REQUESTS:
        r = throttled_response(ep, v);
        return r == NULL ? MHD_NO : queue_and_release(conn, v->status, r);
    case MHD_HTTP_SERVICE_UNAVAILABLE:
        return MHD_queue_response(conn, v->status, sim->canned.error503);
    case MHD_HTTP_INTERNAL_SERVER_ERROR:
        return MHD_queue_response(conn, v->status, sim->canned.error500);
    default:
        if (ep->mode != MODE_RATELIMIT)
            return MHD_queue_response(conn, v->status, sim->canned.ok);
        r = ok_ratelimit_response(ep, v);
        return r == NULL ? MHD_NO : queue_and_release(conn, v->status, r);
    }
}

/* GET /_stats: uptime and each endpoint's counters, as JSON. */
static enum MHD_Result
send_stats(struct MHD_Connection *conn, struct simulator *sim)
{
    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    struct MHD_Response *r;
    uint64_t not_found;

    if (f == NULL)
        return MHD_NO;
    lock(&sim->log.lock);
    not_found = sim->log.n_not_found;
    unlock(&sim->log.lock);
    fprintf(f, "{\"uptime_s\": %.3f, \"not_found\": %" PRIu64 ", \"endpoints\": {",
            (double) since_start_ns(sim) / 1e9, not_found);
    for (size_t i = 0; i < sim->n_endpoints; i++)
    {
        struct endpoint *ep = &sim->endpoints[i];

        lock(&ep->lock);
        fprintf(f, "%s\"%s\": {\"requests\": %" PRIu64 ", \"ok\": %" PRIu64
                ", \"throttled\": %" PRIu64 ", \"failed\": %" PRIu64 "}",
                i == 0 ? "" : ", ", ep->name, ep->n_requests, ep->n_ok,
                ep->n_throttled, ep->n_failed);
        unlock(&ep->lock);
    }
    fputs("}}\n", f);
    if (fclose(f) != 0)
    {
        free(json);
        return MHD_NO;
    }
    r = MHD_create_response_from_buffer(len, json, MHD_RESPMEM_MUST_FREE);
    if (r == NULL)
    {
        free(json);
        return MHD_NO;
    }
    if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json") != MHD_YES)
    {
        MHD_destroy_response(r);
        return MHD_NO;
    }
    return queue_and_release(conn, MHD_HTTP_OK, r);
}

/* ---------------------------------------------------------- requests -- */

/*
 * Copy the first segment of a URL path into name (at most MAX_NAME chars,
 * anything outside [A-Za-z0-9_.-] as '?'); false if it was longer.
 */
static bool
first_segment(const char *url, char name[MAX_NAME + 1])
{
    size_t n = 0;

    while (*url == '/')
        url++;
    for (; url[n] != '\0' && url[n] != '/'; n++)
        if (n < MAX_NAME)
            name[n] = is_name_char((unsigned char) url[n]) ? url[n] : '?';
    name[n < MAX_NAME ? n : MAX_NAME] = '\0';
    if (n == 0)
        strcpy(name, "?");
    return n <= MAX_NAME;
}

/* Does this listener serve this endpoint? */
static bool
listener_serves(const struct listener *l, const struct endpoint *ep)
{
    return l->serves == NULL ? ep->port == 0 : l->serves == ep;
}

static const char *
header_or_empty(struct MHD_Connection *conn, const char *name)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);

    return is_integer_text(v) ? v : "";
}

/*
 * The libmicrohttpd access handler.  It is called once when the headers
 * have arrived, then once per piece of body, then once more with no body
 * left: only then is the request decided and answered.
 */
static enum MHD_Result
handle_request(void *cls, struct MHD_Connection *conn, const char *url,
               const char *method, const char *version,
               const char *upload_data, size_t *upload_data_size,
               void **req_cls)
{
    struct listener *l = cls;
    struct simulator *sim = l->sim;
    char name[MAX_NAME + 1];
    struct endpoint *ep = NULL;
    const char *event_id, *attempt;
    struct verdict v;

    (void) method;              /* any method, any version: the body is dropped */
    (void) version;
    (void) upload_data;
    if (*req_cls == NULL)
    {
        *req_cls = l;           /* any non-NULL marker: "headers seen" */
        return MHD_YES;
    }
    if (*upload_data_size != 0)
    {
        *upload_data_size = 0;  /* read and discard the body */
        return MHD_YES;
    }

    if (l->serves == NULL && strcmp(url, "/_stats") == 0)
        return send_stats(conn, sim);

    event_id = header_or_empty(conn, "X-Event-Id");
    attempt = header_or_empty(conn, "X-Attempt");
    if (first_segment(url, name))
        ep = lookup_endpoint(sim, name);
    if (ep == NULL || !listener_serves(l, ep))
    {
        log_write(&sim->log, since_start_ns(sim), name, event_id, attempt,
                  MHD_HTTP_NOT_FOUND);
        return MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, sim->canned.not_found);
    }

    v = limiter_decide(sim, ep, event_id, attempt);
    if (ep->delay_ms > 0)
        sleep_ms(ep->delay_ms);     /* holds only this connection's thread */
    return send_verdict(conn, sim, ep, &v);
}

/* --------------------------------------------------------- listeners -- */

static bool
set_reuseaddr(int fd)
{
    int one = 1;

    return setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0;
}

/*
 * A TCP socket bound to 127.0.0.1:port, not yet listening, so connections
 * to it are refused; -1 with errno set on failure.  It binds without
 * SO_REUSEADDR when it can: then no other socket can bind the port, even
 * one with SO_REUSEADDR, while we hold it without listening.  Only if that
 * fails (connections of ours or of a previous run lingering in TIME_WAIT)
 * does it bind with SO_REUSEADDR, which still fails if anyone listens there.
 */
static int
bound_socket(int port)
{
    struct sockaddr_in addr;
    int fd, saved;

    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t) port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) == 0)
        return fd;
    if (errno == EADDRINUSE && set_reuseaddr(fd) &&
        bind(fd, (struct sockaddr *) &addr, sizeof(addr)) == 0)
        return fd;
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

/* Is the listener meant to be accepting at t seconds? */
static bool
should_be_open(const struct listener *l, double t)
{
    const struct endpoint *ep = l->serves;

    return ep == NULL || !ep->has_down || t < ep->down_from || t >= ep->down_until;
}

/* Take hold of the port (bound, refusing).  At start, a taken port is fatal. */
static void
listener_reserve(struct listener *l)
{
    l->fd = bound_socket(l->port);
    if (l->fd < 0)
    {
        if (errno == EADDRINUSE)
            fail_exit(EXIT_USAGE, "port %d is already in use on 127.0.0.1", l->port);
        fail_exit(EXIT_USAGE, "cannot bind 127.0.0.1:%d: %s", l->port, strerror(errno));
    }
}

/* Start accepting: listen on our bound socket and hand it to libmicrohttpd. */
static bool
listener_open(struct listener *l)
{
    const unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO_INTERNAL_THREAD |
        MHD_USE_ITC;

    if (l->fd < 0 && (l->fd = bound_socket(l->port)) < 0)
        return false;
    /* SO_REUSEADDR before listening, so that the TIME_WAIT of the
     * connections it accepts does not keep the next run from binding. */
    if (!set_reuseaddr(l->fd) || listen(l->fd, SOMAXCONN) != 0)
        return false;
    l->daemon = MHD_start_daemon(flags, (uint16_t) l->port, NULL, NULL,
                                 handle_request, l,
                                 MHD_OPTION_LISTEN_SOCKET, l->fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned) CONNECTION_LIMIT,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) IDLE_TIMEOUT_S,
                                 MHD_OPTION_END);
    if (l->daemon == NULL)
    {
        /* Whether a failed start closed the socket is not documented: let
         * it go rather than risk closing a descriptor twice. */
        l->fd = -1;
        errno = EIO;
        return false;
    }
    l->fd = -1;                 /* libmicrohttpd's now, until quiesced */
    return true;
}

/*
 * Stop accepting and drop this listener's connections (a request being
 * answered is finished first).  With keep_port the port stays bound, so
 * connections are refused and nobody else takes it.
 */
static void
listener_close(struct listener *l, bool keep_port)
{
    if (l->daemon != NULL)
    {
        MHD_socket fd = MHD_quiesce_daemon(l->daemon);

        MHD_stop_daemon(l->daemon);
        l->daemon = NULL;
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
    }
    if (l->fd >= 0)
    {
        close(l->fd);
        l->fd = -1;
    }
    if (keep_port && (l->fd = bound_socket(l->port)) < 0)
        fprintf(stderr, "simulator: cannot bind 127.0.0.1:%d again: %s\n",
                l->port, strerror(errno));
}

/* Open or close the listener as its down= window says, at t seconds. */
static void
listener_update(struct listener *l, double t)
{
    bool want = should_be_open(l, t);

    if (want && l->daemon == NULL)
    {
        if (listener_open(l))
            l->reported_failure = false;
        else if (!l->reported_failure)
        {
            fprintf(stderr, "simulator: cannot open 127.0.0.1:%d for %s: %s (retrying)\n",
                    l->port, l->serves->name, strerror(errno));
            l->reported_failure = true;
        }
    }
    else if (!want && l->daemon != NULL)
        listener_close(l, true);
}

/* One listener for the main port, one for each endpoint with port=. */
static void
create_listeners(struct simulator *sim, int main_port)
{
    size_t n = 1;

    for (size_t i = 0; i < sim->n_endpoints; i++)
        if (sim->endpoints[i].port != 0)
            n++;
    sim->listeners = xcalloc(n, sizeof(*sim->listeners));
    sim->listeners[0] = (struct listener) {.sim = sim, .port = main_port, .fd = -1};
    sim->n_listeners = 1;
    for (size_t i = 0; i < sim->n_endpoints; i++)
        if (sim->endpoints[i].port != 0)
            sim->listeners[sim->n_listeners++] = (struct listener) {
                .sim = sim, .serves = &sim->endpoints[i],
                .port = sim->endpoints[i].port, .fd = -1};
}

/* Bind every port (a taken one is fatal), then open those open at t=0. */
static void
start_listeners(struct simulator *sim)
{
    for (size_t i = 0; i < sim->n_listeners; i++)
        listener_reserve(&sim->listeners[i]);
    for (size_t i = 0; i < sim->n_listeners; i++)
    {
        struct listener *l = &sim->listeners[i];

        if (should_be_open(l, 0) && !listener_open(l))
            fail_exit(EXIT_FAILURE, "cannot start the HTTP server on 127.0.0.1:%d: %s",
                      l->port, strerror(errno));
    }
}

/* ------------------------------------------------------------- main -- */

static void
usage(FILE *out)
{
    fputs("usage: simulator --port PORT --config FILE --log FILE [--seed N] [--ready-file FILE]\n"
          "A webhook destination simulator on 127.0.0.1; see the comment at the top of\n"
          "demo/simulator.c for the config syntax and the log format.\n", out);
}

static struct options
parse_args(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"port", required_argument, NULL, 'p'},
        {"config", required_argument, NULL, 'c'},
        {"log", required_argument, NULL, 'l'},
        {"seed", required_argument, NULL, 's'},
        {"ready-file", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}
    };
    struct options o = {.seed = 1};
    int c;
    long port;
    char *end;

    while ((c = getopt_long(argc, argv, "p:c:l:s:r:h", longopts, NULL)) != -1)
    {
        switch (c)
        {
        case 'p':
            if (!parse_long(optarg, 1, 65535, &port))
                fail_exit(EXIT_USAGE, "--port must be 1..65535, not '%s'", optarg);
            o.port = (int) port;
            break;
        case 'c':
            o.config_path = optarg;
            break;
        case 'l':
            o.log_path = optarg;
            break;
        case 's':
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end != '\0' || errno != 0 || optarg[0] == '-')
                fail_exit(EXIT_USAGE, "--seed must be a non-negative integer, not '%s'", optarg);
            break;
        case 'r':
            o.ready_path = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(EXIT_SUCCESS);
        default:
            usage(stderr);
            exit(EXIT_USAGE);
        }
    }
    if (optind < argc || o.port == 0 || o.config_path == NULL || o.log_path == NULL)
    {
        usage(stderr);
        exit(EXIT_USAGE);
    }
    return o;
}

/*
 * Write the pid, then the start's wall-clock time and CLOCK_MONOTONIC time in
 * microseconds (what t_us 0 of the log is), one a line, to path, atomically
 * (a temp file renamed into place).
 */
static void
write_ready_file(const char *path, int64_t t0_wall_us, int64_t t0_mono_us)
{
    size_t len = strlen(path) + 32;
    char *tmp = xcalloc(len, 1);
    FILE *f;

    snprintf(tmp, len, "%s.tmp.%ld", path, (long) getpid());
    f = fopen(tmp, "w");
    if (f == NULL)
        fail_exit(EXIT_FAILURE, "cannot write %s: %s", tmp, strerror(errno));
    if (fprintf(f, "%ld\n%" PRId64 "\n%" PRId64 "\n", (long) getpid(), t0_wall_us,
                t0_mono_us) < 0 || fclose(f) != 0 ||
        rename(tmp, path) != 0)
        fail_exit(EXIT_FAILURE, "cannot write %s: %s", path, strerror(errno));
    free(tmp);
}

/*
 * Until SIGTERM or SIGINT: every TICK_MS, open or close the down= listeners
 * and flush the log every FLUSH_EVERY_MS.  The signals are blocked in every
 * thread and taken here synchronously, so no handler runs anywhere.
 */
static void
run_until_signal(struct simulator *sim, const sigset_t *stop_signals)
{
    const struct timespec tick = {.tv_sec = 0, .tv_nsec = TICK_MS * 1000000L};
    int64_t last_flush_ns = since_start_ns(sim);

    for (;;)
    {
        int sig = sigtimedwait(stop_signals, NULL, &tick);
        int64_t now_ns;

        if (sig == SIGTERM || sig == SIGINT)
            return;
        if (sig < 0 && errno != EAGAIN && errno != EINTR)
            fail_exit(EXIT_FAILURE, "sigtimedwait: %s", strerror(errno));
        now_ns = since_start_ns(sim);
        for (size_t i = 1; i < sim->n_listeners; i++)
            listener_update(&sim->listeners[i], (double) now_ns / 1e9);
        if (now_ns - last_flush_ns >= FLUSH_EVERY_MS * 1000000LL)
        {
            log_flush(&sim->log);
            last_flush_ns = now_ns;
        }
    }
}

static void
free_simulator(struct simulator *sim)
{
    for (size_t i = 0; i < sim->n_endpoints; i++)
    {
        pthread_mutex_destroy(&sim->endpoints[i].lock);
        free(sim->endpoints[i].arrivals);
    }
    canned_destroy(&sim->canned);
    free(sim->listeners);
    free(sim->by_name);
    free(sim->endpoints);
}

int
main(int argc, char **argv)
{
    struct simulator sim = {0};
    struct options opt;
    sigset_t stop_signals;
    bool log_ok;
    int rc;

    sim.t0_ns = monotonic_ns();
    sim.t0_wall_us = wall_clock_us();
    opt = parse_args(argc, argv);
    sim.seed = opt.seed;
    load_config(&sim, opt.config_path, opt.port);
    init_endpoints(&sim);

    /* Block the stop signals before any thread exists: all inherit it. */
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    if ((rc = pthread_sigmask(SIG_BLOCK, &stop_signals, NULL)) != 0)
        fail_exit(EXIT_FAILURE, "pthread_sigmask: %s", strerror(rc));
    signal(SIGPIPE, SIG_IGN);

    if (opt.ready_path != NULL && unlink(opt.ready_path) != 0 && errno != ENOENT)
        fail_exit(EXIT_FAILURE, "cannot remove old %s: %s", opt.ready_path, strerror(errno));
    log_open(&sim.log, opt.log_path);
    canned_create(&sim.canned);
    create_listeners(&sim, opt.port);
    start_listeners(&sim);
    if (opt.ready_path != NULL)
        write_ready_file(opt.ready_path, sim.t0_wall_us, sim.t0_ns / 1000);

    run_until_signal(&sim, &stop_signals);

    for (size_t i = 0; i < sim.n_listeners; i++)
        listener_close(&sim.listeners[i], false);
    log_ok = log_close(&sim.log);
    if (opt.ready_path != NULL)
        unlink(opt.ready_path);
    free_simulator(&sim);
    return log_ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
