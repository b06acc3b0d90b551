/* "resp" backend: see l2_resp.h.
 *
 * Connections: `num_connections` pool slots; each slot holds one lazily
 * opened connection per known cluster node, and a worker thread borrows a
 * whole slot for one backend call, so calls never share a socket.  A
 * broken connection is closed and reopened on next use: a Redis restart
 * costs the operations in flight, not a server restart.
 *
 * Cluster: slot_owner maps each of the 16384 hash slots to a node index
 * (0 = the configured node until a MOVED says otherwise).  MOVED updates
 * the map and retries; ASK retries once on the named node after ASKING. */
#include "storage/l2/l2_resp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/log.h"
#include "storage/l2/l2_resp_conn.h"

#define MAX_NODES 16
#define MAX_REDIRECTS 5
#define NUM_SLOTS 16384

typedef struct {
    char host[256];
    int port;
} resp_node;

typedef struct {
    resp_conn conns[MAX_NODES];
    bool busy;
} pool_slot;

typedef struct resp_backend {
    lmc_l2_backend base;               /* first: a backend pointer is a resp pointer */
    char username[128], password[256];
    int timeout_ms;
    uint64_t capacity;
    pthread_mutex_t nodes_lock;        /* guards nodes[] appends */
    resp_node nodes[MAX_NODES];
    atomic_int n_nodes;
    _Atomic uint8_t slot_owner[NUM_SLOTS];
    pthread_mutex_t pool_lock;
    pthread_cond_t pool_free;
    pool_slot *slots;
    size_t n_slots;
    lmc_key_interner *interner;        /* keys parsed back by list() */
    _Atomic uint64_t stored_bytes, stores, store_errors, gets, hits, io_errors, redirects;
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

static int authenticate(resp_backend *R, resp_conn *c)
{
    if (!R->password[0])
        return 0;
    resp_arg args[3] = {{"AUTH", 4}};
    size_t n = 1;
    if (R->username[0])
        args[n++] = (resp_arg){R->username, strlen(R->username)};
    args[n++] = (resp_arg){R->password, strlen(R->password)};
    char line[RESP_LINE_MAX];
    if (resp_send_command(c, args, n) != 0 || resp_read_line(c, line, sizeof line) != 0 ||
        strcmp(line, "+OK") != 0) {
        resp_conn_close(c);
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
    if (resp_conn_open(c, R->nodes[node].host, R->nodes[node].port, R->timeout_ms) != 0 ||
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
    return resp_send_command(c, &asking, 1) == 0 && resp_read_line(c, line, sizeof line) == 0 &&
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
        if ((asking && send_asking(c) != 0) || resp_send_command(c, args, nargs) != 0 ||
            resp_read_line(c, line, sizeof line) != 0) {
            atomic_fetch_add(&R->io_errors, 1);
            resp_conn_close(c);
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
    if (line[0] != ':' || !resp_parse_int(line, out))
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
    if (line[0] != '$' || !resp_parse_int(line, &len) || len < 0)
        return 0;
    if ((uint64_t)len != g->size)
        return resp_read_bulk_body(c, NULL, (size_t)len);
    if (resp_read_bulk_body(c, g->buf, (size_t)len) != 0)
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

static int64_t resp_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                          const uint64_t *sizes, size_t n)
{
    resp_backend *R = (resp_backend *)b;
    pool_slot *ps = pool_acquire(R);
    int64_t total = 0;
    for (size_t i = 0; i < n && total >= 0; i++) {
        char key[1024];
        size_t kl = key_string(&keys[i], key, sizeof key);
        resp_arg args[3] = {{"SET", 3}, {key, kl}, {bufs[i], sizes[i]}};
        bool ok = false;
        if (kl && execute(R, ps, key, kl, args, 3, reply_ok, &ok) == 0 && ok)
            total += (int64_t)sizes[i];
        else
            total = -1;
    }
    pool_release(R, ps);
    atomic_fetch_add(&R->stores, 1);
    if (total < 0)
        atomic_fetch_add(&R->store_errors, 1);
    else
        atomic_fetch_add(&R->stored_bytes, (uint64_t)total);
    return total;
}

static void resp_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                        size_t n, uint8_t *found)
{
    resp_backend *R = (resp_backend *)b;
    pool_slot *ps = pool_acquire(R);
    for (size_t i = 0; i < n; i++) {
        char key[1024];
        size_t kl = key_string(&keys[i], key, sizeof key);
        resp_arg args[2] = {{"STRLEN", 6}, {key, kl}};
        int64_t len = -1;
        found[i] = kl && execute(R, ps, key, kl, args, 2, reply_int, &len) == 0 && len > 0 &&
                   (!sizes || (uint64_t)len == sizes[i]);
    }
    pool_release(R, ps);
}

static void resp_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                      const uint64_t *sizes, size_t n, uint8_t *ok)
{
    resp_backend *R = (resp_backend *)b;
    pool_slot *ps = pool_acquire(R);
    for (size_t i = 0; i < n; i++) {
        char key[1024];
        size_t kl = key_string(&keys[i], key, sizeof key);
        resp_arg args[2] = {{"GET", 3}, {key, kl}};
        get_ctx g = {bufs[i], sizes[i], false};
        ok[i] = kl && execute(R, ps, key, kl, args, 2, reply_get, &g) == 0 && g.ok;
        atomic_fetch_add(&R->gets, 1);
        if (ok[i])
            atomic_fetch_add(&R->hits, 1);
    }
    pool_release(R, ps);
}

/* Redis has no pins: an object can vanish between lookup and load, which
 * the load then reports as a failure (a miss), never as wrong bytes. */
static void resp_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    (void)b, (void)keys, (void)n;
}

static size_t resp_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    resp_backend *R = (resp_backend *)b;
    pool_slot *ps = pool_acquire(R);
    size_t deleted = 0;
    for (size_t i = 0; i < n; i++) {
        char key[1024];
        size_t kl = key_string(&keys[i], key, sizeof key);
        resp_arg args[2] = {{"DEL", 3}, {key, kl}};
        int64_t count = 0;
        if (kl && execute(R, ps, key, kl, args, 2, reply_int, &count) == 0 && count > 0)
            deleted++;
    }
    pool_release(R, ps);
    return deleted;
}

