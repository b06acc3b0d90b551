/* "resp" backend: see l2_resp.h.
 *
 * Connections: `num_connections` pool slots; each slot holds one lazily
 * opened connection per known cluster node, and a worker thread borrows a
 * whole slot for one backend call, so calls never share a socket.  A
 * broken connection is closed and reopened on next use: a Redis restart
 * costs the operations in flight, not a server restart.
 *
 * Cluster: slot_owner maps each of the 16384 hash slots to a node index
 * (0 = the configured node until CLUSTER NODES or a MOVED says otherwise).
 * MOVED updates the map and retries; ASK retries once on the named node
 * after ASKING.
 *
 * Usage (docs/l2.md, "Usage and capacity of resp and s3"): a size index of
 * every object, filled at start from SCAN + STRLEN over every master, then
 * kept by stores (an overwrite replaces the size), deletes and lookups
 * that find an object gone. */
#include "storage/l2/adapters/l2_resp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/grow.h"
#include "obs/log.h"
#include "storage/l2/l2_internal.h"
#include "storage/l2/adapters/l2_resp_conn.h"
#include "storage/l2/l2_size_index.h"
#include "storage/object_key_json.h"

#define MAX_NODES 16
#define MAX_REDIRECTS 5
#define NUM_SLOTS 16384
#define KEY_MAX 1024                 /* longer names are not objects of ours */

typedef struct {
    char host[256];
    int port;
} resp_node;

typedef struct {
    resp_conn conns[MAX_NODES];
    bool busy;
} pool_slot;

typedef struct resp_backend {
    lmc_l2_batch_backend base;         /* first: a backend pointer is a resp pointer */
    char username[128], password[256];
    int timeout_ms;
    pthread_mutex_t nodes_lock;        /* guards nodes[] appends */
    resp_node nodes[MAX_NODES];
    atomic_int n_nodes;
    _Atomic uint8_t slot_owner[NUM_SLOTS];
    pthread_mutex_t pool_lock;
    pthread_cond_t pool_free;
    pool_slot *slots;
    size_t n_slots;
    lmc_key_interner *interner;        /* keys parsed back by list() and the rebuild */
    lmc_l2_size_index *index;          /* what Redis holds: usage, max_capacity_gb */
    /* Written by lmc_l2_resp_new() alone, before any other call: */
    bool keep_found;                   /* keep `found` for the L2 eviction */
    lmc_l2_found_list found;           /* objects listed at start */
    uint64_t rebuild_keys, rebuild_ms;
    bool rebuild_complete;
    _Atomic uint64_t stored_bytes, stores, store_errors, stores_refused, gets, hits, io_errors,
        redirects;
} resp_backend;

/* ---- hash slots ---------------------------------------------------------- */

static uint16_t crc16_xmodem(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t lmc_resp_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) { /* a non-empty {tag} hashes alone */
        const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
        if (close && close > open + 1)
            return crc16_xmodem(open + 1, (size_t)(close - open - 1)) % NUM_SLOTS;
    }
    return crc16_xmodem(key, len) % NUM_SLOTS;
}

/* ---- nodes and the pool -------------------------------------------------- */

static int node_index(resp_backend *R, const char *host, int port)
{
    pthread_mutex_lock(&R->nodes_lock);
    int n = atomic_load(&R->n_nodes), found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        if (R->nodes[i].port == port && strcmp(R->nodes[i].host, host) == 0)
            found = i;
    }
    if (found < 0 && n < MAX_NODES) {
        snprintf(R->nodes[n].host, sizeof R->nodes[n].host, "%s", host);
        R->nodes[n].port = port;
        atomic_store(&R->n_nodes, n + 1);
        found = n;
    }
    pthread_mutex_unlock(&R->nodes_lock);
    return found;
}

static pool_slot *pool_acquire(resp_backend *R)
{
    pthread_mutex_lock(&R->pool_lock);
    for (;;) {
        for (size_t i = 0; i < R->n_slots; i++) {
            if (!R->slots[i].busy) {
                R->slots[i].busy = true;
                pthread_mutex_unlock(&R->pool_lock);
                return &R->slots[i];
            }
        }
        pthread_cond_wait(&R->pool_free, &R->pool_lock);
    }
}

static void pool_release(resp_backend *R, pool_slot *ps)
{
    pthread_mutex_lock(&R->pool_lock);
    ps->busy = false;
    pthread_cond_signal(&R->pool_free);
    pthread_mutex_unlock(&R->pool_lock);
}

/* Sends AUTH with the configured credentials and reads its reply line.
 * 0, or -1 when the connection closed. */
static int send_auth(resp_backend *R, resp_conn *c, char *line, size_t cap)
{
    resp_arg args[3] = {{"AUTH", 4}};
    size_t n = 1;
    if (R->username[0])
        args[n++] = (resp_arg){R->username, strlen(R->username)};
    args[n++] = (resp_arg){R->password, strlen(R->password)};
    return lmc_resp_send_command(c, args, n) == 0 && lmc_resp_read_line(c, line, cap) == 0
               ? 0
               : -1;
}

