/* "p2p" backend: a peer lmcached's L1, read-only (docs/p2p.md, "Requesting
 * side").  Lookup leases the leading hits on the peer (op 29, then op 30
 * until a result or the lookup timeout) and remembers each hit's place in
 * the peer's arena; load reads those ranges over the transfer channel into
 * the local buffers; unlock gives the leases back (op 31, not waited for).
 * Stores are 0-byte successes.  Every failure is a miss, never fatal. */
#include <msgpack.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <zmq.h>

#include "p2p/p2p_chan.h"
#include "p2p/p2p_ucx.h"
#include "rpc/client.h"
#include "storage/key_table.h"
#include "storage/l2/l2_adapter.h"
#include "storage/object_key_msgpack.h"

#define OP_LOOKUP_AND_LOCK 29
#define OP_QUERY_RESULTS 30
#define OP_UNLOCK 31
#define RPC_DEADLINE_MS 3000        /* one op's reply (docs/p2p.md) */

typedef struct leased {
    lmc_object_key key;             /* strings interned in p2p.interner */
    uint64_t offset, size;          /* in the peer's arena */
    uint32_t count;                 /* lookups that leased it, not yet unlocked */
} leased;

typedef struct p2p {
    lmc_l2_backend base;            /* first */
    pthread_mutex_t rpc_mu;         /* the RPC client: one op at a time */
    pthread_mutex_t mu;             /* the table, the pending unlocks, the counters */
    lmc_client *rpc;
    msgpack_sbuffer pending;        /* ObjectKey maps to unlock, not yet sent */
    size_t n_pending;
    lmc_p2p_chan_client *chan;      /* engine tcp; reads serialise on their own */
    lmc_p2p_ucx_client *ucx;        /* engine ucx */
    lmc_key_table table;
    lmc_key_interner *interner;
    char *mq_url, *chan_url;
    bool authenticated;             /* the channel proves a token (docs/p2p.md, "Trust model") */
    uint8_t holder[16];             /* the routing id of rpc: whose leases the channel reads */
    int lookup_timeout_ms, load_timeout_ms;
    double down_until_ms;           /* a peer that did not answer: skipped until then */
    int backoff_ms;                 /* the last skip's length; 0 while the peer answers */
    lmc_l2_p2p_stats st;
} p2p;

/* A peer that answered no op is skipped for 1 s, then 2, 4... 30 s while
 * it stays silent, so that a dead peer costs one lookup its deadline per
 * backoff, not every lookup (docs/p2p.md, "Requesting side"). */
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS 30000

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void pack_keys(msgpack_packer *pk, const lmc_object_key *keys, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        lmc_object_key_pack_msgpack(pk, &keys[i]);
}

/* A reply and its unpacked form, whose strings point into the reply. */
typedef struct answer {
    lmc_client_reply r;
    msgpack_unpacked u;
} answer;

static void answer_free(answer *a)
{
    msgpack_unpacked_destroy(&a->u);
    lmc_client_reply_free(&a->r);
}

/* One op with one argument frame; 0 with *a filled (nil for None; the
 * caller frees it), or -1.  Under rpc_mu. */
static int call(p2p *p, int op, msgpack_sbuffer *arg, int timeout_ms, answer *a)
{
    memset(a, 0, sizeof *a);
    msgpack_unpacked_init(&a->u);
    if (lmc_client_call(p->rpc, op, arg, 1, timeout_ms, &a->r) == LMC_CLIENT_OK &&
        (!a->r.has_response ||
         msgpack_unpack_next(&a->u, (const char *)a->r.data, a->r.len, NULL) ==
             MSGPACK_UNPACK_SUCCESS))
        return 0;
    answer_free(a);
    return -1;
}

/* How a lease attempt ended. */
typedef enum {
    LEASE_OK,          /* *result holds a list of one address per key */
    LEASE_SILENT,      /* the peer answered no op by its deadline: down or stalled */
    LEASE_BAD,         /* an answer that is not the protocol's: the peer lies */
    LEASE_LATE,        /* it answered, but no result came within the lookup timeout */
} lease_end;

