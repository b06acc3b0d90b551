/* POST /api/trace/replay (docs/trace.md, "Replaying a trace"): applies a
 * batch of storage-trace records to this server's live storage manager,
 * as the calls they name would (docs/trace.md, "What is recorded"), and
 * answers each record's latency and what it was granted.
 *
 * It writes objects into the cache and holds leases across requests, so
 * it exists only with --allow-trace-replay; without the flag the route
 * answers 403.  A batch is checked whole before any record is applied: a
 * frame that is cut short or does not decode is a 400 naming its index,
 * and nothing of that batch was applied. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/http_json.h"
#include "http/http_routes.h"
#include "obs/log.h"
#include "server/server_internal.h"
#include "storage/storage_manager.h"
#include "storage/storage_trace_reader.h"

#define REPLAY_TAG "trace_replay"
/* Bounds of one batch and of what a replay holds (docs/trace.md,
 * "Replaying a trace"); the body's own bound is the frontend's bulk limit. */
#define LMC_TRACE_REPLAY_MAX_RECORDS 4096u
#define LMC_TRACE_REPLAY_MAX_HELD ((size_t)1 << 18)
#define LMC_TRACE_REPLAY_MAX_OBJECT ((uint64_t)1 << 30)

/* One held lease and the key it is of (a reference held on its strings). */
typedef struct {
    lmc_object_key key;
    lmc_lease lease;
} held;

/* Leases of one kind, oldest first: a call that gives leases back takes,
 * for each of its keys, the oldest lease of that key (upstream's replay
 * matches enter and exit first in, first out). */
typedef struct {
    held *v;
    size_t n, cap;
} held_list;

struct lmc_trace_replay {
    pthread_mutex_t mu;          /* one batch at a time: the scratch and lists below */
    lmc_trace_scratch *scratch;
    held_list writes, reads, copies;
};

typedef struct {
    lmc_storage_manager *sm;
    held_list *writes, *reads, *copies;
} applier;

/* ---- held leases ---------------------------------------------------------- */

static bool held_push(held_list *l, const lmc_object_key *key, const lmc_lease *lease)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        held *v = cap <= LMC_TRACE_REPLAY_MAX_HELD ? realloc(l->v, cap * sizeof *v) : NULL;
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = (held){*key, *lease};
    lmc_keys_hold(&l->v[l->n].key, 1);
    l->n++;
    return true;
}

/* Moves the oldest lease of each key out of l into keys/leases (whose
 * references go with them).  Returns how many were found. */
static size_t held_take(held_list *l, const lmc_object_key *want, size_t n, lmc_object_key *keys,
                        lmc_lease *leases)
{
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < l->n; j++) {
            if (!lmc_object_key_equal(&l->v[j].key, &want[i]))
                continue;
            keys[got] = l->v[j].key;
            leases[got++] = l->v[j].lease;
            memmove(&l->v[j], &l->v[j + 1], (l->n - j - 1) * sizeof *l->v);
            l->n--;
            break;
        }
    }
    return got;
}

/* Gives back every lease of l; returns how many. */
static size_t held_release(lmc_storage_manager *sm, held_list *l)
{
    size_t n = l->n;
    for (size_t i = 0; i < n; i++) {
        lmc_storage_manager_give_back(sm, &l->v[i].key, &l->v[i].lease, 1);
        lmc_keys_drop(&l->v[i].key, 1);
    }
    l->n = 0;
    return n;
}

/* Holds what was granted, giving back at once what cannot be held. */
static size_t hold_granted(lmc_storage_manager *sm, held_list *l, const lmc_object_key *keys,
                           lmc_lease *leases, size_t n, lmc_lease_kind kind)
{
    size_t granted = 0;
    for (size_t i = 0; i < n; i++) {
        if (leases[i].kind != kind)
            continue;
        granted++;
        if (!held_push(l, &keys[i], &leases[i]))
            lmc_storage_manager_give_back(sm, &keys[i], &leases[i], 1);
    }
    return granted;
}

/* ---- the calls ------------------------------------------------------------ */

