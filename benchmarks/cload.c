/*
 * cload: a load client for lockserver written from PROTOCOL.md alone (issue 19), and for
 * Redis (RESP, an EVALSHA acquire) for comparison.
 *
 * Why a C client: issue 19's authors measured the server with a C client, one epoll thread,
 * on its own CPU (`taskset -c 1`, server on `taskset -c 0`). Our Python load generator is
 * itself descheduled for up to ~14 ms on the 2-core VM, so it cannot say whether the server
 * keeps "worst latency <= 5 ms in every 10 s window with 1,000,000 entries held". This one
 * costs a few microseconds per request and records when each reply reached the kernel, so
 * its own delays can be told apart from the server's.
 *
 * What it sends (PROTOCOL.md section in brackets):
 * - frames: 4-byte big-endian length + one msgpack map (1);
 * - `hello` id 0, version 1, then waits for `welcome` and reads its `limits` (2, 3, 4);
 * - `execute` requests: session (created by its first call), max_age 3600, namespace
 *   "cload", statements `[["Assert", ["SetVar", "Big", VAR]], ...]` (3, 5). The request
 *   of a load connection is one template per connection; its id (always a 5-byte msgpack
 *   uint32) and the 10-digit counter in the variable's name are written in place (the
 *   server accepts any msgpack encoding of the right type, 11).
 * - every reply is checked (4, 6, 9): a `result` whose `id` is a request of that connection
 *   still in flight (matched by id, never by position) and whose `status` is 2
 *   (TransactionOK). Anything else -- an `error`, another status, an unknown id, an event, a
 *   frame that is not exactly one msgpack map -- is an error: counted, the first few kept
 *   with the server's words, and the exit status is 1.
 *
 * Shapes (`--shape`):
 * - c64: `--connections` (64) connections, each its own session, `--depth` (1) requests in
 *   flight each, unique-variable acquires never released;
 * - pipelined: 1 connection, 64 in flight;
 * - bigtable: first `--prefill` (1,000,000) entries held by 16 sessions, one connection
 *   each, every execute holding 250 `Assert(SetVar("Big", unique))` statements, two
 *   executes in flight per connection; then the c64 load into the same table.
 * Closed loop by default (a connection sends its next request when a reply frees a slot).
 * With `--rate R` the load is an open-loop schedule: connection c's request k is due at
 * t0 + (c + k*C)/R; it is sent when due and a slot is free, and its latency counts from when
 * it was due, so a stall delays (and counts against) every request scheduled behind it
 * (no coordinated omission).
 *
 * The run: connect + hello, prefill, `--warmup` (1 s, not recorded), then the window of
 * `--duration` seconds (10) or `--count` replies, whichever comes first, or `--max-errors`
 * errors; then no more sends, and the replies still in flight are read (up to 5 s) and
 * checked. A request sent (or due) in the window has its latency recorded even when its reply
 * comes after the window closes, so a stall at the end is not hidden. Latencies go into a
 * log-linear histogram (1/128 relative resolution, so p50/p99/p99.9 within 0.8 %) plus the
 * exact worst, overall and per `--window` (10 s) slice of the window.
 *
 * Also measured: each reply's arrival in this machine's kernel (SO_TIMESTAMPNS, the arrival
 * of the last segment a read returned): the worst latency to arrival, the worst from the
 * request's write to its reply's arrival (the server's turnaround, queueing included, without
 * this client's lateness), the longest a reply lay unread (this process's own delay) and, paced,
 * how late this process sent a request whose slot was free (its timer's lateness); when the
 * worst came and how many entries this run had put in the table then; how often another
 * task took this process's CPU. `--spin 1` never sleeps (epoll with a zero timeout), for a
 * client with a CPU to itself: it saves the wake-ups, not the preemptions (on the 2-vCPU
 * VM, the VM's own threads take even a spinning client's CPU for a 4 ms tick now and then).
 * With `--stat-pid PID`, that process's CPU time
 * (utime + stime of /proc/PID/stat) over the window, this process's own (getrusage), and the
 * whole machine's (/proc/stat), so what else ran meanwhile is on the record.
 *
 * Output: one JSON object on stdout. Exit status 0 when every reply was right, 1 when any
 * was not or the run broke off (the JSON says why), 2 for a usage or setup error (stderr).
 * `--dump FILE` writes sample frames instead of connecting (for tests against the codec).
 *
 * C11 + POSIX/Linux (epoll, SO_TIMESTAMPNS); libc only. Build: gcc -O2 -o cload cload.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define NAMESPACE "cload"
#define TABLE "Big"
#define MAX_AGE 3600          /* seconds: the server's default max_session_age */
#define PREFILL_SESSIONS 16
#define PREFILL_BATCH 250
#define PREFILL_DEPTH 2
#define DIGITS 10             /* the counter's width in a variable's name */
#define REDIS_TTL_MS "3600000"
#define MAX_SAMPLES 5
#define RECV_SIZE 65536
#define DRAIN_NS 5000000000LL /* how long the replies in flight are waited for at the end */
#define STATUS_OK 2           /* TransactionOK (PROTOCOL.md 6) */

static const char REDIS_SCRIPT[] =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0";

/* ---------------------------------------------------------------- small helpers */

static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cload: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) die(2, "out of memory");
    b->p = p;
    b->cap = cap;
}

