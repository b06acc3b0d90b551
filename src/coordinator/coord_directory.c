/* The key directory (docs/coordinator.md, "Key directory"): read-only
 * views of where keys are, fed by the event stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_blend.h"
#include "coordinator/coord_events.h"
#include "coordinator/coord_internal.h"

static json_t *placements(const coordinator_state *s, const coordinator_entry *e)
{
    json_t *list = json_array();
    if (e->flags & COORD_IN_L2)
        json_array_append_new(list, json_pack("{s:s, s:s, s:b, s:I}", "tier", "l2", "backend",
                                              coordinator_names_str(&s->backends, e->l2_backend),
                                              "shared", (e->flags & COORD_L2_SHARED) != 0,
                                              "size_bytes", (json_int_t)e->l2_size));
    for (uint16_t i = 0; i < e->n_l1; i++)
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:I}", "tier", "l1",
                                              "instance_id",
                                              coordinator_names_str(&s->instances, e->l1[i].instance),
                                              "backend",
                                              coordinator_names_str(&s->backends, e->l1[i].backend),
                                              "size_bytes", (json_int_t)e->l1[i].size));
    return list;
}

static json_t *empty_list(void)
{
    return json_array();
}

/* One lookup result; idx COORD_NONE = a key nobody reported. */
static json_t *result(const coordinator_state *s, uint32_t idx, json_t *key, json_t *tokens)
{
    json_t *pl = idx == COORD_NONE ? empty_list() : placements(s, &s->keys.e[idx]);
    return json_pack("{s:o, s:o, s:o}", "key", key, "placements", pl, "token_ids", tokens);
}

static void lookup_keys(lmc_coord *co, const json_t *keys, lmc_http_reply *out)
{
    if (!json_is_array(keys) || json_array_size(keys) > COORD_MAX_PAGE)
        return coordinator_reply_detail(out, 422, "keys must be a list of at most %d "
                                            "EncodedObjectKeys", COORD_MAX_PAGE);
    coordinator_wire_key *w = calloc(json_array_size(keys) + 1, sizeof *w);
    if (!w)
        return coordinator_reply_detail(out, 500, "out of memory");
    for (size_t i = 0; i < json_array_size(keys); i++) {
        char why[160];
        if (coordinator_wire_key_parse(json_array_get(keys, i), &w[i], why, sizeof why) != 0) {
            free(w);
            return coordinator_reply_detail(out, 422, "keys[%zu]: %s", i, why);
        }
    }
    json_t *results = json_array();
    pthread_mutex_lock(&co->mu);
    for (size_t i = 0; results && i < json_array_size(keys); i++) {
        coordinator_key k;
        uint32_t idx = coordinator_wire_key_resolve(&co->st, &w[i], false, &k)
                           ? coordinator_keys_find(&co->st.keys, &k) : COORD_NONE;
        json_array_append_new(results, result(&co->st, idx, json_deep_copy(json_array_get(keys, i)),
                                              json_array()));
    }
    pthread_mutex_unlock(&co->mu);
    free(w);
    lmc_http_reply_json(out, 200, json_pack("{s:I, s:o}", "chunks",
                                         (json_int_t)json_array_size(keys), "results", results));
}

static json_t *chunk_tokens(const coordinator_token_query *q, size_t c, uint32_t cs)
{
    json_t *t = json_array();
    for (size_t i = c * cs; t && i < (c + 1) * cs; i++)
        json_array_append_new(t, json_integer((json_int_t)q->tokens[i]));
    return t;
}