static int authenticate(resp_backend *R, resp_conn *c)
{
    if (!R->password[0])
        return 0;
    char line[RESP_LINE_MAX];
    if (send_auth(R, c, line, sizeof line) != 0 || strcmp(line, "+OK") != 0) {
        lmc_resp_conn_close(c);
        LMC_WARN("resp: AUTH refused by the server");
        return -1;
    }
    return 0;
}

/* The slot's connection to `node`, opened (and authenticated) on demand. */
static resp_conn *conn_for(resp_backend *R, pool_slot *ps, int node)
{
    resp_conn *c = &ps->conns[node];
    if (c->fd >= 0)
        return c;
    if (lmc_resp_conn_open(c, R->nodes[node].host, R->nodes[node].port, R->timeout_ms) != 0 ||
        authenticate(R, c) != 0) {
        atomic_fetch_add(&R->io_errors, 1);
        return NULL;
    }
    return c;
}

/* ---- one keyed command, following cluster redirects ----------------------- */

typedef int (*reply_fn)(resp_conn *c, const char *line, void *ctx);

static bool parse_redirect(resp_backend *R, const char *line, int *node)
{
    /* "-MOVED <slot> <host>:<port>" or "-ASK <slot> <host>:<port>" */
    const char *addr = strchr(line, ' ');
    addr = addr ? strchr(addr + 1, ' ') : NULL;
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr + 1)
        return false;
    char host[256];
    size_t hl = (size_t)(colon - addr - 1);
    if (hl >= sizeof host)
        return false;
    memcpy(host, addr + 1, hl);
    host[hl] = '\0';
    int port = atoi(colon + 1);
    *node = port > 0 ? node_index(R, host, port) : -1;
    return *node >= 0;
}

static int send_asking(resp_conn *c)
{
    static const resp_arg asking = {"ASKING", 6};
    char line[RESP_LINE_MAX];
    return lmc_resp_send_command(c, &asking, 1) == 0 && lmc_resp_read_line(c, line, sizeof line) == 0 &&
                   strcmp(line, "+OK") == 0
               ? 0
               : -1;
}

/* Runs `args` against the owner of the key's slot; on_reply consumes the
 * reply.  A broken connection is retried once on a fresh one (every command
 * we send is idempotent).  0, or -1 on I/O failure or too many redirects. */
static int execute(resp_backend *R, pool_slot *ps, const char *key, size_t klen,
                   const resp_arg *args, size_t nargs, reply_fn on_reply, void *ctx)
{
    uint16_t slot = lmc_resp_key_slot(key, klen);
    int node = atomic_load(&R->slot_owner[slot]);
    bool asking = false, retried = false;
    for (int hop = 0; hop <= MAX_REDIRECTS; hop++) {
        char line[RESP_LINE_MAX];
        resp_conn *c = conn_for(R, ps, node);
        if (!c)
            return -1;
        if ((asking && send_asking(c) != 0) || lmc_resp_send_command(c, args, nargs) != 0 ||
            lmc_resp_read_line(c, line, sizeof line) != 0) {
            atomic_fetch_add(&R->io_errors, 1);
            lmc_resp_conn_close(c);
            if (retried)
                return -1;
            retried = true;
            continue;
        }
        bool moved = strncmp(line, "-MOVED ", 7) == 0, ask = strncmp(line, "-ASK ", 5) == 0;
        if (!moved && !ask)
            return on_reply(c, line, ctx);
        atomic_fetch_add(&R->redirects, 1);
        if (!parse_redirect(R, line, &node))
            return -1;
        if (moved)
            atomic_store(&R->slot_owner[slot], (uint8_t)node);
        asking = ask;
    }
    return -1;
}

/* ---- replies ------------------------------------------------------------- */

static int reply_ok(resp_conn *c, const char *line, void *ctx)
{
    (void)c;
    *(bool *)ctx = strcmp(line, "+OK") == 0;
    return 0;
}

static int reply_int(resp_conn *c, const char *line, void *ctx)
{
    (void)c;
    int64_t *out = ctx;
    if (line[0] != ':' || !lmc_resp_parse_int(line, out))
        *out = -1;
    return 0;
}

typedef struct {
    uint8_t *buf;
    uint64_t size;
    bool ok;
} get_ctx;

/* GET: "$-1" is a miss; a payload of another size is drained and refused. */
static int reply_get(resp_conn *c, const char *line, void *ctx)
{
    get_ctx *g = ctx;
    int64_t len;
    g->ok = false;
    if (line[0] != '$' || !lmc_resp_parse_int(line, &len) || len < 0)
        return 0;
    if ((uint64_t)len != g->size)
        return lmc_resp_read_bulk_body(c, NULL, (size_t)len);
    if (lmc_resp_read_bulk_body(c, g->buf, (size_t)len) != 0)
        return -1;
    g->ok = true;
    return 0;
}

/* ---- backend ops --------------------------------------------------------- */

static size_t key_string(const lmc_object_key *k, char *out, size_t cap)
{
    int n = lmc_object_key_to_string(k, out, cap);
    return n < 0 ? 0 : (size_t)n;
}

/* ---- pipelines: a part's commands sent before any reply is read ------------ */

#define PIPE_MAX 64                  /* commands of one round (bounds the memory) */