/* reserve_write: WRITE leases of the recorded size, filled with zeros. */
static size_t apply_reserve(applier *a, const lmc_trace_record *rec, lmc_lease *leases)
{
    uint64_t size = rec->object_size;
    if (size == 0 || size > LMC_TRACE_REPLAY_MAX_OBJECT)
        return 0;
    if (lmc_storage_manager_lease_write(a->sm, rec->keys, rec->n_keys, size, false, REPLAY_TAG,
                                        leases, NULL) != 0)
        return 0;
    uint8_t *base = lmc_storage_manager_l1_arena(a->sm)->base;
    for (size_t i = 0; i < rec->n_keys; i++)
        if (leases[i].kind == LMC_LEASE_WRITE)
            memset(base + leases[i].offset, 0, size);
    return hold_granted(a->sm, a->writes, rec->keys, leases, rec->n_keys, LMC_LEASE_WRITE);
}

/* submit_prefetch_task: a LOOKUP's read locks on the leading run of hits. */
static size_t apply_submit(applier *a, const lmc_trace_record *rec, lmc_lease *leases)
{
    lmc_storage_manager_lease_read(a->sm, rec->keys, rec->n_keys, 1, true, NULL, leases, NULL);
    return hold_granted(a->sm, a->reads, rec->keys, leases, rec->n_keys, LMC_LEASE_READ);
}

/* read_prefetched_results.__enter__: a RETRIEVE's COPY leases, each
 * carrying the share of a held READ lease, which it consumes. */
static size_t apply_enter(applier *a, const lmc_trace_record *rec, lmc_lease *leases,
                          lmc_object_key *tk, lmc_lease *tl)
{
    lmc_storage_manager_lease_copy(a->sm, rec->keys, rec->n_keys, LMC_COPY_CARRIES_SHARE, false,
                                   NULL, leases, NULL);
    for (size_t i = 0; i < rec->n_keys; i++)
        if (leases[i].kind == LMC_LEASE_COPY)
            lmc_keys_drop(tk, held_take(a->reads, &rec->keys[i], 1, tk, tl));
    return hold_granted(a->sm, a->copies, rec->keys, leases, rec->n_keys, LMC_LEASE_COPY);
}

/* finish_write publishes, the others give back: the held leases of keys. */
static size_t apply_return(applier *a, held_list *l, const lmc_trace_record *rec, bool publish,
                           lmc_object_key *tk, lmc_lease *tl)
{
    size_t got = held_take(l, rec->keys, rec->n_keys, tk, tl);
    if (publish)
        lmc_storage_manager_publish_writes(a->sm, tk, tl, got, 0, NULL);
    else
        lmc_storage_manager_give_back(a->sm, tk, tl, got);
    lmc_keys_drop(tk, got);
    return got;
}

/* Applies one record; returns what it was granted (docs/trace.md). */
static size_t apply(applier *a, const lmc_trace_record *rec, lmc_lease *leases,
                    lmc_object_key *tk, lmc_lease *tl)
{
    memset(leases, 0, rec->n_keys * sizeof *leases);
    switch (rec->op) {
    case LMC_STORAGE_TRACE_RESERVE_WRITE: return apply_reserve(a, rec, leases);
    case LMC_STORAGE_TRACE_FINISH_WRITE: return apply_return(a, a->writes, rec, true, tk, tl);
    case LMC_STORAGE_TRACE_ABORT_WRITE: return apply_return(a, a->writes, rec, false, tk, tl);
    case LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK: return apply_submit(a, rec, leases);
    case LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER: return apply_enter(a, rec, leases, tk, tl);
    case LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT:
        return apply_return(a, a->copies, rec, false, tk, tl);
    case LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED:
        return apply_return(a, a->reads, rec, false, tk, tl);
    default: return 0;
    }
}