static void resp_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    resp_backend *R = (resp_backend *)b;
    /* Bytes this server wrote: Redis may hold more (other servers) or less
     * (its own eviction); exact accounting needs the L2 eviction layer. */
    *u = (lmc_l2_usage){.used_bytes = atomic_load(&R->stored_bytes),
                        .capacity_bytes = R->capacity};
}

/* ---- list (SCAN) ----------------------------------------------------------- */

static int read_bulk_string(resp_conn *c, char *out, size_t cap, size_t *len)
{
    char line[RESP_LINE_MAX];
    int64_t n;
    if (resp_read_line(c, line, sizeof line) != 0 || line[0] != '$' ||
        !resp_parse_int(line, &n) || n < 0)
        return -1;
    if ((uint64_t)n >= cap) { /* not one of ours: skip it */
        *len = 0;
        return resp_read_bulk_body(c, NULL, (size_t)n);
    }
    *len = (size_t)n;
    if (resp_read_bulk_body(c, out, (size_t)n) != 0)
        return -1;
    out[n] = '\0';
    return 0;
}

static void list_key(resp_backend *R, pool_slot *ps, const char *key, size_t kl, json_t *entries)
{
    lmc_object_key k;
    if (lmc_object_key_parse_string(R->interner, key, &k) != 0)
        return; /* a foreign key in the same Redis */
    resp_arg args[2] = {{"STRLEN", 6}, {key, kl}};
    int64_t size = -1;
    if (execute(R, ps, key, kl, args, 2, reply_int, &size) != 0 || size < 0)
        return;
    json_array_append_new(entries, json_pack("{s:o, s:I, s:s}", "key", lmc_l2_encode_key(&k),
                                             "size_bytes", (json_int_t)size, "name", key));
}