/* One keyed command of a pipeline. */
typedef struct {
    char key[KEY_MAX];
    size_t kl;                       /* 0: the key has no name, never sent */
    resp_arg args[3];
    size_t nargs;
    void *ctx;                       /* for the reply function */
    int node;                        /* the connection it went out on; -1: not sent */
    int rc;                          /* 0: its reply was consumed; -1: failed */
} pipe_cmd;

/* verb key [value]: value NULL for a command of two arguments. */
static void cmd_init(pipe_cmd *p, const char *verb, const lmc_object_key *k, const void *value,
                     uint64_t vlen, void *ctx)
{
    int n = lmc_object_key_to_string(k, p->key, sizeof p->key);
    p->kl = n < 0 ? 0 : (size_t)n;
    p->args[0] = (resp_arg){verb, strlen(verb)};
    p->args[1] = (resp_arg){p->key, p->kl};
    p->args[2] = (resp_arg){value, (size_t)vlen};
    p->nargs = value ? 3 : 2;
    p->ctx = ctx;
    p->rc = -1;
}

/* Sends each command to its slot's owner.  A node whose send failed takes
 * no more commands this round (its connection is closed). */
static void pipe_send(resp_backend *R, pool_slot *ps, pipe_cmd *cmds, size_t n, bool *broken)
{
    for (size_t i = 0; i < n; i++) {
        pipe_cmd *p = &cmds[i];
        p->node = -1;
        if (!p->kl)
            continue;
        int node = atomic_load(&R->slot_owner[lmc_resp_key_slot(p->key, p->kl)]);
        if (broken[node])
            continue;
        resp_conn *c = conn_for(R, ps, node);
        if (!c || lmc_resp_send_command(c, p->args, p->nargs) != 0) {
            if (c)
                atomic_fetch_add(&R->io_errors, 1);
            broken[node] = true;
            continue;
        }
        p->node = node;
    }
}

/* Reads the replies in the order sent.  A redirect (MOVED teaches the
 * slot's owner) or a broken connection leaves the command for execute(). */
static void pipe_read(resp_backend *R, pool_slot *ps, pipe_cmd *cmds, size_t n, bool *broken,
                      reply_fn on_reply)
{
    for (size_t i = 0; i < n; i++) {
        pipe_cmd *p = &cmds[i];
        if (p->node < 0 || broken[p->node])
            continue;
        resp_conn *c = &ps->conns[p->node];
        char line[RESP_LINE_MAX];
        if (lmc_resp_read_line(c, line, sizeof line) != 0) {
            atomic_fetch_add(&R->io_errors, 1);
            broken[p->node] = true;
            continue;
        }
        bool moved = strncmp(line, "-MOVED ", 7) == 0, ask = strncmp(line, "-ASK ", 5) == 0;
        int node;
        if (moved || ask) {
            atomic_fetch_add(&R->redirects, 1);
            if (moved && parse_redirect(R, line, &node))
                atomic_store(&R->slot_owner[lmc_resp_key_slot(p->key, p->kl)], (uint8_t)node);
            continue;
        }
        if (on_reply(c, line, p->ctx) != 0) { /* the connection broke mid-reply */
            atomic_fetch_add(&R->io_errors, 1);
            broken[p->node] = true;
            continue;
        }
        p->rc = 0;
    }
}

/* Runs cmds[0..n) as one pipeline per node; what it could not finish
 * (redirects, broken connections) runs again one by one through execute(),
 * which follows redirects and reconnects.  Every command we send is
 * idempotent, so sending one twice is harmless. */
static void run_pipeline(resp_backend *R, pool_slot *ps, pipe_cmd *cmds, size_t n,
                         reply_fn on_reply)
{
    bool broken[MAX_NODES] = {false};
    pipe_send(R, ps, cmds, n, broken);
    pipe_read(R, ps, cmds, n, broken, on_reply);
    for (size_t i = 0; i < n; i++) {
        pipe_cmd *p = &cmds[i];
        if (p->rc != 0 && p->kl)
            p->rc = execute(R, ps, p->key, p->kl, p->args, p->nargs, on_reply, p->ctx);
    }
}

/* ---- store: the whole batch reserved, its parts written apart -------------------- */

/* docs/l2.md, "Parts": the capacity check covers the whole batch, so a
 * batch that would pass max_capacity_gb is refused before anything is
 * written (as fs refuses one); the L2 eviction makes room ahead of that. */
static void *resp_store_begin(lmc_l2_backend *b, const lmc_object_key *keys,
                              const uint64_t *sizes, size_t n)
{
    resp_backend *R = (resp_backend *)b;
    bool refused;
    atomic_fetch_add(&R->stores, 1);
    lmc_l2_reservation *r = lmc_l2_size_index_reserve_keys(R->index, keys, sizes, n, &refused);
    if (!r) {
        if (refused)
            atomic_fetch_add(&R->stores_refused, 1);
        atomic_fetch_add(&R->store_errors, 1);
    }
    return r;
}