/* The lease result's list, polled until it arrives or the deadline.
 * Under rpc_mu. */
static lease_end lease(p2p *p, const lmc_object_key *keys, size_t n, answer *result)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_keys(&pk, keys, n);
    answer got;
    int first = p->lookup_timeout_ms < RPC_DEADLINE_MS ? p->lookup_timeout_ms : RPC_DEADLINE_MS;
    int rc = call(p, OP_LOOKUP_AND_LOCK, &sb, first, &got);
    msgpack_sbuffer_destroy(&sb);
    if (rc != 0)
        return LEASE_SILENT;
    bool is_id = got.u.data.type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    uint64_t task = got.u.data.via.u64;
    answer_free(&got);
    if (!is_id)
        return LEASE_BAD;
    double deadline = now_ms() + p->lookup_timeout_ms;
    for (double left; (left = deadline - now_ms()) > 0;) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_uint64(&pk, task);
        rc = call(p, OP_QUERY_RESULTS, &sb, left < RPC_DEADLINE_MS ? (int)left + 1
                                                                   : RPC_DEADLINE_MS, result);
        msgpack_sbuffer_destroy(&sb);
        if (rc != 0)
            return LEASE_SILENT;
        msgpack_object_type t = result->u.data.type;
        if (t == MSGPACK_OBJECT_ARRAY && result->u.data.via.array.size == n)
            return LEASE_OK;
        answer_free(result);
        if (t != MSGPACK_OBJECT_NIL)   /* only None means "not yet" */
            return LEASE_BAD;
        nanosleep(&(struct timespec){0, 5000000}, NULL);   /* 5 ms between polls */
    }
    return LEASE_LATE;
}

static bool address_of(const msgpack_object *o, uint64_t *off, uint64_t *size)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return false;
    int64_t v[2] = {-1, 0};
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            continue;
        int which = kv->key.via.str.size == 6 && !memcmp(kv->key.via.str.ptr, "offset", 6) ? 0
                    : kv->key.via.str.size == 4 && !memcmp(kv->key.via.str.ptr, "size", 4) ? 1
                                                                                          : -1;
        if (which >= 0 && kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            v[which] = (int64_t)kv->val.via.u64;
    }
    *off = (uint64_t)v[0];
    *size = (uint64_t)v[1];
    return v[0] >= 0 && v[1] > 0;
}

static int remember(p2p *p, const lmc_object_key *k, uint64_t off, uint64_t size)
{
    leased *it = lmc_key_table_find(&p->table, k);
    if (it) {
        it->offset = off;   /* the same object, or the peer moved it: the newest place */
        it->size = size;
        it->count++;
        return 0;
    }
    it = calloc(1, sizeof *it);
    if (!it)
        return -1;
    it->key = *k;
    it->key.model_name = lmc_intern(p->interner, k->model_name, strlen(k->model_name));
    it->key.cache_salt = lmc_intern(p->interner, k->cache_salt, strlen(k->cache_salt));
    it->key.interned = 0;
    it->offset = off;
    it->size = size;
    it->count = 1;
    if (!it->key.model_name || !it->key.cache_salt || lmc_key_table_insert(&p->table, it) != 0) {
        free(it);
        return -1;
    }
    return 0;
}

/* Unlocks are queued, and sent by whichever thread holds the RPC client
 * next: an unlock (the prefetch controller's thread) never waits behind a
 * lookup that waits for a slow peer.  They must go over this client's
 * socket: the peer gives back only the leases that connection took
 * (docs/p2p.md, "The ops").  Under mu. */
static void queue_unlock(p2p *p, const lmc_object_key *keys, size_t n)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &p->pending, msgpack_sbuffer_write);
    for (size_t i = 0; i < n; i++)
        lmc_object_key_pack_msgpack(&pk, &keys[i]);
    p->n_pending += n;
}

/* Under rpc_mu: sends what is queued (its reply is dropped by the next
 * call). */