static const char *op_name(lmc_storage_trace_op op)
{
    switch (op) {
    case LMC_STORAGE_TRACE_RESERVE_WRITE: return "reserve_write";
    case LMC_STORAGE_TRACE_FINISH_WRITE: return "finish_write";
    case LMC_STORAGE_TRACE_ABORT_WRITE: return "abort_write";
    case LMC_STORAGE_TRACE_SUBMIT_PREFETCH_TASK: return "submit_prefetch_task";
    case LMC_STORAGE_TRACE_FINISH_READ_PREFETCHED: return "finish_read_prefetched";
    case LMC_STORAGE_TRACE_READ_PREFETCHED_ENTER: return "read_prefetched_results.__enter__";
    case LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT: return "read_prefetched_results.__exit__";
    default: return NULL;
    }
}

/* ---- the batch ------------------------------------------------------------- */

/* The frame at *at: its body and length, or -1 with the reason. */
static int next_frame(const uint8_t *buf, size_t len, size_t *at, const uint8_t **body,
                      size_t *body_len, char *err, size_t errlen)
{
    if (len - *at < 4) {
        snprintf(err, errlen, "its length prefix is cut short");
        return -1;
    }
    const uint8_t *p = buf + *at;
    uint32_t n = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (n > len - *at - 4) {
        snprintf(err, errlen, "its body of %u bytes is cut short", n);
        return -1;
    }
    *body = p + 4;
    *body_len = n;
    *at += 4 + (size_t)n;
    return 0;
}

/* Every frame decodes, and there are at most LMC_TRACE_REPLAY_MAX_RECORDS:
 * the count, or -1 with err naming the frame at fault. */
