/* The KV event publisher (docs/kv_events.md, "Publishing to routers").
 * Its thread alone touches the sockets and the replay buffer; the request
 * threads only write the log, which it follows with its own cursor. */
#include "modules/kv_events_publisher.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "modules/kv_events_vllm.h"
#include "rpc/wire.h"

#define WAKE_MS 10
#define HWM 100000

typedef struct {
    uint64_t seq;
    char *payload;
    size_t len;
} kept_batch;

struct lmc_kv_events_publisher {
    lmc_kv_events *log;
    void *zctx, *pub, *router;
    char *endpoint, *topic;
    uint32_t block_size, vllm_block_size;
    lmc_kv_events_vllm *vllm;       /* NULL: LMCache chunk hashes */
    uint64_t cursor;                /* the last log seq published */
    kept_batch *kept;               /* ring of buffer_steps */
    size_t n_kept, cap_kept, first_kept;
    pthread_t thread;
    atomic_bool stop;
    atomic_uint_fast64_t batches, events, replays, next_seq;
};

static void put_be64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
}

static void pack_hashes(msgpack_packer *pk, const lmc_kv_event *r)
{
    msgpack_pack_array(pk, r->n_hashes);
    for (uint32_t i = 0; i < r->n_hashes; i++)
        msgpack_pack_uint64(pk, lmc_kv_events_vllm_int(r->hashes + (size_t)i * r->hash_len,
                                                       r->hash_len));
}

static void pack_medium(msgpack_packer *pk, const lmc_kv_event *r)
{
    lmc_mp_pack_cstr(pk, r->medium == LMC_KV_MEDIUM_CPU ? "CPU" : "STORAGE");
}

static void pack_ints(msgpack_packer *pk, const uint64_t *v, size_t n)
{
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, v[i]);
}

/* What one stored event says: its hashes, parent, tokens and block size. */
typedef struct {
    const lmc_kv_event *r;
    const uint64_t *vllm;   /* NULL: the record's chunk hashes */
    size_t n_vllm;
    bool has_parent;
    uint64_t parent;
    uint32_t n_tokens, block_size;
} stored_view;

/* BlockStored as vLLM's tagged KVCacheEvent structs encode: a map with "type". */
static void pack_stored(msgpack_packer *pk, const stored_view *v)
{
    msgpack_pack_map(pk, 8);
    lmc_mp_pack_cstr(pk, "type");
    lmc_mp_pack_cstr(pk, "BlockStored");
    lmc_mp_pack_cstr(pk, "block_hashes");
    if (v->vllm)
        pack_ints(pk, v->vllm, v->n_vllm);
    else
        pack_hashes(pk, v->r);
    lmc_mp_pack_cstr(pk, "parent_block_hash");
    if (v->has_parent)
        msgpack_pack_uint64(pk, v->parent);
    else
        msgpack_pack_nil(pk);
    lmc_mp_pack_cstr(pk, "token_ids");
    msgpack_pack_array(pk, v->n_tokens);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        msgpack_pack_uint32(pk, v->r->tokens[i]);
    lmc_mp_pack_cstr(pk, "block_size");
    msgpack_pack_uint32(pk, v->block_size);
    lmc_mp_pack_cstr(pk, "lora_id");
    msgpack_pack_nil(pk);
    lmc_mp_pack_cstr(pk, "medium");
    pack_medium(pk, v->r);
    lmc_mp_pack_cstr(pk, "lora_name");
    msgpack_pack_nil(pk);
}

/* A stored record as one BlockStored; false when it is skipped (its vLLM
 * blocks unknown, docs/kv_events.md "vLLM block hashes"). */