static void buf_put(buf_t *b, const void *data, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_byte(buf_t *b, uint8_t x) { buf_put(b, &x, 1); }

static void put_be(uint8_t *at, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) {
        at[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

static void buf_be(buf_t *b, uint64_t v, int n) {
    buf_reserve(b, (size_t)n);
    put_be(b->p + b->len, v, n);
    b->len += (size_t)n;
}

/* The 10 digits of k mod 10^10 at `at`. */
static void put_digits(uint8_t *at, uint64_t k) {
    k %= 10000000000ULL;
    for (int i = DIGITS - 1; i >= 0; i--) {
        at[i] = (uint8_t)('0' + k % 10);
        k /= 10;
    }
}

/* ---------------------------------------------------------------- msgpack, by hand */

static void mp_map(buf_t *b, uint32_t n) {
    if (n < 16) buf_byte(b, (uint8_t)(0x80 | n));
    else if (n < 65536) { buf_byte(b, 0xde); buf_be(b, n, 2); }
    else { buf_byte(b, 0xdf); buf_be(b, n, 4); }
}

static void mp_array(buf_t *b, uint32_t n) {
    if (n < 16) buf_byte(b, (uint8_t)(0x90 | n));
    else if (n < 65536) { buf_byte(b, 0xdc); buf_be(b, n, 2); }
    else { buf_byte(b, 0xdd); buf_be(b, n, 4); }
}

static void mp_str(buf_t *b, const char *s, size_t n) {
    if (n < 32) buf_byte(b, (uint8_t)(0xa0 | n));
    else if (n < 256) { buf_byte(b, 0xd9); buf_be(b, n, 1); }
    else if (n < 65536) { buf_byte(b, 0xda); buf_be(b, n, 2); }
    else { buf_byte(b, 0xdb); buf_be(b, n, 4); }
    buf_put(b, s, n);
}

static void mp_cstr(buf_t *b, const char *s) { mp_str(b, s, strlen(s)); }

/* Always 5 bytes (uint32), so a template's id can be rewritten in place. */
static void mp_u32(buf_t *b, uint32_t v) {
    buf_byte(b, 0xce);
    buf_be(b, v, 4);
}

static void mp_uint(buf_t *b, uint64_t v) {
    if (v < 128) buf_byte(b, (uint8_t)v);
    else if (v < 256) { buf_byte(b, 0xcc); buf_be(b, v, 1); }
    else if (v < 65536) { buf_byte(b, 0xcd); buf_be(b, v, 2); }
    else if (v <= 0xffffffffULL) { buf_byte(b, 0xce); buf_be(b, v, 4); }
    else { buf_byte(b, 0xcf); buf_be(b, v, 8); }
}

/* A frame is begun by reserving its 4-byte length and ended by writing it. */
static size_t frame_begin(buf_t *b) {
    size_t at = b->len;
    buf_be(b, 0, 4);
    return at;
}

static void frame_end(buf_t *b, size_t at) { put_be(b->p + at, b->len - at - 4, 4); }

typedef struct {
    const uint8_t *p, *end;
} rd_t;

static int rd_need(rd_t *r, size_t n) { return (size_t)(r->end - r->p) >= n ? 0 : -1; }

static uint64_t rd_be(rd_t *r, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | r->p[i];
    r->p += n;
    return v;
}

/* Skip one value of any msgpack type; -1 when truncated, malformed or nested too deep. */
static int mp_skip(rd_t *r, int depth) {
    if (depth > 64 || rd_need(r, 1)) return -1;
    uint8_t t = *r->p++;
    uint64_t n = 0, items = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return 0;
    if ((t & 0xf0) == 0x80) items = 2 * (uint64_t)(t & 0x0f);
    else if ((t & 0xf0) == 0x90) items = t & 0x0f;
    else if ((t & 0xe0) == 0xa0) n = t & 0x1f;
    else {
        switch (t) {
        case 0xc4: case 0xd9: if (rd_need(r, 1)) return -1; n = rd_be(r, 1); break;
        case 0xc5: case 0xda: if (rd_need(r, 2)) return -1; n = rd_be(r, 2); break;
        case 0xc6: case 0xdb: if (rd_need(r, 4)) return -1; n = rd_be(r, 4); break;
        case 0xc7: if (rd_need(r, 1)) return -1; n = rd_be(r, 1) + 1; break;
        case 0xc8: if (rd_need(r, 2)) return -1; n = rd_be(r, 2) + 1; break;
        case 0xc9: if (rd_need(r, 4)) return -1; n = rd_be(r, 4) + 1; break;
        case 0xca: n = 4; break;
        case 0xcb: n = 8; break;
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: n = 4; break;
        case 0xcf: case 0xd3: n = 8; break;
        case 0xd4: n = 2; break;
        case 0xd5: n = 3; break;
        case 0xd6: n = 5; break;
        case 0xd7: n = 9; break;
        case 0xd8: n = 17; break;
        case 0xdc: if (rd_need(r, 2)) return -1; items = rd_be(r, 2); break;
        case 0xdd: if (rd_need(r, 4)) return -1; items = rd_be(r, 4); break;
        case 0xde: if (rd_need(r, 2)) return -1; items = 2 * rd_be(r, 2); break;
        case 0xdf: if (rd_need(r, 4)) return -1; items = 2 * rd_be(r, 4); break;
        default: return -1; /* 0xc1: never used */
        }
    }
    if (rd_need(r, n)) return -1;
    r->p += n;
    for (uint64_t i = 0; i < items; i++)
        if (mp_skip(r, depth + 1)) return -1;
    return 0;
}

static int mp_read_map(rd_t *r, uint32_t *n) {
    if (rd_need(r, 1)) return -1;
    uint8_t t = *r->p;
    if ((t & 0xf0) == 0x80) { r->p++; *n = t & 0x0f; return 0; }
    if (t == 0xde && !rd_need(r, 3)) { r->p++; *n = (uint32_t)rd_be(r, 2); return 0; }
    if (t == 0xdf && !rd_need(r, 5)) { r->p++; *n = (uint32_t)rd_be(r, 4); return 0; }
    return -1;
}

/* A str; 1 (nothing consumed) when the value is not a str. */
static int mp_read_str(rd_t *r, const char **s, uint32_t *n) {
    if (rd_need(r, 1)) return -1;
    uint8_t t = *r->p;
    uint64_t len;
    if ((t & 0xe0) == 0xa0) { r->p++; len = t & 0x1f; }
    else if (t == 0xd9 && !rd_need(r, 2)) { r->p++; len = rd_be(r, 1); }
    else if (t == 0xda && !rd_need(r, 3)) { r->p++; len = rd_be(r, 2); }
    else if (t == 0xdb && !rd_need(r, 5)) { r->p++; len = rd_be(r, 4); }
    else return 1;
    if (rd_need(r, len)) return -1;
    *s = (const char *)r->p;
    *n = (uint32_t)len;
    r->p += len;
    return 0;
}

enum { INT_NONE, INT_UINT, INT_NEG, INT_NIL };

/* An integer (any width) or nil: its kind, and in *u its value (uint) or two's complement
 * (negative); INT_NONE (the value skipped) for any other type. */
static int mp_read_int(rd_t *r, uint64_t *u) {
    if (rd_need(r, 1)) return -1;
    uint8_t t = *r->p;
    if (t <= 0x7f) { r->p++; *u = t; return INT_UINT; }
    if (t >= 0xe0) { r->p++; *u = (uint64_t)(int64_t)(int8_t)t; return INT_NEG; }
    if (t == 0xc0) { r->p++; return INT_NIL; }
    int n = 0;
    bool sign = false;
    switch (t) {
    case 0xcc: n = 1; break;
    case 0xcd: n = 2; break;
    case 0xce: n = 4; break;
    case 0xcf: n = 8; break;
    case 0xd0: n = 1; sign = true; break;
    case 0xd1: n = 2; sign = true; break;
    case 0xd2: n = 4; sign = true; break;
    case 0xd3: n = 8; sign = true; break;
    default: return mp_skip(r, 0) ? -1 : INT_NONE;
    }
    r->p++;
    if (rd_need(r, (size_t)n)) return -1;
    uint64_t v = rd_be(r, n);
    if (!sign) { *u = v; return INT_UINT; }
    int shift = 64 - 8 * n;
    int64_t s = (int64_t)(v << shift) >> shift; /* sign-extend */
    *u = (uint64_t)s;
    return s < 0 ? INT_NEG : INT_UINT;
}

static bool str_is(const char *s, uint32_t n, const char *lit) {
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* What a reply (or event) from the server says, as far as checking needs. */
typedef struct {
    char type[24];
    bool has_id;
    uint64_t id;
    int64_t status, cause, code;
    const char *name, *message, *failed;
    uint32_t name_len, message_len, failed_len;
} reply_t;

/* Read a server message: 0, or -1 when it is not exactly one msgpack map with str keys. */
static int parse_reply(const uint8_t *p, size_t len, reply_t *out) {
    rd_t r = {p, p + len};
    uint32_t n;
    memset(out, 0, sizeof *out);
    out->status = out->cause = out->code = -1;
    if (mp_read_map(&r, &n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const char *k, *s;
        uint32_t kn, sn;
        if (mp_read_str(&r, &k, &kn)) return -1;
        uint64_t u;
        int kind;
        if (str_is(k, kn, "type") || str_is(k, kn, "name") || str_is(k, kn, "message") ||
            str_is(k, kn, "failed")) {
            int got = mp_read_str(&r, &s, &sn);
            if (got < 0) return -1;
            if (got == 1) { if (mp_skip(&r, 0)) return -1; continue; }
            if (str_is(k, kn, "type")) {
                size_t m = sn < sizeof out->type - 1 ? sn : sizeof out->type - 1;
                memcpy(out->type, s, m);
                out->type[m] = 0;
            } else if (str_is(k, kn, "name")) { out->name = s; out->name_len = sn; }
            else if (str_is(k, kn, "message")) { out->message = s; out->message_len = sn; }
            else { out->failed = s; out->failed_len = sn; }
        } else if (str_is(k, kn, "id")) {
            kind = mp_read_int(&r, &u);
            if (kind < 0) return -1;
            if (kind == INT_UINT) { out->has_id = true; out->id = u; }
        } else if (str_is(k, kn, "status") || str_is(k, kn, "cause") || str_is(k, kn, "code")) {
            kind = mp_read_int(&r, &u);
            if (kind < 0) return -1;
            int64_t v = kind == INT_UINT || kind == INT_NEG ? (int64_t)u : -1;
            if (str_is(k, kn, "status")) out->status = v;
            else if (str_is(k, kn, "cause")) out->cause = v;
            else out->code = v;
        } else if (mp_skip(&r, 0)) {
            return -1;
        }
    }
    return r.p == r.end ? 0 : -1; /* exactly one document */
}

/* ---------------------------------------------------------------- latency histogram */

/* Log-linear: values below 256 ns exact; above, 128 sub-buckets per power of two (1/128
 * relative width). A bucket's value is reported as its upper bound, never above the exact
 * worst. */
#define HIST_BUCKETS (256 + 56 * 128)

typedef struct {
    uint64_t counts[HIST_BUCKETS];
    uint64_t n, sum_ns, max_ns;
} hist_t;

static int hist_index(uint64_t v) {
    if (v < 256) return (int)v;
    int m = 63 - __builtin_clzll(v);
    int shift = m - 7;
    return 256 + (shift - 1) * 128 + (int)((v >> shift) - 128);
}

static uint64_t hist_upper(int i) {
    if (i < 256) return (uint64_t)i;
    int shift = (i - 256) / 128 + 1;
    uint64_t top = (uint64_t)((i - 256) % 128 + 128);
    return ((top + 1) << shift) - 1;
}

static void hist_record(hist_t *h, int64_t ns) {
    uint64_t v = ns < 0 ? 0 : (uint64_t)ns;
    h->counts[hist_index(v)]++;
    h->n++;
    h->sum_ns += v;
    if (v > h->max_ns) h->max_ns = v;
}

static double hist_pct_us(const hist_t *h, double q) {
    if (h->n == 0) return 0.0;
    double exact = q / 100.0 * (double)h->n;
    uint64_t rank = (uint64_t)exact;
    if ((double)rank < exact) rank++; /* the smallest value with >= q % at or below it */
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t v = hist_upper(i);
            return (double)(v < h->max_ns ? v : h->max_ns) / 1000.0;
        }
    }
    return (double)h->max_ns / 1000.0;
}

/* ---------------------------------------------------------------- options */

typedef enum { SHAPE_C64, SHAPE_PIPELINED, SHAPE_BIGTABLE } shape_t;
static const char *SHAPES[] = {"c64", "pipelined", "bigtable"};

typedef struct {
    const char *host, *target, *tag, *dump;
    int port, conns, depth, stat_pid;
    shape_t shape;
    bool redis, spin;
    double rate, duration, warmup, window;
    uint64_t count, max_errors;
    long prefill;
} opts_t;

static void usage(void) {
    fputs("usage: cload --port PORT [--host 127.0.0.1] [--target lockserver|redis]\n"
          "             [--shape c64|pipelined|bigtable] [--connections N] [--depth D]\n"
          "             [--prefill N] [--rate R] [--duration S] [--warmup S] [--window S]\n"
          "             [--count N] [--max-errors N] [--stat-pid PID] [--tag TAG] [--spin 0|1]\n"
          "       cload --dump FILE [--tag TAG] [--prefill N]   (sample frames, no network)\n",
          stderr);
    exit(2);
}

static double num_arg(const char *name, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (*v == 0 || *end != 0 || !(x >= lo && x <= hi))
        die(2, "%s: expected a number from %g to %g, got '%s'", name, lo, hi, v);
    return x;
}

static void parse_opts(int argc, char **argv, opts_t *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->target = "lockserver";
    o->conns = o->depth = -1;
    o->prefill = -1;
    o->rate = 0;
    o->duration = 10;
    o->warmup = 1;
    o->window = 10;
    o->count = 10000000;
    o->max_errors = 1000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--port")) o->port = (int)num_arg(a, v, 1, 65535);
        else if (!strcmp(a, "--target")) o->target = v;
        else if (!strcmp(a, "--shape")) {
            int s = -1;
            for (int j = 0; j < 3; j++)
                if (!strcmp(v, SHAPES[j])) s = j;
            if (s < 0) die(2, "--shape: c64, pipelined or bigtable, not '%s'", v);
            o->shape = (shape_t)s;
        } else if (!strcmp(a, "--connections")) o->conns = (int)num_arg(a, v, 1, 10000);
        else if (!strcmp(a, "--depth")) o->depth = (int)num_arg(a, v, 1, 65536);
        else if (!strcmp(a, "--prefill")) o->prefill = (long)num_arg(a, v, 0, 100000000);
        else if (!strcmp(a, "--rate")) o->rate = num_arg(a, v, 0, 1e8);
        else if (!strcmp(a, "--duration")) o->duration = num_arg(a, v, 0.01, 3600);
        else if (!strcmp(a, "--warmup")) o->warmup = num_arg(a, v, 0, 600);
        else if (!strcmp(a, "--window")) o->window = num_arg(a, v, 0.01, 3600);
        else if (!strcmp(a, "--count")) o->count = (uint64_t)num_arg(a, v, 1, 1e9);
        else if (!strcmp(a, "--max-errors")) o->max_errors = (uint64_t)num_arg(a, v, 1, 1e9);
        else if (!strcmp(a, "--stat-pid")) o->stat_pid = (int)num_arg(a, v, 1, 1e9);
        else if (!strcmp(a, "--tag")) o->tag = v;
        else if (!strcmp(a, "--dump")) o->dump = v;
        else if (!strcmp(a, "--spin")) o->spin = num_arg(a, v, 0, 1) > 0;
        else usage();
    }
    if (!strcmp(o->target, "redis")) o->redis = true;
    else if (strcmp(o->target, "lockserver")) die(2, "--target: lockserver or redis");
    if (o->conns < 0) o->conns = o->shape == SHAPE_PIPELINED ? 1 : 64;
    if (o->depth < 0) o->depth = o->shape == SHAPE_PIPELINED ? 64 : 1;
    if (o->prefill < 0) o->prefill = o->shape == SHAPE_BIGTABLE ? 1000000 : 0;
    if (o->redis && o->prefill > 0) die(2, "--prefill (and the bigtable shape) is lockserver's");
    if (o->dump == NULL && o->port == 0) die(2, "--port is required");
    static char tag[32];
    if (o->tag == NULL) {
        snprintf(tag, sizeof tag, "%08x", (unsigned)(getpid() * 2654435761u ^ (unsigned)real_ns()));
        o->tag = tag;
    }
    size_t tl = strlen(o->tag);
    if (tl == 0 || tl > 24) die(2, "--tag: 1 to 24 characters");
    for (size_t j = 0; j < tl; j++)
        if ((unsigned char)o->tag[j] <= ' ' || (unsigned char)o->tag[j] >= 127)
            die(2, "--tag: printable ASCII without spaces");
}

/* ---------------------------------------------------------------- requests */

/* The request of one load connection, made once; only its id and counter change. */
typedef struct {
    buf_t b;
    size_t id_at, var_at; /* offsets of the uint32 id and of the counter's digits */
} tmpl_t;

static void session_name(char *out, size_t n, const char *tag, char role, long i) {
    snprintf(out, n, "cload-%s-%c%ld", tag, role, i);
}

/* Acquire k of load connection c: execute(id, session "cload-TAG-aC", ["Assert", ["SetVar",
 * "Big", "TAG.aCCCC.KKKKKKKKKK"]]); Redis: EVALSHA sha 1 "cl:TAG:CCCC:KKKKKKKKKK" TAG ttl. */
static void make_template(tmpl_t *t, const opts_t *o, int c, const char *sha) {
    char var[80], session[80];
    memset(t, 0, sizeof *t);
    buf_t *b = &t->b;
    if (o->redis) {
        snprintf(var, sizeof var, "cl:%s:%04d:%0*d", o->tag, c, DIGITS, 0);
        char head[256];
        size_t vl = strlen(var), tl = strlen(o->tag), ll = strlen(REDIS_TTL_MS);
        int n = snprintf(head, sizeof head,
                         "*6\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n$%zu\r\n", sha, vl);
        buf_put(b, head, (size_t)n);
        t->var_at = b->len + vl - DIGITS;
        buf_put(b, var, vl);
        n = snprintf(head, sizeof head, "\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", tl, o->tag, ll,
                     REDIS_TTL_MS);
        buf_put(b, head, (size_t)n);
        return;
    }
    snprintf(var, sizeof var, "%s.a%04d.%0*d", o->tag, c, DIGITS, 0);
    session_name(session, sizeof session, o->tag, 'a', c);
    size_t at = frame_begin(b);
    mp_map(b, 6);
    mp_cstr(b, "type");
    mp_cstr(b, "execute");
    mp_cstr(b, "id");
    t->id_at = b->len + 1;
    mp_u32(b, 0);
    mp_cstr(b, "session");
    mp_cstr(b, session);
    mp_cstr(b, "max_age");
    mp_uint(b, MAX_AGE);
    mp_cstr(b, "namespace");
    mp_cstr(b, NAMESPACE);
    mp_cstr(b, "statements");
    mp_array(b, 1);
    mp_array(b, 2);
    mp_cstr(b, "Assert");
    mp_array(b, 3);
    mp_cstr(b, "SetVar");
    mp_cstr(b, TABLE);
    mp_cstr(b, var);
    t->var_at = b->len - DIGITS;
    frame_end(b, at);
}

/* Append acquire k (request id `id`) of a template to `out`. */
static void put_acquire(buf_t *out, const tmpl_t *t, uint64_t k, uint32_t id, bool redis) {
    size_t at = out->len;
    buf_put(out, t->b.p, t->b.len);
    put_digits(out->p + at + t->var_at, k);
    if (!redis) put_be(out->p + at + t->id_at, id, 4);
}

/* Prefill execute e (entries e*250 .. min(P, e*250+250)) as request `id` of session
 * "cload-TAG-pS", S = e mod sessions. */
static void put_prefill(buf_t *out, const opts_t *o, long e, long sessions, uint32_t id) {
    char session[80], var[80];
    long first = e * PREFILL_BATCH, last = first + PREFILL_BATCH;
    if (last > o->prefill) last = o->prefill;
    session_name(session, sizeof session, o->tag, 'p', e % sessions);
    size_t at = frame_begin(out);
    mp_map(out, 6);
    mp_cstr(out, "type");
    mp_cstr(out, "execute");
    mp_cstr(out, "id");
    mp_u32(out, id);
    mp_cstr(out, "session");
    mp_cstr(out, session);
    mp_cstr(out, "max_age");
    mp_uint(out, MAX_AGE);
    mp_cstr(out, "namespace");
    mp_cstr(out, NAMESPACE);
    mp_cstr(out, "statements");
    mp_array(out, (uint32_t)(last - first));
    for (long i = first; i < last; i++) {
        snprintf(var, sizeof var, "%s.p.%0*ld", o->tag, DIGITS, i);
        mp_array(out, 2);
        mp_cstr(out, "Assert");
        mp_array(out, 3);
        mp_cstr(out, "SetVar");
        mp_cstr(out, TABLE);
        mp_cstr(out, var);
    }
    frame_end(out, at);
}

static void put_hello(buf_t *out) {
    size_t at = frame_begin(out);
    mp_map(out, 4);
    mp_cstr(out, "type");
    mp_cstr(out, "hello");
    mp_cstr(out, "id");
    mp_uint(out, 0);
    mp_cstr(out, "version");
    mp_uint(out, 1);
    mp_cstr(out, "client");
    mp_cstr(out, "cload");
    frame_end(out, at);
}

static void put_resp(buf_t *out, int argc, const char **argv) {
    char head[32];
    buf_put(out, head, (size_t)snprintf(head, sizeof head, "*%d\r\n", argc));
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]);
        buf_put(out, head, (size_t)snprintf(head, sizeof head, "$%zu\r\n", n));
        buf_put(out, argv[i], n);
        buf_put(out, "\r\n", 2);
    }
}