/* SETs of one part, PIPE_MAX a round; each round settles what it wrote. */
static int64_t resp_store_part(lmc_l2_backend *b, void *batch, size_t from,
                               const lmc_object_key *keys, uint8_t *const *bufs,
                               const uint64_t *sizes, size_t n)
{
    resp_backend *R = (resp_backend *)b;
    lmc_l2_reservation *rb = batch;
    pipe_cmd *cmds = malloc(PIPE_MAX * sizeof *cmds);
    pool_slot *ps = pool_acquire(R);
    bool all = true;
    int64_t bytes = 0;
    for (size_t at = 0; at < n; at += PIPE_MAX) {
        size_t m = n - at < PIPE_MAX ? n - at : PIPE_MAX;
        bool ok[PIPE_MAX] = {false};
        uint8_t written[PIPE_MAX] = {0};
        for (size_t i = 0; cmds && i < m; i++)
            cmd_init(&cmds[i], "SET", &keys[at + i], bufs[at + i], sizes[at + i], &ok[i]);
        if (cmds)
            run_pipeline(R, ps, cmds, m, reply_ok);
        bool round = cmds != NULL;
        for (size_t i = 0; cmds && i < m; i++) {
            written[i] = cmds[i].rc == 0 && ok[i];
            round = round && written[i];
            bytes += (int64_t)sizes[at + i];
        }
        lmc_l2_size_index_settle(R->index, rb, from + at, m, written, round);
        all = all && round;
    }
    pool_release(R, ps);
    free(cmds);
    return all ? bytes : -1;
}

static bool resp_store_end(lmc_l2_backend *b, void *batch)
{
    resp_backend *R = (resp_backend *)b;
    lmc_l2_reservation *rb = batch;
    uint64_t bytes = lmc_l2_reservation_bytes(rb);
    bool ok = lmc_l2_size_index_release(R->index, rb);
    if (ok)
        atomic_fetch_add(&R->stored_bytes, bytes);
    else
        atomic_fetch_add(&R->store_errors, 1);
    return ok;
}

static int64_t resp_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    void *batch = resp_store_begin(b, keys, sizes, n);
    if (!batch)
        return -1;
    int64_t bytes = resp_store_part(b, batch, 0, keys, bufs, sizes, n);
    return resp_store_end(b, batch) ? bytes : -1;
}

/* ---- lookup and load: pipelined STRLEN and GET ---------------------------------- */

/* A key Redis no longer has (its own eviction, another server) leaves the
 * index when a lookup misses it. */
static void resp_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    resp_backend *R = (resp_backend *)b;
    pipe_cmd *cmds = malloc(PIPE_MAX * sizeof *cmds);
    pool_slot *ps = pool_acquire(R);
    memset(found, 0, n);
    for (size_t at = 0; cmds && at < n; at += PIPE_MAX) {
        size_t m = n - at < PIPE_MAX ? n - at : PIPE_MAX;
        int64_t len[PIPE_MAX];
        for (size_t i = 0; i < m; i++) {
            len[i] = -1;
            cmd_init(&cmds[i], "STRLEN", &keys[at + i], NULL, 0, &len[i]);
        }
        run_pipeline(R, ps, cmds, m, reply_int);
        for (size_t i = 0; i < m; i++) {
            bool answered = cmds[i].rc == 0;
            found[at + i] = answered && len[i] > 0 &&
                            (!sizes || (uint64_t)len[i] == sizes[at + i]);
            if (answered && len[i] == 0)
                lmc_l2_size_index_forget(R->index, lmc_l2_key_id(cmds[i].key, cmds[i].kl));
        }
    }
    pool_release(R, ps);
    free(cmds);
}

static void resp_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                      const uint64_t *sizes, size_t n, uint8_t *ok)
{
    resp_backend *R = (resp_backend *)b;
    pipe_cmd *cmds = malloc(PIPE_MAX * sizeof *cmds);
    pool_slot *ps = pool_acquire(R);
    memset(ok, 0, n);
    for (size_t at = 0; cmds && at < n; at += PIPE_MAX) {
        size_t m = n - at < PIPE_MAX ? n - at : PIPE_MAX;
        get_ctx g[PIPE_MAX];
        for (size_t i = 0; i < m; i++) {
            g[i] = (get_ctx){bufs[at + i], sizes[at + i], false};
            cmd_init(&cmds[i], "GET", &keys[at + i], NULL, 0, &g[i]);
        }
        run_pipeline(R, ps, cmds, m, reply_get);
        for (size_t i = 0; i < m; i++) {
            ok[at + i] = cmds[i].rc == 0 && g[i].ok;
            atomic_fetch_add(&R->gets, 1);
            if (ok[at + i])
                atomic_fetch_add(&R->hits, 1);
        }
    }
    pool_release(R, ps);
    free(cmds);
}

/* Redis has no pins: an object can vanish between lookup and load, which
 * the load then reports as a failure (a miss), never as wrong bytes. */
static void resp_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    (void)b, (void)keys, (void)n;
}

/* A key Redis answers DEL for is gone afterwards, whether this DEL or
 * something earlier removed it: it counts as deleted (as fs counts a
 * missing file), so the L2 eviction does not retry it forever. */
static size_t resp_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    resp_backend *R = (resp_backend *)b;
    pool_slot *ps = pool_acquire(R);
    size_t deleted = 0;
    for (size_t i = 0; i < n; i++) {
        char key[KEY_MAX];
        size_t kl = key_string(&keys[i], key, sizeof key);
        resp_arg args[2] = {{"DEL", 3}, {key, kl}};
        int64_t count = -1;
        if (kl && execute(R, ps, key, kl, args, 2, reply_int, &count) == 0 && count >= 0) {
            lmc_l2_size_index_forget(R->index, lmc_l2_key_id(key, kl));
            deleted++;
        }
    }
    pool_release(R, ps);
    return deleted;
}