static void flush_unlocks(p2p *p)
{
    pthread_mutex_lock(&p->mu);
    msgpack_sbuffer body = p->pending;
    size_t n = p->n_pending;
    msgpack_sbuffer_init(&p->pending);
    p->n_pending = 0;
    p->st.unlocks += n;
    pthread_mutex_unlock(&p->mu);
    if (n) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, n);
        msgpack_sbuffer_write(&sb, body.data, body.size);
        lmc_client_send(p->rpc, OP_UNLOCK, &sb, 1);
        msgpack_sbuffer_destroy(&sb);
    }
    msgpack_sbuffer_destroy(&body);
}

/* Gives rpc_mu back with nothing queued behind it: an unlock queued while
 * it was held is sent here, or by the thread that takes it next. */
static void release_rpc(p2p *p)
{
    for (;;) {
        flush_unlocks(p);
        pthread_mutex_unlock(&p->rpc_mu);
        pthread_mutex_lock(&p->mu);
        bool more = p->n_pending > 0;
        pthread_mutex_unlock(&p->mu);
        if (!more || pthread_mutex_trylock(&p->rpc_mu) != 0)
            return;
    }
}

/* A fresh socket (same routing id) after a peer fell silent: ZMQ keeps
 * what was sent to a peer that is down and delivers it when the peer comes
 * back, and a lookup delivered then would lease objects on the restarted
 * peer that no one queries or unlocks until their TTL.  Closing the socket
 * (linger 0) drops them.  Under rpc_mu; on failure the old socket stays. */
static void redial(p2p *p)
{
    lmc_client *fresh = lmc_client_connect_as(p->mq_url, p->holder, sizeof p->holder);
    if (!fresh)
        return;
    lmc_client_close(p->rpc);
    p->rpc = fresh;
}

/* Whether the peer is in its backoff now (the lookup then misses at once). */
static bool skipped(p2p *p)
{
    pthread_mutex_lock(&p->mu);
    bool skip = now_ms() < p->down_until_ms;
    p->st.lookups_skipped += skip;
    pthread_mutex_unlock(&p->mu);
    return skip;
}

/* Under mu: the books after a lease attempt. */
static void count_lease(p2p *p, lease_end end)
{
    p->st.lookups++;
    p->st.lookup_failures += end != LEASE_OK;
    p->st.lookup_timeouts += end == LEASE_SILENT || end == LEASE_LATE;
    p->st.bad_answers += end == LEASE_BAD;
    if (end == LEASE_SILENT) {
        p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : BACKOFF_FIRST_MS;
        if (p->backoff_ms > BACKOFF_MAX_MS)
            p->backoff_ms = BACKOFF_MAX_MS;
        p->down_until_ms = now_ms() + p->backoff_ms;
    } else {
        p->backoff_ms = 0;
    }
}

static void p2p_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                       size_t n, uint8_t *found)
{
    p2p *p = (p2p *)b;
    memset(found, 0, n);
    if (n == 0 || skipped(p))
        return;
    pthread_mutex_lock(&p->rpc_mu);
    flush_unlocks(p);
    answer res;
    lease_end end = lease(p, keys, n, &res);
    if (end == LEASE_SILENT)
        redial(p);
    pthread_mutex_lock(&p->mu);
    count_lease(p, end);
    /* The peer leased the leading run of keys with an address; this server
     * takes the leading run of those with the size it expects. */
    size_t leased_n = 0;
    bool taking = true;
    for (size_t i = 0; end == LEASE_OK && i < n; i++) {
        uint64_t off, size;
        if (!address_of(&res.u.data.via.array.ptr[i], &off, &size))
            break;
        leased_n = i + 1;
        taking = taking && (!sizes || sizes[i] == size) && remember(p, &keys[i], off, size) == 0;
        if (taking) {
            found[i] = 1;
            p->st.hits++;
        }
    }
    if (end == LEASE_OK)
        answer_free(&res);
    /* Leased on the peer but not taken here (a size this server would not
     * accept, no memory): given back at once. */
    size_t taken = 0;
    while (taken < n && found[taken])
        taken++;
    if (leased_n > taken)
        queue_unlock(p, keys + taken, leased_n - taken);
    pthread_mutex_unlock(&p->mu);
    release_rpc(p);
}