/* ---------------------------------------------------------------- errors, kept for the report */

static uint64_t g_errors;
static char g_samples[MAX_SAMPLES][320];
static int g_nsamples;
static char g_fatal[320];

static void error_at(const char *fmt, ...) {
    g_errors++;
    if (g_nsamples >= MAX_SAMPLES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_samples[g_nsamples++], sizeof g_samples[0], fmt, ap);
    va_end(ap);
}

static void fatal_at(const char *fmt, ...) {
    if (g_fatal[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_fatal, sizeof g_fatal, fmt, ap);
    va_end(ap);
}

/* What a wrong reply said, for the error samples. */
static void describe(const reply_t *r, const char *what, char *out, size_t n) {
    if (!strcmp(r->type, "error"))
        snprintf(out, n, "%s: error %" PRId64 " %.*s: %.*s", what, r->code, (int)r->name_len,
                 r->name ? r->name : "", (int)(r->message_len > 200 ? 200 : r->message_len),
                 r->message ? r->message : "");
    else if (!strcmp(r->type, "result"))
        snprintf(out, n, "%s: result status %" PRId64 " cause %" PRId64 " failed %.*s", what,
                 r->status, r->cause, (int)r->failed_len, r->failed ? r->failed : "nil");
    else
        snprintf(out, n, "%s: unexpected message of type '%s'", what, r->type);
}

/* ---------------------------------------------------------------- connections */

typedef struct {
    int64_t start_ns; /* when it was sent (closed loop) or due (paced) */
    int64_t sent_ns;  /* when it was written */
    uint64_t id;
    bool used, measured;
} slot_t;

typedef struct {
    int fd, index;
    bool prefill;
    buf_t rbuf, wbuf;
    size_t roff;
    bool want_out, closed;
    uint64_t sent, answered; /* requests sent, replies read */
    int inflight;
    slot_t *ring; /* in flight, by id (lockserver) or by order (Redis) */
    uint32_t mask;
    tmpl_t tmpl;
    long next_exec; /* prefill: the next execute this connection sends */
    int64_t arrived_ns; /* kernel arrival of the data last read (monotonic), 0: unknown */
    int64_t freed_ns;   /* when a reply last freed a slot */
} conn_t;

static int g_epoll = -1;
static int64_t g_real_offset; /* realtime - monotonic, taken again every 100 ms */

static void set_nonblock(int fd, bool on) {
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

static int connect_to(const opts_t *o) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1)
        die(2, "--host: an IPv4 address, not '%s'", o->host);
    if ((ntohl(sa.sin_addr.s_addr) >> 24) != 127) die(2, "refusing to send load off loopback");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die(2, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa))
        die(2, "connect %s:%d: %s", o->host, o->port, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    return fd;
}