/* One SCAN page on `c`; returns the next cursor (0 = done) or -1. */
static long long scan_page(resp_backend *R, pool_slot *ps, resp_conn *c, long long cursor,
                           const char *pattern, json_t *entries)
{
    char cur[32], line[RESP_LINE_MAX];
    snprintf(cur, sizeof cur, "%lld", cursor);
    resp_arg args[6] = {{"SCAN", 4}, {cur, strlen(cur)}, {"MATCH", 5},
                        {pattern, strlen(pattern)}, {"COUNT", 5}, {"1000", 4}};
    int64_t n;
    size_t len;
    if (resp_send_command(c, args, 6) != 0 || resp_read_line(c, line, sizeof line) != 0 ||
        strcmp(line, "*2") != 0 || read_bulk_string(c, cur, sizeof cur, &len) != 0 ||
        resp_read_line(c, line, sizeof line) != 0 || line[0] != '*' || !resp_parse_int(line, &n))
        return -1;
    /* Collect the page first: STRLEN lookups would interleave with it. */
    char (*keys)[1024] = n > 0 ? malloc((size_t)n * sizeof *keys) : NULL;
    size_t *lens = n > 0 ? malloc((size_t)n * sizeof *lens) : NULL;
    if (n > 0 && (!keys || !lens)) {
        free(keys);
        free(lens);
        return -1;
    }
    int64_t got = 0;
    for (; got < n; got++) {
        if (read_bulk_string(c, keys[got], sizeof keys[got], &lens[got]) != 0)
            break;
    }
    for (int64_t i = 0; i < got; i++) {
        if (lens[i])
            list_key(R, ps, keys[i], lens[i], entries);
    }
    free(keys);
    free(lens);
    return got == n ? atoll(cur) : -1;
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
    int nodes = atomic_load(&R->n_nodes); /* every node seen so far */
    for (int node = 0; node < nodes; node++) {
        resp_conn *c = conn_for(R, ps, node);
        long long cursor = 0;
        do {
            cursor = c ? scan_page(R, ps, c, cursor, pattern, entries) : -1;
        } while (cursor > 0);
    }
    pool_release(R, ps);
}

/* ---- status, lifetime ------------------------------------------------------ */

static json_t *resp_status(lmc_l2_backend *b)
{
    resp_backend *R = (resp_backend *)b;
    json_t *nodes = json_array();
    int n = atomic_load(&R->n_nodes);
    for (int i = 0; i < n; i++)
        json_array_append_new(nodes, json_sprintf("%s:%d", R->nodes[i].host, R->nodes[i].port));
    return json_pack("{s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "nodes", nodes,
                     "stores", (json_int_t)atomic_load(&R->stores),
                     "store_errors", (json_int_t)atomic_load(&R->store_errors),
                     "gets", (json_int_t)atomic_load(&R->gets),
                     "get_hits", (json_int_t)atomic_load(&R->hits),
                     "io_errors", (json_int_t)atomic_load(&R->io_errors),
                     "cluster_redirects", (json_int_t)atomic_load(&R->redirects),
                     "stored_bytes", (json_int_t)atomic_load(&R->stored_bytes));
}

static void resp_destroy(lmc_l2_backend *b)
{
    resp_backend *R = (resp_backend *)b;
    for (size_t i = 0; R->slots && i < R->n_slots; i++) {
        for (int n = 0; n < MAX_NODES; n++)
            resp_conn_close(&R->slots[i].conns[n]);
    }
    free(R->slots);
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
    R->base = (lmc_l2_backend){.ops = &resp_ops, .type = "resp"};
    snprintf(R->username, sizeof R->username, "%s", env_or("LMCACHE_RESP_USERNAME", o->username ? o->username : ""));
    snprintf(R->password, sizeof R->password, "%s", env_or("LMCACHE_RESP_PASSWORD", o->password ? o->password : ""));
    R->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;
    R->capacity = o->capacity_bytes;
    R->n_slots = o->num_connections ? o->num_connections : 1;
    R->slots = calloc(R->n_slots, sizeof *R->slots);
    R->interner = lmc_key_interner_new();
    pthread_mutex_init(&R->nodes_lock, NULL);
    pthread_mutex_init(&R->pool_lock, NULL);
    pthread_cond_init(&R->pool_free, NULL);
    for (size_t i = 0; R->slots && i < R->n_slots; i++) {
        for (int n = 0; n < MAX_NODES; n++)
            resp_conn_init(&R->slots[i].conns[n]);
    }
    if (!R->slots || !R->interner) {
        resp_destroy(&R->base);
        R = NULL;
        goto oom;
    }
    node_index(R, host, port); /* node 0: owner of every slot until told otherwise */
    return &R->base;
oom:
    free(R);
    snprintf(err, errlen, "resp: out of memory");
    return NULL;
}