static void resp_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    resp_backend *R = (resp_backend *)b;
    lmc_l2_size_index_usage(R->index, u);
}

/* ---- SCAN with pipelined STRLEN: listing and the rebuild at start ------------ */

#define SCAN_PAGE_MAX 65536          /* keys one SCAN reply may carry (COUNT asks 1000) */
#define PIPELINE 512                 /* STRLENs in flight on one connection */
#define REBUILD_MAX_MS 60000         /* the rebuild at start stops after this */

/* One SCAN page: names packed NUL-separated in `text`. */
typedef struct {
    char *text;
    size_t len, cap;
    size_t *at;                      /* offset of each name in text */
    uint32_t *name_len;
    int64_t *size;                   /* STRLEN, -1 when Redis answered an error */
    size_t n;
} scan_page;

/* Called for every name of a page with its STRLEN; `page` counts pages. */
typedef void (*scan_fn)(resp_backend *R, const char *name, size_t len, int64_t size,
                        size_t page, size_t pos, void *ctx);

static int read_bulk_string(resp_conn *c, char *out, size_t cap, size_t *len)
{
    char line[RESP_LINE_MAX];
    int64_t n;
    if (lmc_resp_read_line(c, line, sizeof line) != 0 || line[0] != '$' ||
        !lmc_resp_parse_int(line, &n) || n < 0)
        return -1;
    if ((uint64_t)n >= cap) { /* not one of ours: skip it */
        *len = 0;
        return lmc_resp_read_bulk_body(c, NULL, (size_t)n);
    }
    *len = (size_t)n;
    if (lmc_resp_read_bulk_body(c, out, (size_t)n) != 0)
        return -1;
    out[n] = '\0';
    return 0;
}

static int page_add(scan_page *p, const char *name, size_t len)
{
    if (lmc_grow_array(&p->text, &p->cap, p->len + len + 1, 1, 64 * 1024) != 0)
        return -1;
    memcpy(p->text + p->len, name, len + 1);
    p->at[p->n] = p->len;
    p->name_len[p->n++] = (uint32_t)len;
    p->len += len + 1;
    return 0;
}

/* Reads one SCAN reply ("*2", cursor, "*n", n names) into p; names too long
 * to be ours are dropped.  The next cursor (0 = done), or -1. */
static long long read_scan_reply(resp_conn *c, scan_page *p)
{
    char line[RESP_LINE_MAX], cur[32], name[KEY_MAX];
    int64_t n;
    size_t len;
    if (lmc_resp_read_line(c, line, sizeof line) != 0 || strcmp(line, "*2") != 0 ||
        read_bulk_string(c, cur, sizeof cur, &len) != 0 || len == 0 ||
        lmc_resp_read_line(c, line, sizeof line) != 0 || line[0] != '*' ||
        !lmc_resp_parse_int(line, &n) || n < 0 || n > SCAN_PAGE_MAX)
        return -1;
    p->len = p->n = 0;
    for (int64_t i = 0; i < n; i++) {
        if (read_bulk_string(c, name, sizeof name, &len) != 0 ||
            (len && page_add(p, name, len) != 0))
            return -1;
    }
    char *end;
    long long next = strtoll(cur, &end, 10);
    return *end || next < 0 ? -1 : next;
}

/* The replies to STRLENs of names [from, to) of p.  0, or -1. */
static int read_sizes(resp_conn *c, scan_page *p, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        char line[RESP_LINE_MAX];
        if (lmc_resp_read_line(c, line, sizeof line) != 0 || (line[0] != ':' && line[0] != '-'))
            return -1;
        if (line[0] == '-' || !lmc_resp_parse_int(line, &p->size[i]))
            p->size[i] = -1; /* e.g. a key of another type, or MOVED mid-reshard */
    }
    return 0;
}

/* STRLEN of every name of p, PIPELINE commands (one send) at a time.
 * 0, or -1. */
static int strlen_page(resp_conn *c, scan_page *p)
{
    char *out = NULL;
    size_t cap = 0;
    int rc = 0;
    for (size_t from = 0; rc == 0 && from < p->n; from += PIPELINE) {
        size_t to = p->n - from < PIPELINE ? p->n : from + PIPELINE, len = 0;
        for (size_t i = from; rc == 0 && i < to; i++) {
            resp_arg args[2] = {{"STRLEN", 6}, {p->text + p->at[i], p->name_len[i]}};
            rc = lmc_resp_append_command(&out, &len, &cap, args, 2);
        }
        if (rc == 0)
            rc = lmc_resp_send_raw(c, out, len);
        rc = rc == 0 ? read_sizes(c, p, from, to) : -1;
    }
    free(out);
    return rc;
}

/* Every key of `node` matching `pattern`, with its size.  0 when the scan
 * completed, -1 on failure or at the deadline (0: none). */
