/* rpc_bench: RPC round-trip load generator for lmcached.
 *
 * Measures NOOP (op 24) and GET_CHUNK_SIZE (op 21) round trips with 1 and 8
 * clients (one thread and one DEALER socket each), not pipelined (window 1)
 * and pipelined (a window of outstanding requests per client, replies
 * matched by uid).  Every scenario also runs against a bare ROUTER echo
 * server started in a thread of this process: it replies
 * [identity, uid, op, a2 4f 4b] without decoding anything, which is the
 * floor that ZMQ plus these clients can reach on this machine.
 *
 *   rpc_bench --url tcp://127.0.0.1:5555      full benchmark
 *   rpc_bench                                 self-test: target = 2nd echo
 *   rpc_bench --url URL --probe               exit 0 iff URL answers NOOP
 *
 * Exit status: 0 after a completed run (goal misses included), 1 on usage
 * errors or when requests went unanswered. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/zmq_echo.h"
#include "rpc/client.h"
#include "rpc/wire.h"

#define MAX_WINDOW 1024
#define MAX_SCENARIOS 16
#define GOAL_THROUGHPUT 0.8 /* lmcached req/s >= 0.8 x echo */
#define GOAL_P50 1.25       /* lmcached p50 <= 1.25 x echo */

/* ---- options ------------------------------------------------------------- */

typedef struct {
    const char *url;       /* NULL: self-test against a second echo server */
    double duration_s;     /* measured time per scenario and target, all rounds */
    double warmup_s;       /* unrecorded phase before each round */
    uint64_t requests;     /* >0: requests per client and round instead of a duration */
    int rounds;            /* target and echo alternate this many times */
    int window;            /* outstanding requests per client when pipelined */
    int timeout_ms;        /* per reply */
    bool probe;
} bench_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: rpc_bench [--url URL] [--duration S] [--warmup S] [--requests N]\n"
            "                 [--rounds R] [--window W] [--timeout-ms MS] [--probe]\n"
            "  --url URL       lmcached endpoint (default: self-test against an echo)\n"
            "  --duration S    measured seconds per scenario and target (default 2)\n"
            "  --warmup S      warm-up seconds before each round (default 0.2)\n"
            "  --requests N    measure N requests per client and round, not a duration\n"
            "  --rounds R      alternate target and echo R times per scenario (default 3)\n"
            "  --window W      outstanding requests per pipelined client (default 32)\n"
            "  --timeout-ms MS give up on a reply after MS (default 5000)\n"
            "  --probe         send one NOOP to --url; exit 0 iff it answers \"OK\"\n");
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return errno == 0 && end != s && *end == '\0' && *out >= 0;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    *out = strtol(s, &end, 10);
    return errno == 0 && end != s && *end == '\0' && *out >= lo && *out <= hi;
}

static bool apply_opt(bench_opts *o, int c, const char *arg)
{
    long v = 0;
    switch (c) {
    case 'u': o->url = arg; return true;
    case 'd': return parse_double(arg, &o->duration_s) && o->duration_s > 0;
    case 'w': return parse_double(arg, &o->warmup_s);
    case 'n': return parse_long(arg, 1, 1L << 40, &v) && (o->requests = (uint64_t)v, true);
    case 'r': return parse_long(arg, 1, 1000, &v) && (o->rounds = (int)v, true);
    case 'W': return parse_long(arg, 1, MAX_WINDOW, &v) && (o->window = (int)v, true);
    case 't': return parse_long(arg, 1, 600000, &v) && (o->timeout_ms = (int)v, true);
    case 'p': o->probe = true; return true;
    default: return false;
    }
}

/* Returns 0 on success, 1 on a usage error, -1 after --help. */
static int parse_opts(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"url", required_argument, NULL, 'u'},      {"duration", required_argument, NULL, 'd'},
        {"warmup", required_argument, NULL, 'w'},   {"requests", required_argument, NULL, 'n'},
        {"window", required_argument, NULL, 'W'},   {"timeout-ms", required_argument, NULL, 't'},
        {"rounds", required_argument, NULL, 'r'},   {"probe", no_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (bench_opts){.duration_s = 2.0, .warmup_s = 0.2, .rounds = 3, .window = 32,
                      .timeout_ms = 5000};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return -1;
        }
        if (!apply_opt(o, c, optarg)) {
            usage(stderr);
            return 1;
        }
    }
    if (optind != argc || (o->probe && !o->url)) {
        usage(stderr);
        return 1;
    }
    return 0;
}