static void p2p_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                     const uint64_t *sizes, size_t n, uint8_t *ok)
{
    p2p *p = (p2p *)b;
    memset(ok, 0, n);
    lmc_p2p_chan_item *items = calloc(n ? n : 1, sizeof *items);
    size_t *which = calloc(n ? n : 1, sizeof *which);
    bool *got = calloc(n ? n : 1, sizeof *got);
    size_t m = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; items && which && got && i < n; i++) {
        const leased *it = lmc_key_table_find(&p->table, &keys[i]);
        if (it && it->size == sizes[i]) {
            items[m] = (lmc_p2p_chan_item){it->offset, it->size, bufs[i]};
            which[m++] = i;
        }
    }
    p->st.loads++;
    pthread_mutex_unlock(&p->mu);
    size_t read = !m     ? 0
                  : p->chan ? lmc_p2p_chan_client_read(p->chan, items, m, p->load_timeout_ms, got)
                            : lmc_p2p_ucx_client_read(p->ucx, items, m, p->load_timeout_ms, got);
    uint64_t bytes = 0;
    for (size_t j = 0; j < m; j++) {
        ok[which[j]] = got[j];
        bytes += got[j] ? items[j].len : 0;
    }
    pthread_mutex_lock(&p->mu);
    p->st.loaded_bytes += bytes;
    p->st.load_failures += n - read;
    pthread_mutex_unlock(&p->mu);
    free(items);
    free(which);
    free(got);
}

static void p2p_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    p2p *p = (p2p *)b;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        leased *it = lmc_key_table_find(&p->table, &keys[i]);
        if (it && --it->count == 0)
            free(lmc_key_table_remove(&p->table, &keys[i]));
    }
    queue_unlock(p, keys, n);
    pthread_mutex_unlock(&p->mu);
    if (n && pthread_mutex_trylock(&p->rpc_mu) == 0)
        release_rpc(p);
}

static int64_t p2p_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                         const uint64_t *sizes, size_t n)
{
    (void)b, (void)keys, (void)bufs, (void)sizes, (void)n;
    return 0;   /* read-only: a store is a 0-byte success (docs/p2p.md) */
}

static size_t p2p_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    (void)b, (void)keys, (void)n;
    return 0;
}

static void p2p_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    (void)b;
    *u = (lmc_l2_usage){0};
}

static void p2p_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    (void)b, (void)model, (void)entries;   /* the peer's keys are not ours to list */
}

void lmc_l2_p2p_stats_get(lmc_l2_backend *b, lmc_l2_p2p_stats *out)
{
    p2p *p = (p2p *)b;
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

static json_t *p2p_status(lmc_l2_backend *b)
{
    p2p *p = (p2p *)b;
    lmc_l2_p2p_stats st;
    lmc_l2_p2p_stats_get(b, &st);
    pthread_mutex_lock(&p->mu);
    double down_ms = p->down_until_ms - now_ms();
    pthread_mutex_unlock(&p->mu);
    return json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                     "s:b}",
                     "peer_mq_server_url", p->mq_url, "peer_transfer_channel_server_url",
                     p->chan_url, "transfer_engine", p->ucx ? "ucx" : "tcp", "lookups",
                     (json_int_t)st.lookups, "lookup_failures", (json_int_t)st.lookup_failures,
                     "lookup_timeouts", (json_int_t)st.lookup_timeouts, "bad_answers",
                     (json_int_t)st.bad_answers, "lookups_skipped",
                     (json_int_t)st.lookups_skipped, "hits", (json_int_t)st.hits, "loads",
                     (json_int_t)st.loads, "loaded_bytes", (json_int_t)st.loaded_bytes,
                     "load_failures", (json_int_t)st.load_failures, "unlocks",
                     (json_int_t)st.unlocks, "backoff_ms",
                     (json_int_t)(down_ms > 0 ? down_ms : 0), "authenticated",
                     p->authenticated);
}