static int scan_node(resp_backend *R, pool_slot *ps, int node, const char *pattern,
                     int64_t deadline_ms, scan_fn fn, void *ctx)
{
    scan_page p = {.at = malloc(SCAN_PAGE_MAX * sizeof *p.at),
                   .name_len = malloc(SCAN_PAGE_MAX * sizeof *p.name_len),
                   .size = malloc(SCAN_PAGE_MAX * sizeof *p.size)};
    resp_conn *c = p.at && p.name_len && p.size ? conn_for(R, ps, node) : NULL;
    long long cursor = c ? 0 : -1;
    for (size_t page = 0; cursor >= 0; page++) {
        char cur[32];
        snprintf(cur, sizeof cur, "%lld", cursor);
        resp_arg args[6] = {{"SCAN", 4}, {cur, strlen(cur)}, {"MATCH", 5},
                            {pattern, strlen(pattern)}, {"COUNT", 5}, {"1000", 4}};
        if (lmc_resp_send_command(c, args, 6) != 0 || (cursor = read_scan_reply(c, &p)) < 0 ||
            strlen_page(c, &p) != 0) {
            cursor = -1;
            break;
        }
        for (size_t i = 0; i < p.n; i++)
            fn(R, p.text + p.at[i], p.name_len[i], p.size[i], page, i, ctx);
        if (cursor == 0 || (deadline_ms && lmc_l2_now_ms() > deadline_ms))
            break;
    }
    if (cursor != 0 && c)
        lmc_resp_conn_close(c); /* mid-reply, or abandoned mid-scan: start afresh */
    free(p.text);
    free(p.at);
    free(p.name_len);
    free(p.size);
    return cursor == 0 ? 0 : -1;
}

/* True when `node` owns a hash slot (a master; until CLUSTER NODES or a
 * MOVED says otherwise, node 0 owns them all). */
static bool owns_slots(resp_backend *R, int node)
{
    for (int s = 0; s < NUM_SLOTS; s++)
        if (atomic_load(&R->slot_owner[s]) == node)
            return true;
    return false;
}

static void list_key(resp_backend *R, const char *name, size_t len, int64_t size, size_t page,
                     size_t pos, void *ctx)
{
    (void)len, (void)page, (void)pos;
    lmc_object_key k;
    if (size <= 0 || lmc_object_key_parse_string(R->interner, name, &k) != 0)
        return; /* gone since SCAN saw it, or a foreign key in the same Redis */
    json_array_append_new(ctx, json_pack("{s:o, s:I, s:s}", "key", lmc_object_key_json(&k),
                                         "size_bytes", (json_int_t)size, "name", name));
}

/* Glob pattern "<model>@*" with glob metacharacters of the model escaped. */
static void model_pattern(const char *model, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = model ? model : ""; *p && o + 3 < cap; p++) {
        if (strchr("*?[]\\", *p))
            out[o++] = '\\';
        out[o++] = *p;
    }
    out[o] = '\0';
    snprintf(out + o, cap - o, "%s", model ? "@*" : "*");
}

static void resp_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    resp_backend *R = (resp_backend *)b;
    char pattern[600];
    model_pattern(model, pattern, sizeof pattern);
    pool_slot *ps = pool_acquire(R);
    int nodes = atomic_load(&R->n_nodes); /* every master seen so far */
    for (int node = 0; node < nodes; node++) {
        if (node > 0 || nodes == 1 || owns_slots(R, 0)) /* not a replica seed */
            scan_node(R, ps, node, pattern, 0, list_key, entries);
    }
    pool_release(R, ps);
}

/* ---- cluster layout and the rebuild at start ----------------------------------- */

/* One line of CLUSTER NODES: "<id> <ip:port@cport[,host]> <flags> <master>
 * <ping> <pong> <epoch> <link> <slot or range>...".  A master that serves
 * slots becomes a node and owns them. */
static void learn_node_line(resp_backend *R, char *line, const char *seed_host)
{
    char *save = NULL, *f[8];
    for (int i = 0; i < 8; i++)
        if (!(f[i] = strtok_r(i ? NULL : line, " ", &save)))
            return;
    if (!strstr(f[2], "master") || strstr(f[2], "fail") || strstr(f[2], "noaddr"))
        return;
    char *at = strchr(f[1], '@');
    if (at)
        *at = '\0';
    char *colon = strrchr(f[1], ':');
    int port = colon ? atoi(colon + 1) : 0;
    if (!colon || port < 1 || port > 65535)
        return;
    *colon = '\0';
    /* "myself" is the seed, whatever address it is known by here. */
    int node = strstr(f[2], "myself") ? 0 : node_index(R, f[1][0] ? f[1] : seed_host, port);
    for (char *r; node >= 0 && (r = strtok_r(NULL, " ", &save)) != NULL;) {
        char *dash = strchr(r, '-');
        long lo = strtol(r, NULL, 10), hi = dash ? strtol(dash + 1, NULL, 10) : lo;
        for (long s = lo; r[0] != '[' && s <= hi && s >= 0 && s < NUM_SLOTS; s++)
            atomic_store(&R->slot_owner[s], (uint8_t)node);
    }
}

/* Redis Cluster: learns every master and the slots it owns, so the rebuild
 * scans them all.  A server without cluster support answers an error. */