static void lookup_tokens(lmc_coord *co, const json_t *b, lmc_http_reply *out)
{
    coordinator_token_query q;
    char why[200];
    uint8_t *hashes = NULL;
    size_t n_chunks = 0;
    if (coordinator_token_query_parse(b, &q, why, sizeof why) != 0)
        return coordinator_reply_detail(out, 422, "%s", why);
    if (coordinator_token_query_hash(co, &q, &hashes, &n_chunks, why, sizeof why) != 0) {
        coordinator_token_query_free(&q);
        return coordinator_reply_detail(out, 500, "%s", why);
    }
    size_t cap = COORD_MAX_PAGE / q.world_size; /* results per answer */
    if (n_chunks > cap)
        n_chunks = cap;
    json_t *results = json_array();
    pthread_mutex_lock(&co->mu);
    for (size_t c = 0; results && c < n_chunks; c++) {
        for (uint32_t r = 0; r < q.world_size; r++) {
            coordinator_key k;
            bool known = coordinator_token_key(&co->st, &q, hashes + c * LMC_TOKEN_HASH_LEN, r, false, &k);
            uint32_t idx = known ? coordinator_keys_find(&co->st.keys, &k) : COORD_NONE;
            coordinator_entry tmp = {.hash_len = LMC_TOKEN_HASH_LEN, .kv_rank = k.kv_rank};
            memcpy(tmp.hash, hashes + c * LMC_TOKEN_HASH_LEN, LMC_TOKEN_HASH_LEN);
            json_t *key = coordinator_entry_json(&co->st, &tmp);
            json_object_set_new(key, "model_name", json_string(q.model));
            json_object_set_new(key, "cache_salt", json_string(q.salt));
            json_array_append_new(results, result(&co->st, idx, key,
                                                  chunk_tokens(&q, c, co->cfg.chunk_size)));
        }
    }
    pthread_mutex_unlock(&co->mu);
    free(hashes);
    coordinator_token_query_free(&q);
    lmc_http_reply_json(out, 200, json_pack("{s:I, s:o}", "chunks", (json_int_t)n_chunks, "results",
                                         results));
}

void coordinator_ep_dir_lookup(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                               const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    json_t *b = coordinator_body_object(rq, out);
    if (!b)
        return;
    json_t *keys = json_object_get(b, "keys");
    if (keys)
        lookup_keys(co, keys, out);
    else
        lookup_tokens(co, b, out);
    json_decref(b);
}

/* ---- GET /directory/keys ------------------------------------------------------ */

typedef struct {
    bool l1, l2;
    uint32_t instance, backend; /* COORD_NONE = any */
    bool no_match;              /* a filter names something never seen */
} key_filter;

static bool matches(const coordinator_entry *e, const key_filter *f)
{
    if (f->l2 && (e->flags & COORD_IN_L2) &&
        (f->backend == COORD_NONE || f->backend == e->l2_backend) && f->instance == COORD_NONE)
        return true;
    for (uint16_t i = 0; f->l1 && i < e->n_l1; i++)
        if ((f->instance == COORD_NONE || f->instance == e->l1[i].instance) &&
            (f->backend == COORD_NONE || f->backend == e->l1[i].backend))
            return true;
    return false;
}