/* What is still queued goes out before the socket closes, given a moment
 * to leave: a peer then gives its leases back now rather than at their TTL
 * (a retired peer's last unlock, or shutdown). */
static void send_last_unlocks(p2p *p)
{
    if (!p->rpc || p->n_pending == 0)
        return;
    flush_unlocks(p);
    int linger_ms = 200;
    zmq_setsockopt(lmc_client_socket(p->rpc), ZMQ_LINGER, &linger_ms, sizeof linger_ms);
}

static void p2p_destroy(lmc_l2_backend *b)
{
    p2p *p = (p2p *)b;
    send_last_unlocks(p);
    for (size_t i = 0; i < p->table.capacity; i++)
        free(lmc_key_table_slot_item(&p->table, i));
    lmc_key_table_destroy(&p->table);
    lmc_key_interner_free(p->interner);
    if (p->chan)
        lmc_p2p_chan_client_close(p->chan);
    if (p->ucx)
        lmc_p2p_ucx_client_close(p->ucx);
    if (p->rpc)
        lmc_client_close(p->rpc);
    free(p->mq_url);
    free(p->chan_url);
    msgpack_sbuffer_destroy(&p->pending);
    pthread_mutex_destroy(&p->rpc_mu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static const lmc_l2_backend_ops p2p_ops = {
    p2p_store, p2p_lookup, p2p_load, p2p_unlock, p2p_remove, p2p_usage, p2p_list, p2p_status,
    p2p_destroy, NULL, /* nothing of ours to recover */
    NULL,              /* a peer that is down is a miss, not an unhealthy tier */
};

lmc_l2_backend *lmc_l2_p2p_new(const lmc_l2_p2p_options *o, char *err, size_t errlen)
{
    p2p *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->base = (lmc_l2_backend){&p2p_ops, "p2p", 0};
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->rpc_mu, NULL);
    msgpack_sbuffer_init(&p->pending);
    p->lookup_timeout_ms = (int)(o->lookup_timeout_s * 1000);
    p->load_timeout_ms = (int)(o->load_timeout_s * 1000);
    p->authenticated = o->auth_token && o->auth_token[0];
    p->mq_url = strdup(o->peer_mq_server_url);
    p->chan_url = strdup(o->peer_transfer_channel_server_url);
    p->interner = lmc_key_interner_new();
    /* A random routing id (the first byte not 0, as ZMQ wants), named to the
     * channel too, so that the peer serves this reader only the leases its
     * own lookups took (docs/p2p.md, "Trust model"). */
    if (getrandom(p->holder, sizeof p->holder, 0) != (ssize_t)sizeof p->holder) {
        snprintf(err, errlen, "getrandom failed");
        goto fail;
    }
    p->holder[0] |= 1;
    lmc_p2p_chan_client_opts co = {.url = o->peer_transfer_channel_server_url,
                                   .auth_token = o->auth_token, .holder = p->holder,
                                   .holder_len = sizeof p->holder};
    if (!p->mq_url || !p->chan_url || !p->interner ||
        lmc_key_table_init(&p->table, offsetof(leased, key), 64) != 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (o->ucx)
        p->ucx = lmc_p2p_ucx_client_open(&co, err, errlen);
    else
        p->chan = lmc_p2p_chan_client_open(&co, err, errlen);
    bool reader = p->chan || p->ucx;
    p->rpc = reader ? lmc_client_connect_as(o->peer_mq_server_url, p->holder, sizeof p->holder)
                    : NULL;
    if (reader && !p->rpc)
        snprintf(err, errlen, "peer_mq_server_url: cannot connect to '%s'",
                 o->peer_mq_server_url);
    if (!p->rpc)
        goto fail;
    return &p->base;
fail:
    p2p_destroy(&p->base);
    return NULL;
}