static void conn_init(conn_t *c, int fd, int index, int depth) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->index = index;
    uint32_t size = 1;
    while (size < (uint32_t)depth) size <<= 1;
    c->ring = calloc(size, sizeof *c->ring);
    if (c->ring == NULL) die(2, "out of memory");
    c->mask = size - 1;
}

/* Read what the socket has into rbuf; the kernel's arrival stamp of it. 1: data, 0: none
 * now, -1: closed or failed. */
static int conn_fill(conn_t *c) {
    if (c->roff > 0 && c->roff == c->rbuf.len) c->rbuf.len = c->roff = 0;
    if (c->roff > (1u << 20)) {
        memmove(c->rbuf.p, c->rbuf.p + c->roff, c->rbuf.len - c->roff);
        c->rbuf.len -= c->roff;
        c->roff = 0;
    }
    buf_reserve(&c->rbuf, RECV_SIZE);
    struct iovec iov = {c->rbuf.p + c->rbuf.len, RECV_SIZE};
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n = recvmsg(c->fd, &msg, 0);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (n == 0) return -1;
    c->rbuf.len += (size_t)n;
    c->arrived_ns = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(cm), sizeof ts);
            c->arrived_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec - g_real_offset;
        }
    }
    return 1;
}

/* The next whole lockserver frame in rbuf: 1 and its payload, 0 when incomplete. */
static int next_frame(conn_t *c, const uint8_t **p, size_t *len) {
    size_t have = c->rbuf.len - c->roff;
    if (have < 4) return 0;
    const uint8_t *h = c->rbuf.p + c->roff;
    size_t n = ((size_t)h[0] << 24) | ((size_t)h[1] << 16) | ((size_t)h[2] << 8) | h[3];
    if (have < 4 + n) return 0;
    *p = h + 4;
    *len = n;
    c->roff += 4 + n;
    return 1;
}