static void learn_cluster(resp_backend *R, pool_slot *ps)
{
    enum { NODES_MAX = 1 << 20 };  /* CLUSTER NODES text of far more than 16 masters */
    resp_conn *c = conn_for(R, ps, 0);
    static const resp_arg cmd[2] = {{"CLUSTER", 7}, {"NODES", 5}};
    char line[RESP_LINE_MAX];
    int64_t n;
    if (!c || lmc_resp_send_command(c, cmd, 2) != 0 || lmc_resp_read_line(c, line, sizeof line) != 0)
        return;
    if (line[0] != '$' || !lmc_resp_parse_int(line, &n) || n < 0 || n > NODES_MAX) {
        if (line[0] != '-')
            lmc_resp_conn_close(c); /* not a reply we can skip */
        return;
    }
    char *text = malloc((size_t)n + 1);
    if (!text || lmc_resp_read_bulk_body(c, text, (size_t)n) != 0) {
        free(text);
        return;
    }
    text[n] = '\0';
    char seed[256], *save = NULL;
    snprintf(seed, sizeof seed, "%s", R->nodes[0].host);
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        learn_node_line(R, l, seed);
    free(text);
}

/* Redis keeps no write order: one SCAN page is one batch for the L2
 * eviction, pages in scan order. */
static void rebuild_key(resp_backend *R, const char *name, size_t len, int64_t size,
                        size_t page, size_t pos, void *ctx)
{
    lmc_object_key k;
    int64_t batch = ((int64_t)*(const int *)ctx << 32) | (int64_t)page;
    if (size <= 0 || lmc_object_key_parse_string(R->interner, name, &k) != 0)
        return; /* gone since SCAN saw it, or not an object (foreign, another type) */
    if (lmc_l2_size_index_put(R->index, lmc_l2_key_id(name, len), (uint64_t)size) != 0 ||
        (R->keep_found && lmc_l2_found_add(&R->found, &k, (uint64_t)size, batch,
                                           (int64_t)pos) != 0))
        return;
    R->rebuild_keys++;
}

/* ---- health (docs/l2.md, "Health") ---------------------------------------- */

/* One node answers PING on a connection of its own (the pool's stay with
 * the workers): connect, AUTH when configured, PING -> +PONG. */
static int probe_node(resp_backend *R, const char *host, int port, char *why, size_t cap)
{
    resp_conn c;
    char line[RESP_LINE_MAX];
    lmc_resp_conn_init(&c);
    if (lmc_resp_conn_open_why(&c, host, port, R->timeout_ms, why, cap) != 0)
        return -1;
    int rc = -1;
    if (R->password[0] && send_auth(R, &c, line, sizeof line) != 0)
        snprintf(why, cap, "%s:%d: no answer to AUTH within %d ms", host, port, R->timeout_ms);
    else if (R->password[0] && strcmp(line, "+OK") != 0)
        snprintf(why, cap, "%s:%d: AUTH refused: %s", host, port, line);
    else if (lmc_resp_send_command(&c, (resp_arg[]){{"PING", 4}}, 1) != 0 ||
             lmc_resp_read_line(&c, line, sizeof line) != 0)
        snprintf(why, cap, "%s:%d: no answer to PING within %d ms", host, port, R->timeout_ms);
    else if (strcmp(line, "+PONG") != 0)
        snprintf(why, cap, "%s:%d: PING answered %s", host, port, line);
    else
        rc = 0;
    lmc_resp_conn_close(&c);
    return rc;
}

/* Every node known so far (the seed, and a cluster's masters once learnt). */
static int resp_probe(lmc_l2_backend *b, char *why, size_t cap)
{
    resp_backend *R = (resp_backend *)b;
    int n = atomic_load(&R->n_nodes);
    for (int i = 0; i < n; i++) {
        if (probe_node(R, R->nodes[i].host, R->nodes[i].port, why, cap) != 0)
            return -1;
    }
    return 0;
}

/* Fills the index from what Redis holds (docs/l2.md, "Usage and capacity of
 * resp and s3"), within REBUILD_MAX_MS.  A Redis that is down leaves it
 * empty: usage then counts only what this process stores. */
static void rebuild(resp_backend *R)
{
    int64_t start = lmc_l2_now_ms();
    char why[RESP_LINE_MAX + 300];
    if (probe_node(R, R->nodes[0].host, R->nodes[0].port, why, sizeof why) != 0) {
        R->rebuild_ms = (uint64_t)(lmc_l2_now_ms() - start);
        LMC_WARN("resp: cannot count the objects already stored (%s): usage counts only what "
                 "this server stores (docs/l2.md)",
                 why);
        return;
    }
    pool_slot *ps = pool_acquire(R);
    learn_cluster(R, ps);
    bool complete = true;
    int nodes = atomic_load(&R->n_nodes);
    for (int node = 0; node < nodes; node++) {
        if (node == 0 && nodes > 1 && !owns_slots(R, 0))
            continue; /* the seed is a replica: its master is scanned instead */
        complete &= scan_node(R, ps, node, "*", start + REBUILD_MAX_MS, rebuild_key, &node) == 0;
    }
    pool_release(R, ps);
    R->rebuild_complete = complete;
    R->rebuild_ms = (uint64_t)(lmc_l2_now_ms() - start);
    if (!complete)
        LMC_WARN("resp: counted %llu objects in %s:%d within %llu ms, not all of them: usage "
                 "counts those and what this server stores (docs/l2.md)",
                 (unsigned long long)R->rebuild_keys, R->nodes[0].host, R->nodes[0].port,
                 (unsigned long long)R->rebuild_ms);
}

