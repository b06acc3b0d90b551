/* KV events module: POLL_KV_EVENTS, its /status block and its gauge
 * (docs/kv_events.md).  The log itself is a shared service the server
 * creates with --kv-event-log-size (ctx->kv_events, NULL when 0); the
 * module only reads it. */
#include <stdlib.h>
#include <time.h>

#include "modules/kv_events.h"
#include "modules/kv_events_publisher.h"
#include "modules/module.h"
#include "rpc/wire.h"

typedef struct {
    lmc_kv_events *log;        /* NULL: disabled */
    uint64_t incarnation;
    uint32_t block_size;
    lmc_kv_events_publisher *pub; /* NULL: --kv-events-publish-endpoint "" */
} kv_events_mod;

static void pack_key(msgpack_packer *pk, const char *key)
{
    lmc_mp_pack_cstr(pk, key);
}

static void pack_uints(msgpack_packer *pk, const uint32_t *v, size_t n)
{
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, v[i]);
}

/* One record as upstream's KVEventRecord dataclass encodes: a map by field
 * name, every field present (docs/kv_events.md, "Reply"). */
static void pack_event(msgpack_packer *pk, const lmc_kv_events_entry *e, uint32_t block_size)
{
    const lmc_kv_event *r = e->event;
    msgpack_pack_map(pk, 8);
    pack_key(pk, "seq");
    msgpack_pack_uint64(pk, e->seq);
    pack_key(pk, "kind");
    pack_key(pk, r->kind == LMC_KV_EVENT_STORED ? "stored" : "removed");
    pack_key(pk, "medium");
    pack_key(pk, r->medium == LMC_KV_MEDIUM_CPU ? "CPU" : "STORAGE");
    pack_key(pk, "model_name");
    msgpack_pack_str(pk, r->model_len);
    msgpack_pack_str_body(pk, r->model, r->model_len);
    pack_key(pk, "block_hashes");
    msgpack_pack_array(pk, r->n_hashes);
    for (uint32_t i = 0; i < r->n_hashes; i++) {
        msgpack_pack_bin(pk, r->hash_len);
        msgpack_pack_bin_body(pk, r->hashes + (size_t)i * r->hash_len, r->hash_len);
    }
    pack_key(pk, "parent_block_hash");
    if (r->has_parent) {
        msgpack_pack_bin(pk, r->hash_len);
        msgpack_pack_bin_body(pk, r->parent, r->hash_len);
    } else {
        msgpack_pack_nil(pk);
    }
    pack_key(pk, "token_ids");
    pack_uints(pk, r->tokens, r->n_tokens);
    pack_key(pk, "block_size");
    msgpack_pack_uint32(pk, block_size);
}

static void pack_result(msgpack_packer *pk, const kv_events_mod *m, const lmc_kv_events_page *p)
{
    msgpack_pack_map(pk, 5);
    pack_key(pk, "enabled");
    if (m->log)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    pack_key(pk, "incarnation");
    msgpack_pack_uint64(pk, m->incarnation);
    pack_key(pk, "next_cursor");
    msgpack_pack_uint64(pk, p->next_cursor);
    pack_key(pk, "lost");
    if (p->lost)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    pack_key(pk, "events");
    msgpack_pack_array(pk, (uint32_t)p->n);
    for (size_t i = 0; i < p->n; i++)
        pack_event(pk, &p->entries[i], m->block_size);
}

/* An int argument, not a bool, of at least `min`. */
static bool int_arg(lmc_rpc_call *call, size_t i, int64_t min, int64_t *out)
{
    const msgpack_object *o = lmc_rpc_call_arg(call, i);
    return o && o->type != MSGPACK_OBJECT_BOOLEAN && lmc_mp_get_int(o, out) && *out >= min;
}

/* POLL_KV_EVENTS(model_name, cursor, max_events) -> KVEventPollResult. */
static lmc_handler_result poll_kv_events(void *state, lmc_rpc_call *call)
{
    kv_events_mod *m = state;
    const msgpack_object *model_o = lmc_rpc_call_arg(call, 0);
    const char *model;
    size_t model_len;
    int64_t cursor, max_events;
    if (lmc_rpc_call_nargs(call) != 3 || !model_o || !lmc_mp_get_str(model_o, &model, &model_len))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "POLL_KV_EVENTS: expected (model_name: str, cursor: int, "
                                 "max_events: int)");
    if (!int_arg(call, 1, 0, &cursor))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "POLL_KV_EVENTS: cursor must be an int >= 0");
    if (!int_arg(call, 2, 1, &max_events))
        return lmc_rpc_call_fail(call, "ValidationError",
                                 "POLL_KV_EVENTS: max_events must be an int > 0");
    lmc_kv_events_page page = {0};
    if (m->log && lmc_kv_events_read(m->log, model, model_len, (uint64_t)cursor,
                                     (size_t)max_events, &page) != 0)
        return lmc_rpc_call_fail(call, "MemoryError", "POLL_KV_EVENTS: out of memory");
    pack_result(lmc_rpc_call_reply(call), m, &page);
    if (m->log)
        lmc_kv_events_page_free(&page);
    return LMC_HANDLER_REPLY;
}

static const lmc_rpc_handler_spec kv_events_handlers[] = {
    {LMC_OP_POLL_KV_EVENTS, NULL, LMC_POOL_SYNC, poll_kv_events, false, NULL, NULL, false},
};

static bool set(const char *s)
{
    return s && *s;
}