/* The next whole RESP reply: 1 with its first line's type and the integer or the text of
 * it, 0 when incomplete, -1 when malformed. Bulk and array replies are skipped whole. */
static int resp_value(const uint8_t *p, const uint8_t *end, const uint8_t **next, int depth) {
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL) return 0;
    if (nl == p || nl[-1] != '\r' || depth > 8) return -1;
    char t = (char)p[0];
    long long n = strtoll((const char *)p + 1, NULL, 10);
    const uint8_t *q = nl + 1;
    if (t == '$' && n >= 0) {
        if (end - q < n + 2) return 0;
        q += n + 2;
    } else if (t == '*') {
        for (long long i = 0; i < n; i++) {
            int got = resp_value(q, end, &q, depth + 1);
            if (got <= 0) return got;
        }
    } else if (t != '+' && t != '-' && t != ':' && t != '$') {
        return -1;
    }
    *next = q;
    return 1;
}

static void conn_flush(conn_t *c) {
    size_t done = 0;
    while (done < c->wbuf.len) {
        ssize_t n = send(c->fd, c->wbuf.p + done, c->wbuf.len - done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            fatal_at("send on connection %d: %s", c->index, strerror(errno));
            c->closed = true;
            return;
        }
        done += (size_t)n;
    }
    if (done) {
        memmove(c->wbuf.p, c->wbuf.p + done, c->wbuf.len - done);
        c->wbuf.len -= done;
    }
    bool want = c->wbuf.len > 0;
    if (want != c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(g_epoll, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = want;
    }
}

static void conn_watch(conn_t *c) {
    set_nonblock(c->fd, true);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(g_epoll, EPOLL_CTL_ADD, c->fd, &ev)) die(2, "epoll_ctl: %s", strerror(errno));
}

/* Blocking read of one frame (handshake), up to 10 s. */
static void read_frame_blocking(conn_t *c, const uint8_t **p, size_t *len, const char *what) {
    int64_t deadline = mono_ns() + 10000000000LL;
    while (!next_frame(c, p, len)) {
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int left = (int)((deadline - mono_ns()) / 1000000);
        if (left <= 0 || poll(&pfd, 1, left) <= 0) die(2, "%s: no answer within 10 s", what);
        if (conn_fill(c) < 0) die(2, "%s: the server closed the connection", what);
    }
}

/* The limits a welcome announced (-1: not said). */
typedef struct {
    int64_t max_entries_per_session, max_entries, max_ops;
} limits_t;

static void hello(conn_t *c, limits_t *lim) {
    buf_t out = {0};
    put_hello(&out);
    if (send(c->fd, out.p, out.len, MSG_NOSIGNAL) != (ssize_t)out.len)
        die(2, "hello: send failed: %s", strerror(errno));
    free(out.p);
    const uint8_t *p;
    size_t len;
    read_frame_blocking(c, &p, &len, "hello");
    reply_t r;
    if (parse_reply(p, len, &r)) die(2, "hello: the answer is not one msgpack map");
    if (strcmp(r.type, "welcome") || !r.has_id || r.id != 0) {
        char why[320];
        describe(&r, "hello", why, sizeof why);
        die(2, "%s", why);
    }
    lim->max_entries_per_session = lim->max_entries = lim->max_ops = -1;
    rd_t rd = {p, p + len};
    uint32_t n, m;
    mp_read_map(&rd, &n);
    for (uint32_t i = 0; i < n; i++) {
        const char *k;
        uint32_t kn;
        mp_read_str(&rd, &k, &kn);
        if (!str_is(k, kn, "limits") || mp_read_map(&rd, &m)) {
            mp_skip(&rd, 0);
            continue;
        }
        for (uint32_t j = 0; j < m; j++) {
            uint64_t u;
            int kind;
            if (mp_read_str(&rd, &k, &kn)) return;
            if ((kind = mp_read_int(&rd, &u)) != INT_UINT) continue;
            if (str_is(k, kn, "max_entries_per_session")) lim->max_entries_per_session = (int64_t)u;
            else if (str_is(k, kn, "max_entries")) lim->max_entries = (int64_t)u;
            else if (str_is(k, kn, "max_ops")) lim->max_ops = (int64_t)u;
        }
    }
}

static const char *g_sha;

static void redis_load_script(conn_t *c) {
    static char sha[41];
    buf_t out = {0};
    const char *argv[] = {"SCRIPT", "LOAD", REDIS_SCRIPT};
    put_resp(&out, 3, argv);
    if (send(c->fd, out.p, out.len, MSG_NOSIGNAL) != (ssize_t)out.len)
        die(2, "SCRIPT LOAD: send failed");
    free(out.p);
    int64_t deadline = mono_ns() + 10000000000LL;
    for (;;) {
        const uint8_t *next, *p = c->rbuf.p + c->roff, *end = c->rbuf.p + c->rbuf.len;
        int got = c->rbuf.len > c->roff ? resp_value(p, end, &next, 0) : 0;
        if (got < 0) die(2, "SCRIPT LOAD: malformed answer");
        if (got > 0) {
            if (p[0] != '$' || next - p != 5 + 40 + 2 || memcmp(p, "$40\r\n", 5))
                die(2, "SCRIPT LOAD failed: %.*s", (int)(next - p > 200 ? 200 : next - p), p);
            memcpy(sha, p + 5, 40);
            c->roff += (size_t)(next - p);
            g_sha = sha;
            return;
        }
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int left = (int)((deadline - mono_ns()) / 1000000);
        if (left <= 0 || poll(&pfd, 1, left) <= 0) die(2, "SCRIPT LOAD: no answer");
        if (conn_fill(c) < 0) die(2, "SCRIPT LOAD: the server closed the connection");
    }
}

/* ---------------------------------------------------------------- measurements */

static double proc_cpu_s(int pid) {
    if (pid <= 0) return NAN;
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return NAN;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *p = strrchr(text, ')'); /* the command may hold spaces and parentheses */
    if (p == NULL) return NAN;
    unsigned long long ut = 0, st = 0;
    /* after ")": state (3), then fields 4..13, utime (14), stime (15) */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Every CPU's busy time since boot (user + nice + system + irq + softirq + steal of
 * /proc/stat): over the window, less the server's and this process's, it is what else ran. */
static double machine_busy_s(double *steal) {
    *steal = NAN;
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) return NAN;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8) return NAN;
    double tick = (double)sysconf(_SC_CLK_TCK);
    *steal = (double)v[7] / tick; /* the hypervisor ran something else on our vCPUs */
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
}

/* Times this process was switched out while it could run: another task took its CPU. */
static long self_nivcsw(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nivcsw;
}

static double self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

typedef struct {
    hist_t hist;
    int64_t *window_max; /* per --window slice of the measurement, ns */
    int windows;
    int64_t arrival_max_ns, read_delay_max_ns, send_late_max_ns, turnaround_max_ns;
    uint64_t tx, replies, drained, acquired_total, sent_total, granted_at_worst;
    int64_t worst_at_ns;
} stats_t;

static stats_t g_st;
static double g_server_cpu_s = NAN, g_client_cpu_s = NAN, g_machine_busy_s = NAN;
static double g_steal_s = NAN;
static long g_nivcsw = -1;
static const char *g_stopped_by = "duration";