static bool pack_stored_record(lmc_kv_events_publisher *p, msgpack_packer *pk,
                               const lmc_kv_event *r)
{
    stored_view v = {.r = r, .n_tokens = r->n_tokens, .block_size = p->block_size};
    if (!p->vllm) {
        v.has_parent = r->has_parent;
        v.parent = r->has_parent ? lmc_kv_events_vllm_int(r->parent, r->hash_len) : 0;
        pack_stored(pk, &v);
        return true;
    }
    lmc_kv_events_vllm_blocks b;
    if (r->n_hashes != 1 ||
        !lmc_kv_events_vllm_stored(p->vllm, r->hashes, r->hash_len,
                                   r->has_parent ? r->parent : NULL, r->tokens, r->n_tokens, &b))
        return false;
    v.vllm = b.hashes;
    v.n_vllm = b.n;
    v.has_parent = b.has_parent;
    v.parent = b.parent;
    v.block_size = p->vllm_block_size;
    v.n_tokens = (uint32_t)(b.n * p->vllm_block_size);
    pack_stored(pk, &v);
    return true;
}

/* The vLLM block ints of a removed record's chunks, those remembered. */
static size_t removed_ints(lmc_kv_events_publisher *p, const lmc_kv_event *r, uint64_t **out)
{
    size_t n = 0, cap = 0;
    *out = NULL;
    for (uint32_t i = 0; i < r->n_hashes; i++) {
        size_t k;
        const uint64_t *ints =
            lmc_kv_events_vllm_removed(p->vllm, r->hashes + (size_t)i * r->hash_len,
                                       r->hash_len, &k);
        if (!ints)
            continue;
        if (n + k > cap) {
            size_t ncap = (n + k) * 2;
            uint64_t *g = realloc(*out, ncap * sizeof **out);
            if (!g)
                break;
            *out = g;
            cap = ncap;
        }
        memcpy(*out + n, ints, k * sizeof **out);
        n += k;
    }
    return n;
}

/* A removed record as one BlockRemoved; false when none of its chunks is known. */
static bool pack_removed_record(lmc_kv_events_publisher *p, msgpack_packer *pk,
                                const lmc_kv_event *r)
{
    uint64_t *ints = NULL;
    size_t n = p->vllm ? removed_ints(p, r, &ints) : 0;
    if (p->vllm && n == 0) {
        free(ints);
        return false;
    }
    msgpack_pack_map(pk, 3);
    lmc_mp_pack_cstr(pk, "type");
    lmc_mp_pack_cstr(pk, "BlockRemoved");
    lmc_mp_pack_cstr(pk, "block_hashes");
    if (p->vllm)
        pack_ints(pk, ints, n);
    else
        pack_hashes(pk, r);
    lmc_mp_pack_cstr(pk, "medium");
    pack_medium(pk, r);
    free(ints);
    return true;
}

/* A KVEventBatch as map (docs/compatibility.md, "KV event publisher").
 * The events are packed first, since some records may publish nothing.
 * Returns the number of events. */