static void resp_for_each_recovered(lmc_l2_backend *b, lmc_l2_recovered_fn fn, void *user)
{
    resp_backend *R = (resp_backend *)b;
    lmc_l2_found_hand_over(&R->found, fn, user);
}

/* ---- status, lifetime ------------------------------------------------------ */

static json_t *resp_status(lmc_l2_backend *b)
{
    resp_backend *R = (resp_backend *)b;
    json_t *nodes = json_array();
    int n = atomic_load(&R->n_nodes);
    for (int i = 0; i < n; i++)
        json_array_append_new(nodes, json_sprintf("%s:%d", R->nodes[i].host, R->nodes[i].port));
    return json_pack("{s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:b}}",
                     "nodes", nodes, "stores", (json_int_t)atomic_load(&R->stores),
                     "store_errors", (json_int_t)atomic_load(&R->store_errors),
                     "stores_refused_full", (json_int_t)atomic_load(&R->stores_refused),
                     "gets", (json_int_t)atomic_load(&R->gets),
                     "get_hits", (json_int_t)atomic_load(&R->hits),
                     "io_errors", (json_int_t)atomic_load(&R->io_errors),
                     "cluster_redirects", (json_int_t)atomic_load(&R->redirects),
                     "stored_bytes", (json_int_t)atomic_load(&R->stored_bytes),
                     "usage_rebuild", "keys", (json_int_t)R->rebuild_keys, "ms",
                     (json_int_t)R->rebuild_ms, "complete", R->rebuild_complete);
}

static void resp_destroy(lmc_l2_backend *b)
{
    resp_backend *R = (resp_backend *)b;
    for (size_t i = 0; R->slots && i < R->n_slots; i++) {
        for (int n = 0; n < MAX_NODES; n++)
            lmc_resp_conn_close(&R->slots[i].conns[n]);
    }
    free(R->slots);
    lmc_l2_found_clear(&R->found);
    lmc_l2_size_index_free(R->index);
    lmc_key_interner_free(R->interner);
    pthread_mutex_destroy(&R->nodes_lock);
    pthread_mutex_destroy(&R->pool_lock);
    pthread_cond_destroy(&R->pool_free);
    free(R);
}

static const lmc_l2_backend_ops resp_ops = {
    .store = resp_store,
    .lookup_and_lock = resp_lookup,
    .load = resp_load,
    .unlock = resp_unlock,
    .remove = resp_remove,
    .usage = resp_usage,
    .list = resp_list,
    .status = resp_status,
    .destroy = resp_destroy,
    .for_each_recovered = resp_for_each_recovered,
    .probe = resp_probe,
};

static const lmc_l2_store_batch_ops resp_batch_ops = {
    .begin = resp_store_begin,
    .part = resp_store_part,
    .end = resp_store_end,
};

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

lmc_l2_backend *lmc_l2_resp_new(const lmc_l2_resp_options *o, char *err, size_t errlen)
{
    const char *host = env_or("LMCACHE_RESP_HOST", o->host);
    const char *port_env = getenv("LMCACHE_RESP_PORT");
    int port = port_env && *port_env ? atoi(port_env) : o->port;
    if (!host || !*host || port < 1 || port > 65535 || strlen(host) >= sizeof(((resp_node *)0)->host)) {
        snprintf(err, errlen, "resp: need a host and a port in 1..65535");
        return NULL;
    }
    resp_backend *R = calloc(1, sizeof *R);
    if (!R)
        goto oom;
    /* Stores are split through the store_batch ops (docs/l2.md, "Parts"). */
    R->base = (lmc_l2_batch_backend){
        .base = {.ops = &resp_ops, .type = "resp",
                 .split_ops = LMC_L2_SPLIT_LOOKUP | LMC_L2_SPLIT_LOAD | LMC_L2_SPLIT_STORE_BATCH},
        .store_batch = &resp_batch_ops};
    snprintf(R->username, sizeof R->username, "%s", env_or("LMCACHE_RESP_USERNAME", o->username ? o->username : ""));
    snprintf(R->password, sizeof R->password, "%s", env_or("LMCACHE_RESP_PASSWORD", o->password ? o->password : ""));
    R->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;
    R->keep_found = o->keep_found;
    R->n_slots = o->num_connections ? o->num_connections : 1;
    R->slots = calloc(R->n_slots, sizeof *R->slots);
    R->interner = lmc_key_interner_new();
    R->index = lmc_l2_size_index_new(o->capacity_bytes);
    pthread_mutex_init(&R->nodes_lock, NULL);
    pthread_mutex_init(&R->pool_lock, NULL);
    pthread_cond_init(&R->pool_free, NULL);
    for (size_t i = 0; R->slots && i < R->n_slots; i++) {
        for (int n = 0; n < MAX_NODES; n++)
            lmc_resp_conn_init(&R->slots[i].conns[n]);
    }
    if (!R->slots || !R->interner || !R->index) {
        resp_destroy(&R->base.base);
        R = NULL;
        goto oom;
    }
    node_index(R, host, port); /* node 0: owner of every slot until told otherwise */
    rebuild(R);
    return &R->base.base;
oom:
    free(R);
    snprintf(err, errlen, "resp: out of memory");
    return NULL;
}