static bool parse_count(const char *v, long lo, long hi, long *out)
{
    if (!v)
        return true;
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

static bool parse_filter(lmc_coord *co, const lmc_http_request *rq, key_filter *f, lmc_http_reply *out)
{
    const char *tier = lmc_http_query(rq, "tier");
    if (tier && strcmp(tier, "all") && strcmp(tier, "l1") && strcmp(tier, "l2"))
        return coordinator_reply_detail(out, 400, "tier must be all, l1 or l2"), false;
    f->l1 = !tier || strcmp(tier, "l2") != 0;
    f->l2 = !tier || strcmp(tier, "l1") != 0;
    const char *inst = lmc_http_query(rq, "instance_id"), *backend = lmc_http_query(rq, "backend");
    f->instance = inst && *inst ? coordinator_names_find(&co->st.instances, inst) : COORD_NONE;
    f->backend = backend && *backend ? coordinator_names_find(&co->st.backends, backend) : COORD_NONE;
    f->no_match = (inst && *inst && f->instance == COORD_NONE) ||
                  (backend && *backend && f->backend == COORD_NONE);
    return true;
}

void coordinator_ep_dir_keys(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                             const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    long offset = 0, limit = 1000;
    if (!parse_count(lmc_http_query(rq, "offset"), 0, 1L << 40, &offset) ||
        !parse_count(lmc_http_query(rq, "limit"), 1, COORD_MAX_PAGE, &limit))
        return coordinator_reply_detail(out, 400, "offset must be an integer >= 0 and limit one in "
                                            "1..%d", COORD_MAX_PAGE);
    key_filter f;
    json_t *keys = json_array();
    size_t total = 0;
    pthread_mutex_lock(&co->mu);
    if (!parse_filter(co, rq, &f, out)) {
        pthread_mutex_unlock(&co->mu);
        json_decref(keys);
        return;
    }
    const coordinator_state *s = &co->st;
    for (uint32_t i = 0; keys && !f.no_match && i < s->keys.n_slots; i++) {
        const coordinator_entry *e = &s->keys.e[i];
        if (!e->hash_len || !matches(e, &f))
            continue;
        if (total >= (size_t)offset && total < (size_t)(offset + limit))
            json_array_append_new(keys, json_pack("{s:o, s:o, s:I}", "key",
                                                  coordinator_entry_json(s, e), "placements",
                                                  placements(s, e), "num_tokens",
                                                  (json_int_t)e->num_tokens));
        total++;
    }
    pthread_mutex_unlock(&co->mu);
    lmc_http_reply_json(out, 200, json_pack("{s:I, s:o}", "total", (json_int_t)total, "keys", keys));
}

/* ---- GET /directory/stats --------------------------------------------------- */

static json_t *capacities(const coordinator_state *s)
{
    json_t *list = json_array();
    for (uint32_t i = 0; list && i < s->instances.n && i < s->cursor_cap; i++) {
        const coordinator_cursor *c = &s->cursor[i];
        for (uint32_t j = 0; c->used && j < c->n_caps; j++)
            json_array_append_new(list, json_pack(
                "{s:s, s:s, s:s, s:b, s:I, s:I}", "instance_id", coordinator_names_str(&s->instances, i),
                "tier", c->caps[j].tier_l2 ? "l2" : "l1", "backend",
                coordinator_names_str(&s->backends, c->caps[j].backend), "shared", c->caps[j].shared,
                "capacity_bytes", (json_int_t)c->caps[j].capacity_bytes, "capacity_revision",
                (json_int_t)c->caps[j].revision));
    }
    return list;
}

static json_t *per_instance_l1(const coordinator_state *s)
{
    uint64_t *count = calloc(s->instances.n + 1, sizeof *count);
    json_t *o = json_object();
    for (uint32_t i = 0; count && i < s->keys.n_slots; i++)
        for (uint16_t j = 0; j < s->keys.e[i].n_l1; j++)
            count[s->keys.e[i].l1[j].instance]++;
    for (uint32_t i = 0; count && o && i < s->instances.n; i++)
        if (count[i])
            json_object_set_new(o, coordinator_names_str(&s->instances, i), json_integer((json_int_t)count[i]));
    free(count);
    return o;
}

void coordinator_ep_dir_stats(const lmc_http_request *rq, lmc_http_reply *out, void *ctx,
                              const char *arg)
{
    lmc_coord *co = ctx;
    (void)arg;
    (void)rq;
    pthread_mutex_lock(&co->mu);
    const coordinator_state *s = &co->st;
    size_t pinned = 0;
    for (uint32_t i = 0; i < s->keys.n_slots; i++)
        pinned += s->keys.e[i].pins > 0;
    json_t *o = json_pack(
        "{s:{s:I, s:I}, s:{s:I, s:I, s:o}, s:I, s:I, s:o, s:{s:b}, s:I}",
        "l2", "placement_count", (json_int_t)s->l2_entries, "placement_size_bytes",
        (json_int_t)s->l2_bytes, "l1", "placement_count", (json_int_t)s->l1_entries,
        "placement_size_bytes", (json_int_t)s->l1_bytes, "by_instance", per_instance_l1(s),
        "keys_tracked", (json_int_t)s->keys.n_live, "pinned_keys", (json_int_t)pinned,
        "capacity", capacities(s), "blend", "enabled", co->blend != NULL, "key_table_bytes",
        (json_int_t)coordinator_keys_memory(&s->keys));
    pthread_mutex_unlock(&co->mu);
    if (co->blend) { /* its own lock, never under mu */
        coordinator_blend_stats b = coordinator_blend_get_stats(co->blend);
        json_object_update_new(json_object_get(o, "blend"),
                               json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "contents",
                                         (json_int_t)b.contents, "chunks", (json_int_t)b.chunks,
                                         "max_chunks", (json_int_t)b.max_chunks, "added",
                                         (json_int_t)b.added, "removed", (json_int_t)b.removed,
                                         "refused", (json_int_t)b.refused));
    }
    lmc_http_reply_json(out, 200, o);
}