static size_t pack_batch(lmc_kv_events_publisher *p, msgpack_sbuffer *sb,
                         const lmc_kv_events_page *page)
{
    msgpack_sbuffer evs;
    msgpack_sbuffer_init(&evs);
    msgpack_packer epk, pk;
    msgpack_packer_init(&epk, &evs, msgpack_sbuffer_write);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    size_t n = 0;
    if (page->lost) {   /* subscribers drop what they knew and resync */
        msgpack_pack_map(&epk, 1);
        lmc_mp_pack_cstr(&epk, "type");
        lmc_mp_pack_cstr(&epk, "AllBlocksCleared");
        n++;
    }
    for (size_t i = 0; i < page->n; i++) {
        const lmc_kv_event *r = page->entries[i].event;
        n += r->kind == LMC_KV_EVENT_REMOVED ? pack_removed_record(p, &epk, r)
                                             : pack_stored_record(p, &epk, r);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_pack_map(&pk, 3);
    lmc_mp_pack_cstr(&pk, "ts");
    msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    lmc_mp_pack_cstr(&pk, "events");
    msgpack_pack_array(&pk, (uint32_t)n);
    if (evs.size)
        msgpack_sbuffer_write(sb, evs.data, evs.size);
    lmc_mp_pack_cstr(&pk, "data_parallel_rank");
    msgpack_pack_nil(&pk);
    msgpack_sbuffer_destroy(&evs);
    return n;
}

/* Keeps (seq, payload) for replay, the oldest going first; takes payload. */
static void keep(lmc_kv_events_publisher *p, uint64_t seq, char *payload, size_t len)
{
    size_t slot = (p->first_kept + p->n_kept) % p->cap_kept;
    if (p->n_kept == p->cap_kept) {
        free(p->kept[p->first_kept].payload);
        p->first_kept = (p->first_kept + 1) % p->cap_kept;
    } else {
        p->n_kept++;
    }
    p->kept[slot] = (kept_batch){seq, payload, len};
}

/* Publishes the log's next page, if any; true when the page was full. */
static bool publish_next(lmc_kv_events_publisher *p)
{
    lmc_kv_events_page page;
    if (lmc_kv_events_read(p->log, NULL, 0, p->cursor, LMC_KV_EVENTS_MAX_POLL, &page) != 0)
        return false;   /* out of memory: the next wake tries again */
    bool full = page.n == LMC_KV_EVENTS_MAX_POLL;
    p->cursor = page.next_cursor;
    if (page.n == 0 && !page.lost) {
        lmc_kv_events_page_free(&page);
        return false;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    size_t n_events = pack_batch(p, &sb, &page);
    if (n_events == 0) {   /* every record skipped: nothing to announce */
        msgpack_sbuffer_destroy(&sb);
        lmc_kv_events_page_free(&page);
        return full;
    }
    uint64_t seq = atomic_load(&p->next_seq);
    uint8_t be[8];
    put_be64(be, seq);
    zmq_send(p->pub, p->topic, strlen(p->topic), ZMQ_SNDMORE);
    zmq_send(p->pub, be, 8, ZMQ_SNDMORE);
    zmq_send(p->pub, sb.data, sb.size, 0);
    atomic_fetch_add(&p->events, n_events);
    atomic_fetch_add(&p->batches, 1);
    atomic_store(&p->next_seq, seq + 1);
    if (sb.data)
        keep(p, seq, sb.data, sb.size);
    lmc_kv_events_page_free(&page);
    return full;
}

static void send_reply(void *router, const void *id, size_t id_len, const uint8_t seq[8],
                       const void *payload, size_t len)
{
    zmq_send(router, id, id_len, ZMQ_SNDMORE);
    zmq_send(router, "", 0, ZMQ_SNDMORE);
    zmq_send(router, seq, 8, ZMQ_SNDMORE);
    zmq_send(router, payload, len, 0);
}

/* One request [identity, "", start(8B BE)]: every kept batch from start,
 * then the end marker.  Other shapes are ignored, as vLLM does. */
static void serve_request(lmc_kv_events_publisher *p)
{
    uint8_t id[256], frames[2][8];
    int id_len = zmq_recv(p->router, id, sizeof id, ZMQ_DONTWAIT);
    if (id_len < 0)
        return;
    int n_frames = 1, sizes[2] = {-1, -1}, more = 0;
    size_t more_len = sizeof more;
    for (;;) {
        zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &more_len);
        if (!more)
            break;
        uint8_t scratch[8];
        int n = zmq_recv(p->router, n_frames <= 2 ? frames[n_frames - 1] : scratch, 8, 0);
        if (n < 0)
            return;
        if (n_frames <= 2)
            sizes[n_frames - 1] = n;
        n_frames++;
    }
    if (n_frames != 3 || sizes[0] != 0 || sizes[1] != 8 || id_len > (int)sizeof id)
        return;
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | frames[1][i];
    atomic_fetch_add(&p->replays, 1);
    for (size_t i = 0; i < p->n_kept; i++) {
        const kept_batch *b = &p->kept[(p->first_kept + i) % p->cap_kept];
        if (b->seq < start)
            continue;
        uint8_t be[8];
        put_be64(be, b->seq);
        send_reply(p->router, id, (size_t)id_len, be, b->payload, b->len);
    }
    static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    send_reply(p->router, id, (size_t)id_len, end, "", 0);
}

static void *run(void *arg)
{
    lmc_kv_events_publisher *p = arg;
    bool behind = false;
    while (!atomic_load(&p->stop)) {
        zmq_pollitem_t it = {.socket = p->router, .events = ZMQ_POLLIN};
        long wait = behind ? 0 : WAKE_MS;
        if (p->router) {
            if (zmq_poll(&it, 1, wait) > 0 && (it.revents & ZMQ_POLLIN))
                serve_request(p);
        } else if (wait) {
            nanosleep(&(struct timespec){0, wait * 1000000L}, NULL);
        }
        behind = publish_next(p);
    }
    return NULL;
}

static void *bind_socket(lmc_kv_events_publisher *p, int type, const char *endpoint,
                         const char *flag, char *err, size_t errlen)
{
    void *s = zmq_socket(p->zctx, type);
    int linger = 0, hwm = HWM;
    if (s) {
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    }
    if (!s || zmq_bind(s, endpoint) != 0) {
        snprintf(err, errlen, "--%s: cannot bind %s: %s", flag, endpoint, zmq_strerror(errno));
        if (s)
            zmq_close(s);
        return NULL;
    }
    return s;
}

static void destroy(lmc_kv_events_publisher *p)
{
    if (p->pub)
        zmq_close(p->pub);
    if (p->router)
        zmq_close(p->router);
    if (p->zctx)
        zmq_ctx_term(p->zctx);
    for (size_t i = 0; i < p->n_kept; i++)
        free(p->kept[(p->first_kept + i) % p->cap_kept].payload);
    free(p->kept);
    lmc_kv_events_vllm_free(p->vllm);
    free(p->endpoint);
    free(p->topic);
    free(p);
}

lmc_kv_events_publisher *lmc_kv_events_publisher_start(lmc_kv_events *log,
                                                       const lmc_kv_events_publisher_opts *o,
                                                       char *err, size_t errlen)
{
    lmc_kv_events_publisher *p = calloc(1, sizeof *p);
    if (!p)
        goto oom;
    p->log = log;
    p->block_size = o->block_size;
    p->cap_kept = o->buffer_steps;
    p->kept = calloc(o->buffer_steps, sizeof *p->kept);
    p->endpoint = strdup(o->endpoint);
    p->topic = strdup(o->topic ? o->topic : "");
    p->zctx = zmq_ctx_new();
    if (!p->kept || !p->endpoint || !p->topic || !p->zctx)
        goto oom;
    p->vllm_block_size = o->vllm_block_size;
    if (o->vllm_block_size &&
        !(p->vllm = lmc_kv_events_vllm_new(o->vllm_block_size, o->block_size, o->hash_seed, err,
                                           errlen)))
        goto fail;
    p->pub = bind_socket(p, ZMQ_PUB, o->endpoint, "kv-events-publish-endpoint", err, errlen);
    if (!p->pub)
        goto fail;
    if (o->replay_endpoint && *o->replay_endpoint) {
        p->router = bind_socket(p, ZMQ_ROUTER, o->replay_endpoint, "kv-events-replay-endpoint",
                                err, errlen);
        if (!p->router)
            goto fail;
    }
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        snprintf(err, errlen, "--kv-events-publish-endpoint: cannot start the publisher");
        goto fail;
    }
    return p;
oom:
    snprintf(err, errlen, "--kv-events-publish-endpoint: out of memory");
fail:
    if (p)
        destroy(p);
    return NULL;
}

void lmc_kv_events_publisher_stop(lmc_kv_events_publisher *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    destroy(p);
}

static json_t *vllm_status(lmc_kv_events_publisher *p)
{
    if (!p->vllm)
        return json_null();
    lmc_kv_events_vllm_stats st;
    lmc_kv_events_vllm_get_stats(p->vllm, &st);
    return json_pack("{s:I, s:I, s:I, s:I}", "block_size", (json_int_t)p->vllm_block_size,
                     "chunks_remembered", (json_int_t)st.chunks, "unchained_skipped",
                     (json_int_t)st.unchained, "unknown_removed", (json_int_t)st.unknown_removed);
}

json_t *lmc_kv_events_publisher_status(lmc_kv_events_publisher *p)
{
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:o}", "endpoint", p->endpoint,
                     "batches_published", (json_int_t)atomic_load(&p->batches),
                     "events_published", (json_int_t)atomic_load(&p->events), "replay_requests",
                     (json_int_t)atomic_load(&p->replays), "next_seq",
                     (json_int_t)atomic_load(&p->next_seq), "vllm_hashes", vllm_status(p));
}