static long check_batch(lmc_trace_scratch *sc, const uint8_t *buf, size_t len, char *err,
                        size_t errlen)
{
    size_t at = 0, count = 0;
    while (at < len) {
        size_t start = at, blen;
        const uint8_t *body;
        char why[256];
        lmc_trace_record rec;
        if (count == LMC_TRACE_REPLAY_MAX_RECORDS) {
            snprintf(err, errlen, "more than %u records in one batch",
                     LMC_TRACE_REPLAY_MAX_RECORDS);
            return -1;
        }
        if (next_frame(buf, len, &at, &body, &blen, why, sizeof why) != 0 ||
            lmc_trace_decode_record(sc, body, blen, &rec, why, sizeof why) != 0) {
            snprintf(err, errlen, "frame %zu (at byte %zu of the body): %s", count, start, why);
            return -1;
        }
        count++;
    }
    return (long)count;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Per-call scratch arrays of LMC_TRACE_KEYS_MAX entries. */
typedef struct {
    lmc_lease *leases, *taken_leases;
    lmc_object_key *taken_keys;
} batch_bufs;

static json_t *apply_one(applier *a, const lmc_trace_record *rec, batch_bufs *b)
{
    const char *name = op_name(rec->op);
    if (!name)   /* a method lmcached has no counterpart of */
        return json_pack("{s:s, s:b}", "op", rec->qualname, "skipped", 1);
    double t0 = now_us();
    size_t granted = apply(a, rec, b->leases, b->taken_keys, b->taken_leases);
    double us = now_us() - t0;
    return json_pack("{s:s, s:f, s:I, s:I}", "op", name, "us", us, "keys",
                     (json_int_t)rec->n_keys, "granted", (json_int_t)granted);
}

static json_t *apply_batch(lmc_server *s, const uint8_t *buf, size_t len, bool release)
{
    lmc_trace_replay *r = s->replay;
    applier a = {s->ctx.storage, &r->writes, &r->reads, &r->copies};
    batch_bufs b = {calloc(LMC_TRACE_KEYS_MAX, sizeof(lmc_lease)),
                    calloc(LMC_TRACE_KEYS_MAX, sizeof(lmc_lease)),
                    calloc(LMC_TRACE_KEYS_MAX, sizeof(lmc_object_key))};
    json_t *results = json_array();
    size_t at = 0;
    while (b.leases && b.taken_leases && b.taken_keys && results && at < len) {
        const uint8_t *body;
        size_t blen;
        lmc_trace_record rec;
        char err[256];
        if (next_frame(buf, len, &at, &body, &blen, err, sizeof err) != 0 ||
            lmc_trace_decode_record(r->scratch, body, blen, &rec, err, sizeof err) != 0)
            break;   /* check_batch read them all: memory only */
        json_array_append_new(results, apply_one(&a, &rec, &b));
    }
    size_t released = 0;
    if (release)
        released = held_release(a.sm, a.writes) + held_release(a.sm, a.reads) +
                   held_release(a.sm, a.copies);
    free(b.leases);
    free(b.taken_leases);
    free(b.taken_keys);
    return json_pack("{s:I, s:o, s:{s:I, s:I, s:I}, s:I}", "records",
                     (json_int_t)json_array_size(results), "results", results, "held", "writes",
                     (json_int_t)r->writes.n, "reads", (json_int_t)r->reads.n, "copies",
                     (json_int_t)r->copies.n, "released", (json_int_t)released);
}

static void ep_trace_replay(const lmc_http_request *req, lmc_http_reply *out, void *server,
                            const char *arg)
{
    (void)arg;
    lmc_server *s = server;
    if (!s->replay) {
        lmc_http_reply_json(out, MHD_HTTP_FORBIDDEN,
                            lmc_http_detail("trace replay writes into the live cache and is off: "
                                            "start lmcached with --allow-trace-replay "
                                            "(docs/trace.md)"));
        return;
    }
    const uint8_t *buf = (const uint8_t *)req->body;
    size_t len = req->body ? req->body_len : 0;
    const char *rel = lmc_http_query(req, "release");
    bool release = rel && strcmp(rel, "0") != 0 && strcmp(rel, "false") != 0;
    char err[512];
    pthread_mutex_lock(&s->replay->mu);
    long n = check_batch(s->replay->scratch, buf, len, err, sizeof err);
    json_t *reply = n < 0 ? NULL : apply_batch(s, buf, len, release);
    pthread_mutex_unlock(&s->replay->mu);
    if (n < 0)
        lmc_http_reply_json(out, MHD_HTTP_BAD_REQUEST, lmc_http_detail("%s", err));
    else if (!reply)
        lmc_http_reply_json(out, MHD_HTTP_INTERNAL_SERVER_ERROR, lmc_http_detail("out of memory"));
    else
        lmc_http_reply_json(out, MHD_HTTP_OK, reply);
}

static const lmc_http_route replay_routes[] = {
    {"POST", "/api/trace/replay", false, LMC_HTTP_TOKEN, LMC_HTTP_BODY_BULK,
     LMC_HTTP_READY_DETAIL, ep_trace_replay, NULL},
};

int lmc_server_add_trace_replay_routes(lmc_server *s, lmc_http_routes *routes)
{
    return lmc_http_routes_add(routes, replay_routes,
                               sizeof replay_routes / sizeof replay_routes[0], s);
}

/* ---- lifecycle ------------------------------------------------------------ */

int lmc_server_start_trace_replay(lmc_server *s, char *err, size_t errlen)
{
    if (!s->cfg->obs.allow_trace_replay)
        return 0;
    lmc_trace_replay *r = calloc(1, sizeof *r);
    if (!r || !(r->scratch = lmc_trace_scratch_new(s->ctx.interner))) {
        free(r);
        snprintf(err, errlen, "--allow-trace-replay: out of memory");
        return -1;
    }
    pthread_mutex_init(&r->mu, NULL);
    s->replay = r;
    LMC_WARN("--allow-trace-replay: POST /api/trace/replay writes into this cache "
             "(docs/trace.md)");
    return 0;
}

void lmc_server_stop_trace_replay(lmc_server *s)
{
    lmc_trace_replay *r = s->replay;
    if (!r)
        return;
    held_release(s->ctx.storage, &r->writes);
    held_release(s->ctx.storage, &r->reads);
    held_release(s->ctx.storage, &r->copies);
    free(r->writes.v);
    free(r->reads.v);
    free(r->copies.v);
    lmc_trace_scratch_free(r->scratch);
    pthread_mutex_destroy(&r->mu);
    free(r);
    s->replay = NULL;
}