/* The flags that only the publisher reads, refused without it. */
static int check_publisher_only(const lmc_mp_config *mp, char *err, size_t errlen)
{
    const char *flag = set(mp->kv_events_replay_endpoint) ? "--kv-events-replay-endpoint"
                       : mp->kv_events_block_size         ? "--kv-events-block-size"
                       : mp->kv_events_hash_seed          ? "--kv-events-hash-seed"
                                                          : NULL;
    if (!flag)
        return 0;
    snprintf(err, errlen, "%s needs --kv-events-publish-endpoint", flag);
    return -1;
}

/* vLLM's block size and seed (docs/kv_events.md, "vLLM block hashes"): the
 * flag's seed, else $PYTHONHASHSEED as vLLM reads it; one is required. */
static int vllm_hash_opts(const lmc_mp_config *mp, lmc_kv_events_publisher_opts *o, char *err,
                          size_t errlen)
{
    if (!mp->kv_events_block_size) {
        if (!mp->kv_events_hash_seed)
            return 0;
        snprintf(err, errlen, "--kv-events-hash-seed needs --kv-events-block-size");
        return -1;
    }
    if (mp->chunk_size % mp->kv_events_block_size != 0) {
        snprintf(err, errlen, "--kv-events-block-size %d must divide --chunk-size %d",
                 mp->kv_events_block_size, mp->chunk_size);
        return -1;
    }
    o->vllm_block_size = (uint32_t)mp->kv_events_block_size;
    o->hash_seed = mp->kv_events_hash_seed ? mp->kv_events_hash_seed : getenv("PYTHONHASHSEED");
    if (o->hash_seed)
        return 0;
    snprintf(err, errlen, "--kv-events-block-size needs --kv-events-hash-seed or PYTHONHASHSEED: "
                          "vLLM's hashes without a seed start from random bytes");
    return -1;
}

/* docs/kv_events.md, "Publishing to routers". */
static int start_publisher(lmc_module_ctx *ctx, kv_events_mod *m, char *err, size_t errlen)
{
    const lmc_mp_config *mp = &ctx->config->mp;
    if (!set(mp->kv_events_publish_endpoint))
        return check_publisher_only(mp, err, errlen);
    if (!m->log) {
        snprintf(err, errlen, "--kv-events-publish-endpoint needs the KV event log: "
                              "--kv-event-log-size must be > 0");
        return -1;
    }
    lmc_kv_events_publisher_opts o = {
        .endpoint = mp->kv_events_publish_endpoint,
        .replay_endpoint = mp->kv_events_replay_endpoint,
        .topic = mp->kv_events_topic,
        .buffer_steps = (size_t)mp->kv_events_buffer_steps,
        .block_size = m->block_size,
    };
    if (vllm_hash_opts(mp, &o, err, errlen) != 0)
        return -1;
    m->pub = lmc_kv_events_publisher_start(m->log, &o, err, errlen);
    return m->pub ? 0 : -1;
}

static int kv_events_create(lmc_module_ctx *ctx, void **state, char *err, size_t errlen)
{
    kv_events_mod *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "kv_events: out of memory");
        return -1;
    }
    m->log = ctx->kv_events;
    m->block_size = (uint32_t)ctx->config->mp.chunk_size;
    if (m->log) {
        m->incarnation = lmc_kv_events_incarnation(m->log);
    } else {   /* still names this start, as upstream's disabled channel does */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        m->incarnation = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    }
    if (start_publisher(ctx, m, err, errlen) != 0) {
        free(m);
        return -1;
    }
    *state = m;
    return 0;
}

static json_t *kv_events_status(void *state)
{
    kv_events_mod *m = state;
    lmc_kv_events_stats st = {0};
    if (m->log)
        lmc_kv_events_get_stats(m->log, &st);
    return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "enabled", m->log != NULL,
                     "incarnation", (json_int_t)m->incarnation, "log_depth",
                     (json_int_t)st.log_depth, "log_capacity", (json_int_t)st.log_capacity,
                     "next_seq", (json_int_t)(m->log ? st.next_seq : 1), "lost_markers",
                     (json_int_t)st.lost_markers, "unbound_stores", (json_int_t)st.unbound_stores,
                     "publisher", m->pub ? lmc_kv_events_publisher_status(m->pub) : json_null());
}

/* ---- metrics (docs/metrics.md, "KV events") ------------------------------ */

typedef struct {
    kv_events_mod *m;
    lmc_metric *depth;
} kv_events_metrics;

static void kv_events_collect(lmc_metrics *r, void *user)
{
    (void)r;
    kv_events_metrics *km = user;
    lmc_kv_events_stats st = {0};
    if (km->m->log)
        lmc_kv_events_get_stats(km->m->log, &st);
    lmc_metric_set(km->depth, NULL, (double)st.log_depth);
}

static int kv_events_register_metrics(void *state, lmc_metrics *r)
{
    lmc_metric *depth = lmc_metrics_gauge(r, "lmcache_mp_kv_events_log_depth",
                                          "Records (loss markers included) in the KV event log",
                                          NULL);
    if (!depth)
        return -1;
    if (!state)
        return 0;
    kv_events_metrics *km = calloc(1, sizeof *km);
    if (!km)
        return -1;
    *km = (kv_events_metrics){.m = state, .depth = depth};
    return lmc_metrics_add_owned_collector(r, kv_events_collect, km);
}

static void kv_events_close(void *state)
{
    kv_events_mod *m = state;
    lmc_kv_events_publisher_stop(m->pub); /* before the server frees the log */
    free(m);
}

const lmc_module_def lmc_kv_events_module = {
    .name = "kv_events",
    .create = kv_events_create,
    .handlers = kv_events_handlers,
    .n_handlers = sizeof kv_events_handlers / sizeof kv_events_handlers[0],
    .report_status = kv_events_status,
    .register_metrics = kv_events_register_metrics,
    .close = kv_events_close,
};