/* ---- small helpers --------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* msgpack positive int, smallest form (as upstream clients encode uids). */
static size_t pack_uint(uint8_t *buf, uint64_t v)
{
    size_t n;
    if (v < 0x80) {
        buf[0] = (uint8_t)v;
        return 1;
    }
    if (v <= 0xff) {
        buf[0] = 0xcc;
        n = 1;
    } else if (v <= 0xffff) {
        buf[0] = 0xcd;
        n = 2;
    } else if (v <= 0xffffffffu) {
        buf[0] = 0xce;
        n = 4;
    } else {
        buf[0] = 0xcf;
        n = 8;
    }
    for (size_t i = 0; i < n; i++)
        buf[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    return n + 1;
}

static bool unpack_uint(const uint8_t *buf, size_t len, uint64_t *out)
{
    if (len == 1 && buf[0] < 0x80) {
        *out = buf[0];
        return true;
    }
    size_t n = len - 1;
    if (len < 2 || buf[0] < 0xcc || buf[0] > 0xcf || n != (size_t)1 << (buf[0] - 0xcc))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | buf[1 + i];
    *out = v;
    return true;
}

/* Is `buf` one msgpack int (any width)?  What GET_CHUNK_SIZE returns. */
static bool is_msgpack_int(const uint8_t *buf, size_t len)
{
    uint64_t ignored;
    if (len == 1 && (buf[0] < 0x80 || buf[0] >= 0xe0))
        return true;
    if (len >= 2 && buf[0] >= 0xd0 && buf[0] <= 0xd3)
        return len == 1 + ((size_t)1 << (buf[0] - 0xd0));
    return unpack_uint(buf, len, &ignored);
}

/* ---- latency samples ------------------------------------------------------ */

typedef struct {
    uint32_t *ns;  /* saturates at ~4.29 s */
    size_t len, cap;
} lat_buf;

static bool lat_push(lat_buf *b, uint64_t ns)
{
    if (b->len == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 65536;
        uint32_t *p = realloc(b->ns, cap * sizeof *p);
        if (!p)
            return false;
        b->ns = p;
        b->cap = cap;
    }
    b->ns[b->len++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
    return true;
}

static void lat_free(lat_buf *b)
{
    free(b->ns);
    *b = (lat_buf){0};
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Percentile in microseconds of sorted samples. */
static double lat_pct_us(const lat_buf *b, double pct)
{
    if (!b->len)
        return 0;
    size_t i = (size_t)(pct / 100.0 * (double)(b->len - 1) + 0.5);
    return b->ns[i] / 1000.0;
}

/* ---- one client ------------------------------------------------------------ */

typedef struct {
    int op;       /* LMC_OP_NOOP or LMC_OP_GET_CHUNK_SIZE */
    int clients;
    int window;   /* 1 = not pipelined */
} scenario;

typedef struct {
    const char *url;
    bool strict;  /* check the reply body (lmcached); the echo's is fixed */
} target;

typedef struct {
    uint64_t uid;
    uint64_t sent_ns;
    bool busy;
} slot;

/* Holds the client threads until all of them exist (or tells them to quit). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;  /* 0 wait, 1 go, -1 abort */
} start_gate;

static void gate_open(start_gate *g, int state)
{
    pthread_mutex_lock(&g->mu);
    g->state = state;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool gate_wait(start_gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (g->state == 0)
        pthread_cond_wait(&g->cv, &g->mu);
    bool go = g->state > 0;
    pthread_mutex_unlock(&g->mu);
    return go;
}

typedef struct {
    const bench_opts *opts;
    const scenario *sc;
    const target *tg;
    start_gate *gate;
    pthread_barrier_t *barrier;  /* between warm-up and measurement */
    lmc_client *client;
    slot slots[MAX_WINDOW];
    uint64_t next_uid;
    int outstanding;
    lat_buf lat;
    uint64_t done, errors;
    uint64_t start_ns, end_ns;
} client_ctx;

typedef struct {
    uint64_t deadline_ns;  /* 0: no deadline */
    uint64_t max_requests; /* 0: unlimited */
    bool record;
} phase;

static int send_request(client_ctx *c, slot *s)
{
    uint8_t uid[9], op[9];
    size_t ulen = pack_uint(uid, c->next_uid), olen = pack_uint(op, (uint64_t)c->sc->op);
    void *sock = lmc_client_socket(c->client);
    s->uid = c->next_uid++;
    s->sent_ns = now_ns();
    if (zmq_send(sock, uid, ulen, ZMQ_SNDMORE) < 0 || zmq_send(sock, op, olen, 0) < 0)
        return -1;
    s->busy = true;
    c->outstanding++;
    return 0;
}

static bool reply_ok(const client_ctx *c, const uint8_t *body, size_t len, int nframes)
{
    if (nframes < 3)
        return false;
    if (!c->tg->strict)
        return true;
    if (c->sc->op == LMC_OP_NOOP)
        return len == sizeof echo_ok_reply && memcmp(body, echo_ok_reply, len) == 0;
    return is_msgpack_int(body, len);
}

/* Reads one reply: frames [uid, op, body].  Returns the frame count, or -1
 * on timeout/error.  *uid_ok tells whether frame 0 decoded. */
static int recv_reply(void *sock, uint64_t *uid, bool *uid_ok, uint8_t *body, size_t *blen)
{
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            return -1;
        }
        const uint8_t *d = zmq_msg_data(&m);
        size_t len = zmq_msg_size(&m);
        if (n == 0)
            *uid_ok = unpack_uint(d, len, uid);
        else if (n == 2) {
            *blen = len < 16 ? len : 16;
            memcpy(body, d, *blen);
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        n++;
    }
    return n;
}

static slot *find_slot(client_ctx *c, uint64_t uid)
{
    for (int i = 0; i < c->sc->window; i++)
        if (c->slots[i].busy && c->slots[i].uid == uid)
            return &c->slots[i];
    return NULL;
}

/* Waits for one reply and retires its request.  -1 when nothing came. */
static int complete_one(client_ctx *c, const phase *ph)
{
    uint8_t body[16];
    size_t blen = 0;
    uint64_t uid = 0;
    bool uid_ok = false;
    int n = recv_reply(lmc_client_socket(c->client), &uid, &uid_ok, body, &blen);
    if (n < 0)
        return -1;
    uint64_t t = now_ns();
    slot *s = uid_ok ? find_slot(c, uid) : NULL;
    if (!s) {
        c->errors++;  /* a stray reply: keep waiting for ours */
        return 0;
    }
    s->busy = false;
    c->outstanding--;
    if (!reply_ok(c, body, blen, n))
        c->errors++;
    else if (ph->record) {
        c->done++;
        if (!lat_push(&c->lat, t - s->sent_ns))
            return -1;
    }
    return 0;
}

static bool may_send(const phase *ph, uint64_t sent)
{
    if (ph->max_requests && sent >= ph->max_requests)
        return false;
    return !ph->deadline_ns || now_ns() < ph->deadline_ns;
}

/* Keeps the window full until the phase ends, then drains it. */
static int run_phase(client_ctx *c, const phase *ph)
{
    uint64_t sent = 0;
    bool sending = true;
    while (sending || c->outstanding > 0) {
        for (int i = 0; sending && i < c->sc->window; i++) {
            if (c->slots[i].busy)
                continue;
            sending = may_send(ph, sent);
            if (sending && send_request(c, &c->slots[i]) != 0)
                return -1;
            sent += sending;
        }
        if (c->outstanding > 0 && complete_one(c, ph) != 0) {
            c->errors += (uint64_t)c->outstanding;
            return -1;
        }
    }
    return 0;
}

static void *client_main(void *arg)
{
    client_ctx *c = arg;
    const bench_opts *o = c->opts;
    if (!gate_wait(c->gate))
        return NULL;
    phase warm = {.deadline_ns = now_ns() + (uint64_t)(o->warmup_s * 1e9)};
    int rc = run_phase(c, &warm);
    pthread_barrier_wait(c->barrier);
    c->start_ns = now_ns();
    phase meas = {.record = true, .max_requests = o->requests};
    if (!o->requests)
        meas.deadline_ns = c->start_ns + (uint64_t)(o->duration_s / o->rounds * 1e9);
    if (rc == 0)
        run_phase(c, &meas);
    c->end_ns = now_ns();
    return NULL;
}

/* ---- one scenario against one target --------------------------------------- */

typedef struct {
    double rps, p50_us, p99_us;
    uint64_t done, errors;
} result;

/* What the rounds of one scenario against one target add up to. */
typedef struct {
    uint64_t done, errors, elapsed_ns;
    lat_buf lat;
} tally;

static int client_open(client_ctx *c, const target *tg, int timeout_ms)
{
    c->client = lmc_client_connect(tg->url);
    if (!c->client)
        return -1;
    zmq_setsockopt(lmc_client_socket(c->client), ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    return 0;
}

/* Adds one round's clients to the tally. */
static void tally_add(tally *t, const client_ctx *cs, int n)
{
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < n; i++) {
        t->done += cs[i].done;
        t->errors += cs[i].errors;
        t0 = cs[i].start_ns < t0 ? cs[i].start_ns : t0;
        t1 = cs[i].end_ns > t1 ? cs[i].end_ns : t1;
        for (size_t k = 0; k < cs[i].lat.len; k++)
            lat_push(&t->lat, cs[i].lat.ns[k]);
    }
    t->elapsed_ns += t1 > t0 ? t1 - t0 : 0;
}

/* Turns the tally into the reported numbers and frees its samples. */
static result tally_finish(tally *t)
{
    qsort(t->lat.ns, t->lat.len, sizeof *t->lat.ns, cmp_u32);
    result r = {.done = t->done, .errors = t->errors};
    r.rps = t->elapsed_ns ? (double)t->done * 1e9 / (double)t->elapsed_ns : 0;
    r.p50_us = lat_pct_us(&t->lat, 50);
    r.p99_us = lat_pct_us(&t->lat, 99);
    lat_free(&t->lat);
    return r;
}

static void clients_free(client_ctx *cs, int n)
{
    for (int i = 0; i < n; i++) {
        lmc_client_close(cs[i].client);
        lat_free(&cs[i].lat);
    }
    free(cs);
}

/* Opens every client's socket, runs the threads, joins them. */
static int run_clients(client_ctx *cs, const scenario *sc, const target *tg, int timeout_ms)
{
    pthread_t th[64];
    int opened = 0, started = 0;
    while (opened < sc->clients && client_open(&cs[opened], tg, timeout_ms) == 0)
        opened++;
    while (opened == sc->clients && started < sc->clients &&
           pthread_create(&th[started], NULL, client_main, &cs[started]) == 0)
        started++;
    bool ok = started == sc->clients;
    gate_open(cs[0].gate, ok ? 1 : -1);
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    return ok ? 0 : -1;
}

/* One round of a scenario against one target. */
static int run_round(const bench_opts *o, const scenario *sc, const target *tg, tally *out)
{
    start_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_barrier_t barrier;
    client_ctx *cs = calloc((size_t)sc->clients, sizeof *cs);
    if (!cs || pthread_barrier_init(&barrier, NULL, (unsigned)sc->clients) != 0) {
        free(cs);
        return -1;
    }
    for (int i = 0; i < sc->clients; i++)
        cs[i] = (client_ctx){.opts = o, .sc = sc, .tg = tg, .gate = &gate, .barrier = &barrier};
    int rc = run_clients(cs, sc, tg, o->timeout_ms);
    if (rc == 0)
        tally_add(out, cs, sc->clients);
    pthread_barrier_destroy(&barrier);
    clients_free(cs, sc->clients);
    return rc;
}

/* ---- the report -------------------------------------------------------------- */

static const char *op_label(int op)
{
    return op == LMC_OP_NOOP ? "NOOP" : "GET_CHUNK_SIZE";
}

static void scenario_label(const scenario *sc, char *buf, size_t len)
{
    char mode[32];
    if (sc->window == 1)
        snprintf(mode, sizeof mode, "seq");
    else
        snprintf(mode, sizeof mode, "pipe%d", sc->window);
    snprintf(buf, len, "%s %dc %s", op_label(sc->op), sc->clients, mode);
}

static void print_header(const char *target_name)
{
    printf("\n| scenario | %s req/s | echo req/s | thr ratio (goal >=%.2f) "
           "| %s p50 us | echo p50 us | p50 ratio (goal <=%.2f) | %s p99 us | echo p99 us |\n",
           target_name, GOAL_THROUGHPUT, target_name, GOAL_P50, target_name);
    printf("|---|---:|---:|---|---:|---:|---|---:|---:|\n");
}

/* Prints one row; returns true if both goals are met. */
static bool print_row(const scenario *sc, const result *t, const result *e)
{
    char label[64];
    scenario_label(sc, label, sizeof label);
    double thr = e->rps > 0 ? t->rps / e->rps : 0;
    double p50 = e->p50_us > 0 ? t->p50_us / e->p50_us : 0;
    bool thr_ok = thr >= GOAL_THROUGHPUT, p50_ok = p50 > 0 && p50 <= GOAL_P50;
    printf("| %s | %.0f | %.0f | %.2f %s | %.1f | %.1f | %.2f %s | %.1f | %.1f |\n", label,
           t->rps, e->rps, thr, thr_ok ? "PASS" : "MISS", t->p50_us, e->p50_us, p50,
           p50_ok ? "PASS" : "MISS", t->p99_us, e->p99_us);
    return thr_ok && p50_ok;
}

/* ---- main ------------------------------------------------------------------- */

static int build_scenarios(const bench_opts *o, scenario *out)
{
    static const int ops[] = {LMC_OP_NOOP, LMC_OP_GET_CHUNK_SIZE};
    static const int clients[] = {1, 8};
    int n = 0;
    for (int i = 0; i < 2; i++)
        for (int w = 0; w < 2; w++)
            for (int c = 0; c < 2; c++)
                out[n++] = (scenario){ops[i], clients[c], w ? o->window : 1};
    return n;
}

static int probe(const bench_opts *o)
{
    lmc_client *c = lmc_client_connect(o->url);
    if (!c)
        return 1;
    lmc_client_reply r;
    lmc_client_status st = lmc_client_call(c, LMC_OP_NOOP, NULL, 0, o->timeout_ms, &r);
    bool ok = st == LMC_CLIENT_OK && r.has_response && r.len == sizeof echo_ok_reply &&
              memcmp(r.data, echo_ok_reply, r.len) == 0;
    if (st == LMC_CLIENT_OK || st == LMC_CLIENT_REMOTE_ERROR)
        lmc_client_reply_free(&r);
    lmc_client_close(c);
    return ok ? 0 : 1;
}

static void print_config(const bench_opts *o, const char *echo_ep, const char *target_ep)
{
    printf("rpc_bench: target %s%s, echo baseline %s\n", target_ep,
           o->url ? "" : " (self-test: a second echo server)", echo_ep);
    printf("per scenario and target: %d round(s) alternating with the echo, each "
           "%.2f s warm-up + ", o->rounds, o->warmup_s);
    if (o->requests)
        printf("%llu requests per client\n", (unsigned long long)o->requests);
    else
        printf("%.2f s measured\n", o->duration_s / o->rounds);
    printf("pipelined window %d per client; latency = send to its reply\n", o->window);
}

/* Alternates target and echo rounds to spread drift (other load, CPU
 * frequency) over both equally. */
static int run_scenario(const bench_opts *o, const scenario *sc, const target *tg,
                        const target *echo, result out[2])
{
    tally t[2] = {{0}, {0}};
    int rc = 0;
    for (int r = 0; rc == 0 && r < o->rounds; r++)
        for (int k = 0; rc == 0 && k < 2; k++)
            rc = run_round(o, sc, k ? echo : tg, &t[k]);
    out[0] = tally_finish(&t[0]);
    out[1] = tally_finish(&t[1]);
    return rc;
}

/* Runs every scenario against the target and the echo; prints the table. */
static int run_all(const bench_opts *o, const target *tg, const target *echo)
{
    scenario sc[MAX_SCENARIOS];
    result res[MAX_SCENARIOS][2];
    int n = build_scenarios(o, sc), errors = 0, pass = 0;
    for (int i = 0; i < n; i++) {
        char label[64];
        scenario_label(&sc[i], label, sizeof label);
        fprintf(stderr, "running %-26s ...\n", label);
        if (run_scenario(o, &sc[i], tg, echo, res[i]) != 0)
            return -1;
        errors += res[i][0].errors > 0 || res[i][1].errors > 0;
    }
    print_header(o->url ? "lmcached" : "target");
    for (int i = 0; i < n; i++)
        pass += print_row(&sc[i], &res[i][0], &res[i][1]);
    printf("\n%d of %d scenarios meet both goals.\n", pass, n);
    for (int i = 0; i < n; i++)
        if (res[i][0].errors || res[i][1].errors)
            printf("scenario %d: %llu target / %llu echo replies missing or malformed\n", i,
                   (unsigned long long)res[i][0].errors, (unsigned long long)res[i][1].errors);
    return errors ? -1 : 0;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc != 0)
        return prc < 0 ? 0 : 1;
    if (o.probe)
        return probe(&o);
    echo_server echo = {0}, self = {0};
    if (echo_start(&echo, NULL) != 0 || (!o.url && echo_start(&self, NULL) != 0)) {
        fprintf(stderr, "rpc_bench: cannot start the echo server\n");
        echo_stop(&echo);
        return 1;
    }
    target echo_tg = {echo.endpoint, false};
    target tg = {o.url ? o.url : self.endpoint, o.url != NULL};
    print_config(&o, echo.endpoint, tg.url);
    int rc = run_all(&o, &tg, &echo_tg);
    if (rc != 0)
        fprintf(stderr, "rpc_bench: requests went unanswered (server down or dropping?)\n");
    echo_stop(&echo);
    echo_stop(&self);
    return rc == 0 ? 0 : 1;
}