/* ---------------------------------------------------------------- epoll wait, ns timeout */

static int wait_events(struct epoll_event *evs, int max, int64_t timeout_ns) {
    if (timeout_ns < 0) timeout_ns = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    static bool no_pwait2;
    if (!no_pwait2) {
        struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
        int n = epoll_pwait2(g_epoll, evs, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS) return n;
        no_pwait2 = true;
    }
#endif
    return epoll_wait(g_epoll, evs, max, (int)((timeout_ns + 999999) / 1000000));
}

/* ---------------------------------------------------------------- prefill */

/* Hold `prefill` entries: 16 connections (fewer for a small prefill), two executes of 250
 * statements in flight each; every reply checked. 0, or -1 when it failed. */
static int prefill(const opts_t *o, double *seconds, double *server_cpu, long *sessions_out) {
    long execs = (o->prefill + PREFILL_BATCH - 1) / PREFILL_BATCH;
    long sessions = execs < PREFILL_SESSIONS ? execs : PREFILL_SESSIONS;
    *sessions_out = sessions;
    if (execs == 0) return 0;
    conn_t *cs = calloc((size_t)sessions, sizeof *cs);
    if (cs == NULL) die(2, "out of memory");
    limits_t lim;
    for (long s = 0; s < sessions; s++) {
        conn_init(&cs[s], connect_to(o), (int)s, PREFILL_DEPTH);
        cs[s].prefill = true;
        cs[s].next_exec = s;
        hello(&cs[s], &lim);
        if (s == 0) {
            long need = 0; /* session 0's: the most, as every execute but the last is full */
            for (long e = 0; e < execs; e += sessions)
                need += e * PREFILL_BATCH + PREFILL_BATCH <= o->prefill ? PREFILL_BATCH
                                                                       : o->prefill - e * PREFILL_BATCH;
            if (lim.max_entries_per_session >= 0 && lim.max_entries_per_session < need)
                die(2, "the server allows %" PRId64 " entries per session; the prefill puts up "
                       "to %ld in each of its %ld sessions: start it with "
                       "--max-entries-per-session %ld or more, or prefill less",
                    lim.max_entries_per_session, need, sessions, need);
            if (lim.max_entries >= 0 && lim.max_entries < o->prefill)
                die(2, "the server holds at most %" PRId64 " entries (--max-entries): prefill "
                       "less", lim.max_entries);
            if (lim.max_ops >= 0 && lim.max_ops < 2 * PREFILL_BATCH)
                die(2, "the server takes %" PRId64 " ops per transaction (--max-ops); the "
                       "prefill's executes have %d", lim.max_ops, 2 * PREFILL_BATCH);
        }
        conn_watch(&cs[s]);
    }
    double cpu0 = proc_cpu_s(o->stat_pid);
    int64_t t0 = mono_ns();
    long busy = 0;
    for (long s = 0; s < sessions; s++) {
        while (cs[s].inflight < PREFILL_DEPTH && cs[s].next_exec < execs) {
            uint32_t id = (uint32_t)(++cs[s].sent);
            put_prefill(&cs[s].wbuf, o, cs[s].next_exec, sessions, id);
            cs[s].ring[id & cs[s].mask] = (slot_t){0, 0, id, true, false};
            cs[s].inflight++;
            cs[s].next_exec += sessions;
        }
        busy += cs[s].inflight > 0;
        conn_flush(&cs[s]);
    }
    struct epoll_event evs[64];
    int64_t deadline = t0 + 600000000000LL; /* 10 minutes: a bound, not an expectation */
    while (busy > 0 && !g_fatal[0] && g_errors == 0) {
        if (mono_ns() > deadline) { fatal_at("the prefill took over 600 s"); break; }
        int n = wait_events(evs, 64, 100000000);
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (evs[i].events & EPOLLOUT) conn_flush(c);
            if (!(evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
            if (conn_fill(c) < 0) { fatal_at("the server closed a prefill connection"); break; }
            const uint8_t *p;
            size_t len;
            while (next_frame(c, &p, &len)) {
                reply_t r;
                if (parse_reply(p, len, &r)) { fatal_at("prefill: a reply is not one msgpack map"); break; }
                slot_t *sl = r.has_id ? &c->ring[r.id & c->mask] : NULL;
                bool ours = sl && sl->used && sl->id == r.id;
                if (!strcmp(r.type, "result") && ours && r.status == STATUS_OK) {
                    sl->used = false;
                    c->inflight--;
                } else {
                    char why[320];
                    describe(&r, "prefill execute", why, sizeof why);
                    error_at("%s%s", why, ours || strcmp(r.type, "result") ? "" : " (id not in flight)");
                    if (ours) { sl->used = false; c->inflight--; }
                }
                if (c->inflight < PREFILL_DEPTH && c->next_exec < execs) {
                    uint32_t id = (uint32_t)(++c->sent);
                    put_prefill(&c->wbuf, o, c->next_exec, sessions, id);
                    c->ring[id & c->mask] = (slot_t){0, 0, id, true, false};
                    c->inflight++;
                    c->next_exec += sessions;
                }
                if (c->inflight == 0) busy--;
            }
            conn_flush(c);
        }
    }
    *seconds = (double)(mono_ns() - t0) / 1e9;
    *server_cpu = proc_cpu_s(o->stat_pid) - cpu0;
    for (long s = 0; s < sessions; s++) close(cs[s].fd); /* the sessions live on (max_age) */
    return g_fatal[0] || g_errors ? -1 : 0;
}

/* ---------------------------------------------------------------- the load */

typedef struct {
    const opts_t *o;
    conn_t *cs;
    int n;
    bool paced, sending;
    int64_t t0, measure_at, end_at;
    double period_ns; /* paced: between two sends of all connections together */
} load_t;

static int64_t due_ns(const load_t *L, const conn_t *c) {
    return L->t0 + (int64_t)(((double)c->index + (double)c->sent * L->n) * L->period_ns);
}

static void send_one(load_t *L, conn_t *c, int64_t now) {
    uint64_t k = c->sent++;
    uint32_t id = (uint32_t)(k + 1); /* hello was 0 */
    put_acquire(&c->wbuf, &c->tmpl, k, id, L->o->redis);
    int64_t start = now;
    if (L->paced) {
        int64_t due = L->t0 + (int64_t)(((double)c->index + (double)k * L->n) * L->period_ns);
        start = due;
        /* A slot was free when it fell due: any lateness is this client's own (its timer,
         * its scheduling), shown apart. (A request due while every slot was taken waited
         * for the server: that is latency, not lateness.) */
        if (c->freed_ns <= due && due >= L->measure_at && now - due > g_st.send_late_max_ns)
            g_st.send_late_max_ns = now - due;
    }
    slot_t *sl = &c->ring[(L->o->redis ? k : id) & c->mask];
    if (sl->used) fatal_at("internal: slot in use");
    *sl = (slot_t){start, now, L->o->redis ? k : id, true, start >= L->measure_at};
    c->inflight++;
    g_st.sent_total++;
}

static void on_reply(load_t *L, conn_t *c, slot_t *sl, bool ok, int64_t now) {
    sl->used = false;
    c->inflight--;
    c->answered++;
    c->freed_ns = now;
    g_st.acquired_total += ok;
    /* tx: replies that came in the window, whenever sent; latency: requests sent (or due) in
     * the window, whenever answered. */
    bool in_window = L->sending && now >= L->measure_at && now <= L->end_at;
    if (in_window) {
        g_st.replies++;
        g_st.tx += ok;
    }
    if (!sl->measured) return;
    if (!in_window) g_st.drained++;
    int64_t lat = now - sl->start_ns;
    if (lat > 0 && (uint64_t)lat > g_st.hist.max_ns) {
        /* When, and at what size of the table (this run's entries, all in one table). */
        g_st.worst_at_ns = now - L->measure_at;
        g_st.granted_at_worst = g_st.acquired_total;
    }
    hist_record(&g_st.hist, lat);
    int w = (int)((now - L->measure_at) / (int64_t)(L->o->window * 1e9));
    if (w >= g_st.windows) w = g_st.windows - 1;
    if (w < 0) w = 0;
    if (lat > g_st.window_max[w]) g_st.window_max[w] = lat;
    if (c->arrived_ns > 0) {
        if (c->arrived_ns - sl->start_ns > g_st.arrival_max_ns)
            g_st.arrival_max_ns = c->arrived_ns - sl->start_ns;
        if (c->arrived_ns - sl->sent_ns > g_st.turnaround_max_ns)
            g_st.turnaround_max_ns = c->arrived_ns - sl->sent_ns;
        if (now - c->arrived_ns > g_st.read_delay_max_ns)
            g_st.read_delay_max_ns = now - c->arrived_ns;
    }
}

/* Check every whole reply a connection has; -1 when the connection cannot go on. */
static int read_replies(load_t *L, conn_t *c, int64_t now) {
    char why[320];
    if (L->o->redis) {
        for (;;) {
            const uint8_t *next, *p = c->rbuf.p + c->roff, *end = c->rbuf.p + c->rbuf.len;
            if (p == end) return 0;
            int got = resp_value(p, end, &next, 0);
            if (got == 0) return 0;
            if (got < 0) { fatal_at("redis: a malformed reply"); return -1; }
            c->roff += (size_t)(next - p);
            slot_t *sl = &c->ring[c->answered & c->mask];
            if (c->inflight == 0 || !sl->used || sl->id != c->answered) {
                error_at("redis: a reply with no request in flight");
                return -1;
            }
            bool ok = next - p == 4 && !memcmp(p, ":1\r\n", 4);
            if (!ok)
                error_at("redis EVALSHA: %.*s", (int)(next - p > 200 ? 200 : next - p - 2), p);
            on_reply(L, c, sl, ok, now);
        }
    }
    const uint8_t *p;
    size_t len;
    while (next_frame(c, &p, &len)) {
        reply_t r;
        if (parse_reply(p, len, &r)) {
            error_at("a reply that is not exactly one msgpack map (%zu bytes)", len);
            return -1; /* the stream cannot be trusted past it */
        }
        slot_t *sl = r.has_id ? &c->ring[r.id & c->mask] : NULL;
        bool ours = sl && sl->used && sl->id == r.id;
        bool ok = ours && !strcmp(r.type, "result") && r.status == STATUS_OK;
        if (!ok) {
            describe(&r, "acquire", why, sizeof why);
            if (!ours && r.has_id)
                error_at("%s (id %" PRIu64 " is not in flight on connection %d)", why, r.id, c->index);
            else
                error_at("%s", why);
        }
        if (ours) on_reply(L, c, sl, ok, now);
    }
    return 0;
}

static void top_up(load_t *L, conn_t *c, int64_t now) {
    int depth = L->o->depth;
    while (L->sending && c->inflight < depth) {
        if (L->paced && due_ns(L, c) > now) break;
        send_one(L, c, now);
    }
}

static void run_load(load_t *L) {
    const opts_t *o = L->o;
    struct epoll_event evs[256];
    int64_t now = mono_ns();
    L->sending = true;
    L->t0 = now;
    L->measure_at = now + (int64_t)(o->warmup * 1e9);
    L->end_at = L->measure_at + (int64_t)(o->duration * 1e9);
    L->paced = o->rate > 0;
    L->period_ns = L->paced ? 1e9 / o->rate : 0;
    double slices = o->duration / o->window - 1e-9;
    g_st.windows = (int)slices + ((double)(int)slices < slices ? 1 : 0);
    if (g_st.windows < 1) g_st.windows = 1;
    g_st.window_max = calloc((size_t)g_st.windows, sizeof(int64_t));
    double cpu0 = NAN, self0 = 0, busy0 = NAN, steal0 = NAN, steal1;
    long nivcsw0 = 0;
    bool measuring = false;
    int64_t next_resync = now + 100000000;
    int64_t drain_until = 0;
    for (int i = 0; i < L->n; i++) {
        top_up(L, &L->cs[i], now);
        conn_flush(&L->cs[i]);
    }
    for (;;) {
        now = mono_ns();
        if (!measuring && now >= L->measure_at) {
            measuring = true;
            cpu0 = proc_cpu_s(o->stat_pid);
            self0 = self_cpu_s();
            busy0 = machine_busy_s(&steal0);
            nivcsw0 = self_nivcsw();
        }
        if (L->sending) {
            const char *why = NULL;
            if (now >= L->end_at) why = "duration";
            else if (g_st.replies >= o->count) why = "count";
            else if (g_errors >= o->max_errors) why = "errors";
            else if (g_fatal[0]) why = "fatal";
            if (why) {
                L->sending = false;
                if (now < L->end_at) L->end_at = now;
                if (!measuring) {
                    measuring = true;
                    cpu0 = proc_cpu_s(o->stat_pid);
                    self0 = self_cpu_s();
                    busy0 = machine_busy_s(&steal0);
                    nivcsw0 = self_nivcsw();
                }
                g_server_cpu_s = proc_cpu_s(o->stat_pid) - cpu0;
                g_client_cpu_s = self_cpu_s() - self0;
                g_machine_busy_s = machine_busy_s(&steal1) - busy0;
                g_steal_s = steal1 - steal0;
                g_nivcsw = self_nivcsw() - nivcsw0;
                g_stopped_by = why;
                drain_until = now + DRAIN_NS;
            }
        }
        if (!L->sending) {
            int left = 0;
            for (int i = 0; i < L->n; i++) left += L->cs[i].closed ? 0 : L->cs[i].inflight;
            if (left == 0 || now >= drain_until || g_fatal[0]) break;
        }
        if (now >= next_resync) {
            g_real_offset = real_ns() - mono_ns();
            next_resync = now + 100000000;
        }
        int64_t timeout = (L->sending ? (measuring ? L->end_at : L->measure_at) : drain_until) - now;
        if (timeout > 100000000) timeout = 100000000;
        if (L->paced && L->sending) {
            for (int i = 0; i < L->n; i++) {
                conn_t *c = &L->cs[i];
                if (c->inflight >= o->depth) continue;
                int64_t due = due_ns(L, c);
                if (due <= now) {
                    top_up(L, c, now);
                    conn_flush(c);
                } else if (due - now < timeout) {
                    timeout = due - now;
                }
            }
        }
        int n = wait_events(evs, 256, o->spin ? 0 : timeout);
        if (n < 0 && errno != EINTR) { fatal_at("epoll_wait: %s", strerror(errno)); break; }
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c->closed) continue;
            if (evs[i].events & EPOLLOUT) conn_flush(c);
            if (!(evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
            int got = conn_fill(c);
            int64_t t = mono_ns();
            if (got < 0) {
                fatal_at("the server closed connection %d (%d requests in flight)", c->index, c->inflight);
                c->closed = true;
                continue;
            }
            if (read_replies(L, c, t) < 0) {
                fatal_at("connection %d: a reply could not be matched: stopped", c->index);
                c->closed = true;
                continue;
            }
            top_up(L, c, t);
            conn_flush(c);
        }
    }
}

/* ---------------------------------------------------------------- output */

static void json_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void json_num(const char *key, double v, bool comma) {
    printf("\"%s\": ", key);
    if (isnan(v)) printf("null");
    else printf("%.3f", v);
    if (comma) printf(", ");
}

static void report(const opts_t *o, double elapsed, double prefill_s, double prefill_cpu,
                   long prefill_sessions, uint64_t unanswered) {
    const hist_t *h = &g_st.hist;
    printf("{\"tool\": \"cload\", \"target\": \"%s\", \"shape\": \"%s\", ", o->target,
           SHAPES[o->shape]);
    printf("\"host\": \"%s\", \"port\": %d, \"tag\": ", o->host, o->port);
    json_str(o->tag, strlen(o->tag));
    printf(", \"connections\": %d, \"depth\": %d, \"spin\": %s, ", o->conns, o->depth,
           o->spin ? "true" : "false");
    if (o->rate > 0) printf("\"rate\": %.3f, ", o->rate);
    else printf("\"rate\": null, ");
    printf("\"duration\": %.3f, \"warmup\": %.3f, \"window\": %.3f, \"count\": %" PRIu64 ", ",
           o->duration, o->warmup, o->window, o->count);
    printf("\"prefill\": %ld, \"prefill_sessions\": %ld, \"prefill_batch\": %d, ", o->prefill,
           prefill_sessions, PREFILL_BATCH);
    json_num("prefill_s", prefill_s, true);
    json_num("prefill_server_cpu_s", prefill_cpu, true);
    printf("\"stopped_by\": \"%s\", ", g_stopped_by);
    json_num("elapsed_s", elapsed, true);
    printf("\"tx\": %" PRIu64 ", \"replies\": %" PRIu64 ", ", g_st.tx, g_st.replies);
    json_num("tx_per_s", elapsed > 0 ? (double)g_st.tx / elapsed : NAN, true);
    printf("\"latency_count\": %" PRIu64 ", ", h->n);
    json_num("mean_us", h->n ? (double)h->sum_ns / (double)h->n / 1000.0 : NAN, true);
    json_num("p50_us", hist_pct_us(h, 50), true);
    json_num("p90_us", hist_pct_us(h, 90), true);
    json_num("p99_us", hist_pct_us(h, 99), true);
    json_num("p999_us", hist_pct_us(h, 99.9), true);
    json_num("worst_us", (double)h->max_ns / 1000.0, true);
    json_num("worst_at_s", (double)g_st.worst_at_ns / 1e9, true);
    printf("\"entries_at_worst\": %" PRIu64 ", ", (uint64_t)o->prefill + g_st.granted_at_worst);
    printf("\"worst_per_window_us\": [");
    for (int w = 0; w < g_st.windows; w++)
        printf("%s%.3f", w ? ", " : "", (double)g_st.window_max[w] / 1000.0);
    printf("], ");
    json_num("arrival_worst_us", (double)g_st.arrival_max_ns / 1000.0, true);
    json_num("send_to_arrival_worst_us", (double)g_st.turnaround_max_ns / 1000.0, true);
    json_num("read_delay_max_us", (double)g_st.read_delay_max_ns / 1000.0, true);
    json_num("send_late_max_us", o->rate > 0 ? (double)g_st.send_late_max_ns / 1000.0 : NAN, true);
    printf("\"sent_total\": %" PRIu64 ", \"acquired_total\": %" PRIu64 ", ", g_st.sent_total,
           g_st.acquired_total);
    printf("\"drained\": %" PRIu64 ", \"unanswered\": %" PRIu64 ", ", g_st.drained, unanswered);
    if (o->stat_pid > 0) printf("\"stat_pid\": %d, ", o->stat_pid);
    else printf("\"stat_pid\": null, ");
    json_num("server_cpu_s", g_server_cpu_s, true);
    json_num("server_cpu_us_per_tx", g_st.tx ? g_server_cpu_s * 1e6 / (double)g_st.tx : NAN, true);
    json_num("client_cpu_s", g_client_cpu_s, true);
    json_num("client_cpu_us_per_tx", g_st.tx ? g_client_cpu_s * 1e6 / (double)g_st.tx : NAN, true);
    json_num("machine_busy_s", g_machine_busy_s, true);
    json_num("machine_steal_s", g_steal_s, true);
    printf("\"client_preempted\": %ld, ", g_nivcsw);
    /* What ran besides the server and this client (clock-tick granularity: +-0.02 s). */
    json_num("other_cpu_s", g_machine_busy_s - g_client_cpu_s -
                                (isnan(g_server_cpu_s) ? 0 : g_server_cpu_s), true);
    printf("\"errors\": %" PRIu64 ", \"error_samples\": [", g_errors);
    for (int i = 0; i < g_nsamples; i++) {
        if (i) printf(", ");
        json_str(g_samples[i], strlen(g_samples[i]));
    }
    printf("], \"fatal\": ");
    if (g_fatal[0]) json_str(g_fatal, strlen(g_fatal));
    else printf("null");
    printf("}\n");
    fflush(stdout);
}

/* Sample frames for tests: hello; prefill executes 0 and 1 of --prefill entries (16
 * sessions); acquires (connection, k) = (0, 0), (0, 1), (1, 0), (3, 12345),
 * (3, 9999999999), (3, 10000000001); all lockserver frames, concatenated. */
static void dump(const opts_t *o) {
    static const struct { int c; uint64_t k; } ACQ[] = {
        {0, 0}, {0, 1}, {1, 0}, {3, 12345}, {3, 9999999999ULL}, {3, 10000000001ULL}};
    opts_t d = *o;
    if (d.prefill <= 0) d.prefill = 600;
    long execs = (d.prefill + PREFILL_BATCH - 1) / PREFILL_BATCH;
    long sessions = execs < PREFILL_SESSIONS ? execs : PREFILL_SESSIONS;
    buf_t out = {0};
    put_hello(&out);
    put_prefill(&out, &d, 0, sessions, 1);
    put_prefill(&out, &d, execs > 1 ? 1 : 0, sessions, 2);
    for (size_t i = 0; i < sizeof ACQ / sizeof ACQ[0]; i++) {
        tmpl_t t;
        make_template(&t, &d, ACQ[i].c, NULL);
        put_acquire(&out, &t, ACQ[i].k, (uint32_t)(ACQ[i].k + 1), false);
        free(t.b.p);
    }
    FILE *f = fopen(o->dump, "wb");
    if (f == NULL || fwrite(out.p, 1, out.len, f) != out.len || fclose(f))
        die(2, "--dump %s: %s", o->dump, strerror(errno));
}

int main(int argc, char **argv) {
    opts_t o;
    parse_opts(argc, argv, &o);
    signal(SIGPIPE, SIG_IGN);
    if (o.dump) {
        dump(&o);
        return 0;
    }
    g_epoll = epoll_create1(EPOLL_CLOEXEC);
    if (g_epoll < 0) die(2, "epoll_create1: %s", strerror(errno));
    g_real_offset = real_ns() - mono_ns();
    double prefill_s = 0, prefill_cpu = NAN;
    long prefill_sessions = 0;
    load_t L = {.o = &o, .n = o.conns};
    L.cs = calloc((size_t)o.conns, sizeof *L.cs);
    if (L.cs == NULL) die(2, "out of memory");
    bool failed = o.prefill > 0 && prefill(&o, &prefill_s, &prefill_cpu, &prefill_sessions) < 0;
    if (failed) g_stopped_by = "prefill";
    if (!failed) {
        limits_t lim;
        for (int i = 0; i < o.conns; i++) {
            conn_init(&L.cs[i], connect_to(&o), i, o.depth);
            if (o.redis) {
                if (i == 0) redis_load_script(&L.cs[0]);
            } else {
                hello(&L.cs[i], &lim);
            }
            make_template(&L.cs[i].tmpl, &o, i, g_sha);
        }
        for (int i = 0; i < o.conns; i++) conn_watch(&L.cs[i]);
        run_load(&L);
    }
    uint64_t unanswered = 0;
    for (int i = 0; i < o.conns; i++) unanswered += (uint64_t)L.cs[i].inflight;
    double elapsed = failed ? 0 : (double)(L.end_at - L.measure_at) / 1e9;
    if (elapsed < 0) elapsed = 0;
    report(&o, elapsed, prefill_s, prefill_cpu, prefill_sessions, unanswered);
    return g_errors || g_fatal[0] ? 1 : 0;
}
