#include "fleet/event_batcher.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "storage/object_key_json.h"

typedef struct cev_entry {
    lmc_object_key key;          /* kept by lmc_fleet_event_key_keep */
    char *names;                 /* its own copy of the names, or NULL */
    uint64_t size;
    const char *backend;
    uint8_t type, tier;
    bool shared;
} cev_entry;

struct lmc_fleet_event_batcher {
    pthread_mutex_t mu;          /* guards everything below */
    char *instance_id;
    int64_t incarnation;
    cev_entry *ring;
    size_t cap, head, count;     /* oldest at head */
    uint64_t seq;
    lmc_fleet_event_compartment *decl;   /* latest declaration */
    size_t decl_n;
    uint64_t revision;
    uint64_t decl_gen;           /* bumped by declare and redeclare */
    bool decl_pending;
    lmc_fleet_event_stats st;
    /* The post handed out and not settled yet, and a failed one held for
     * the next take: references to their bodies, with what they carry and
     * when each was first sent (take's `now`). */
    json_t *in_flight, *held;
    lmc_fleet_event_take held_take;
    double in_flight_since, held_since;
    double retry_window;
    lmc_fleet_event_tokens_fn tokens_fn; /* with its user and chunk size */
    void *tokens_user;
    size_t chunk_size;
};

/* take()'s view of the token source, copied under the lock. */
typedef struct {
    lmc_fleet_event_tokens_fn fn;
    void *user;
    size_t chunk_size;
    uint32_t *buf; /* chunk_size tokens */
} token_source;

const char *lmc_fleet_event_type_name(lmc_fleet_event_type type)
{
    switch (type) {
    case LMC_CEV_STORE: return "store";
    case LMC_CEV_DELETE: return "delete";
    case LMC_CEV_ACCESS: return "access";
    }
    return "unknown";
}

static const char *tier_name(int tier) { return tier == LMC_CEV_L2 ? "l2" : "l1"; }

lmc_fleet_event_batcher *lmc_fleet_event_batcher_new(const char *instance_id, int64_t incarnation,
                                     size_t capacity)
{
    lmc_fleet_event_batcher *b = calloc(1, sizeof *b);
    if (!b || capacity == 0)
        goto fail;
    b->instance_id = strdup(instance_id ? instance_id : "");
    b->ring = malloc(capacity * sizeof *b->ring);
    if (!b->instance_id || !b->ring)
        goto fail;
    b->cap = capacity;
    b->incarnation = incarnation;
    b->retry_window = LMC_CEV_RETRY_WINDOW_S;
    pthread_mutex_init(&b->mu, NULL);
    return b;
fail:
    if (b) {
        free(b->instance_id);
        free(b->ring);
    }
    free(b);
    return NULL;
}

bool lmc_fleet_event_key_keep(const lmc_object_key *src, lmc_object_key *dst, char **names)
{
    *dst = *src;
    *names = NULL;
    if (src->interned) {
        lmc_keys_hold(dst, 1);
        return true;
    }
    size_t ml = strlen(src->model_name), sl = strlen(src->cache_salt);
    if (!(*names = malloc(ml + sl + 2)))
        return false;
    memcpy(*names, src->model_name, ml + 1);
    memcpy(*names + ml + 1, src->cache_salt, sl + 1);
    dst->model_name = *names;
    dst->cache_salt = *names + ml + 1;
    return true;
}

void lmc_fleet_event_key_release(const lmc_object_key *k, char *names)
{
    if (names)
        free(names);
    else
        lmc_keys_drop(k, 1);
}

static void drop_entries(const cev_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        lmc_fleet_event_key_release(&e[i].key, e[i].names);
}

void lmc_fleet_event_batcher_free(lmc_fleet_event_batcher *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->count; i++)
        drop_entries(&b->ring[(b->head + i) % b->cap], 1);
    json_decref(b->in_flight);
    json_decref(b->held);
    pthread_mutex_destroy(&b->mu);
    free(b->instance_id);
    free(b->ring);
    free(b->decl);
    free(b);
}

void lmc_fleet_event_batcher_set_retry_window(lmc_fleet_event_batcher *b, double seconds)
{
    pthread_mutex_lock(&b->mu);
    b->retry_window = seconds;
    pthread_mutex_unlock(&b->mu);
}

void lmc_fleet_event_batcher_add(lmc_fleet_event_batcher *b, lmc_fleet_event_type type, lmc_fleet_event_tier tier,
                         const char *backend, bool shared, const lmc_object_key *keys,
                         const uint64_t *sizes, uint64_t size, size_t n)
{
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < n; i++) {
        if (b->count == b->cap) {   /* drop the oldest: the stream must never stall */
            drop_entries(&b->ring[b->head], 1);
            b->head = (b->head + 1) % b->cap;
            b->count--;
            b->st.entries_overflowed++;
            b->st.entries_dropped++;
        }
        cev_entry *e = &b->ring[(b->head + b->count) % b->cap];
        if (!lmc_fleet_event_key_keep(&keys[i], &e->key, &e->names)) {   /* the ring outlives the call */
            b->st.entries_dropped++;
            continue;
        }
        b->count++;
        e->size = sizes ? sizes[i] : size;
        e->backend = backend ? backend : "";
        e->type = (uint8_t)type;
        e->tier = (uint8_t)tier;
        e->shared = shared;
    }
    pthread_mutex_unlock(&b->mu);
}

int lmc_fleet_event_batcher_declare(lmc_fleet_event_batcher *b, const lmc_fleet_event_compartment *c, size_t n)
{
    lmc_fleet_event_compartment *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy)
        return -1;
    memcpy(copy, c, n * sizeof *copy);
    pthread_mutex_lock(&b->mu);
    free(b->decl);
    b->decl = copy;
    b->decl_n = n;
    b->revision++;
    b->decl_gen++;
    b->decl_pending = true;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

void lmc_fleet_event_batcher_redeclare(lmc_fleet_event_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    if (b->decl) {
        b->decl_pending = true;
        b->decl_gen++;
    }
    pthread_mutex_unlock(&b->mu);
}

/* The fields every batch has; entries and capacity filled by the caller. */
static json_t *new_batch(const lmc_fleet_event_batcher *b, uint64_t seq, const char *type,
                         const char *tier, const char *backend, bool shared, double ts)
{
    return json_pack("{s:s, s:I, s:I, s:s, s:s, s:s, s:[], s:b, s:f, s:I, s:I}", "instance_id",
                     b->instance_id, "incarnation", (json_int_t)b->incarnation, "seq",
                     (json_int_t)seq, "event_type", type, "tier", tier, "backend", backend,
                     "entries", "shared", shared, "ts", ts, "capacity_bytes", (json_int_t)0,
                     "capacity_revision", (json_int_t)0);
}

static bool same_group(const cev_entry *a, const cev_entry *b)
{
    return a->type == b->type && a->tier == b->tier && a->shared == b->shared &&
           (a->backend == b->backend || strcmp(a->backend, b->backend) == 0);
}

void lmc_fleet_event_batcher_set_tokens(lmc_fleet_event_batcher *b, lmc_fleet_event_tokens_fn fn,
                                        void *user, size_t chunk_size)
{
    pthread_mutex_lock(&b->mu);
    b->tokens_fn = chunk_size ? fn : NULL;
    b->tokens_user = user;
    b->chunk_size = chunk_size;
    pthread_mutex_unlock(&b->mu);
}

/* A store's token_ids and token_offset: the chunk's content when the
 * source knows all chunk_size of its tokens, else [] and -1. */
static json_t *entry_tokens(const cev_entry *e, const token_source *src, json_int_t *offset)
{
    json_t *ids = json_array();
    uint64_t position = 0;
    *offset = -1;
    if (!ids || e->type != LMC_CEV_STORE || !src->buf ||
        src->fn(src->user, &e->key, src->buf, src->chunk_size, &position) != src->chunk_size ||
        position > INT64_MAX)
        return ids;
    for (size_t i = 0; i < src->chunk_size; i++)
        if (json_array_append_new(ids, json_integer((json_int_t)src->buf[i])) != 0) {
            json_array_clear(ids);
            return ids;
        }
    *offset = (json_int_t)position;
    return ids;
}

static json_t *encode_entry(const cev_entry *e, const token_source *src)
{
    uint64_t size = e->size == LMC_CEV_SIZE_UNKNOWN ? 0 : e->size;
    json_int_t offset;
    json_t *ids = entry_tokens(e, src, &offset);
    return json_pack("{s:o, s:I, s:o, s:I}", "key", lmc_object_key_json(&e->key), "size_bytes",
                     (json_int_t)size, "token_ids", ids, "token_offset", offset);
}

static size_t count_groups(const cev_entry *e, size_t n)
{
    size_t groups = 0;
    for (size_t i = 0; i < n; i++)
        groups += i == 0 || !same_group(&e[i - 1], &e[i]);
    return groups;
}

/* Appends config batches (seq from *seq on) to `out`; -1 on allocation failure. */
static int add_config_batches(const lmc_fleet_event_batcher *b, const lmc_fleet_event_compartment *decl,
                              size_t n, uint64_t revision, uint64_t *seq, double now,
                              json_t *out)
{
    for (size_t i = 0; i < n; i++) {
        json_t *batch = new_batch(b, ++*seq, "config", tier_name(decl[i].tier),
                                  decl[i].backend, decl[i].shared, now);
        if (!batch || json_array_append_new(out, batch) != 0)
            return -1;
        /* A batch left with new_batch's zeros would declare "unlimited". */
        if (json_object_set_new(batch, "capacity_bytes",
                                json_integer((json_int_t)decl[i].capacity_bytes)) != 0 ||
            json_object_set_new(batch, "capacity_revision", json_integer((json_int_t)revision)) != 0)
            return -1;
    }
    return 0;
}

/* JSON can carry the entry's names (jansson refuses a string that is not
 * UTF-8); when it can and encoding still fails, memory ran out. */
static bool encodable(const cev_entry *e)
{
    return lmc_utf8_valid(e->key.model_name, strlen(e->key.model_name)) &&
           lmc_utf8_valid(e->key.cache_salt, strlen(e->key.cache_salt));
}

/* One batch per run of the same group; an entry that cannot be encoded
 * is left out and counted in *unencodable, so that one tenant's bad name
 * never costs the others their events.  Its batch stays, empty if need
 * be: its seq is spent.  -1 when memory ran out (the post is lost). */
static int add_placement_batches(const lmc_fleet_event_batcher *b, const cev_entry *e, size_t n,
                                 const token_source *src, uint64_t *seq, double now, json_t *out,
                                 size_t *unencodable)
{
    json_t *entries = NULL;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || !same_group(&e[i - 1], &e[i])) {
            json_t *batch = new_batch(b, ++*seq, lmc_fleet_event_type_name(e[i].type),
                                      tier_name(e[i].tier), e[i].backend, e[i].shared, now);
            if (!batch || json_array_append_new(out, batch) != 0)
                return -1;
            entries = json_object_get(batch, "entries");
        }
        if (!encodable(&e[i])) {
            ++*unencodable;
            continue;
        }
        json_t *entry = encode_entry(&e[i], src);
        if (!entry || json_array_append_new(entries, entry) != 0)
            return -1;
    }
    return 0;
}

/* Moves the ring's entries out (oldest first) into a fresh array. */
static cev_entry *detach_entries(lmc_fleet_event_batcher *b, size_t *n)
{
    *n = 0;
    if (b->count == 0)
        return NULL;
    cev_entry *out = malloc(b->count * sizeof *out);
    if (!out) {
        b->st.entries_dropped += b->count;
        for (size_t i = 0; i < b->count; i++)
            drop_entries(&b->ring[(b->head + i) % b->cap], 1);
    } else {
        for (size_t i = 0; i < b->count; i++)
            out[i] = b->ring[(b->head + i) % b->cap];
        *n = b->count;
    }
    b->head = b->count = 0;
    return out;
}

static void resolve_sizes(cev_entry *e, size_t n, lmc_fleet_event_size_fn resolve, void *user)
{
    enum { CHUNK = 256 };
    lmc_object_key keys[CHUNK];
    size_t where[CHUNK];
    uint64_t sizes[CHUNK];
    for (size_t i = 0; resolve && i < n;) {
        size_t m = 0;
        for (; i < n && m < CHUNK; i++)
            if (e[i].size == LMC_CEV_SIZE_UNKNOWN) {
                keys[m] = e[i].key;
                where[m++] = i;
            }
        if (m == 0)
            continue;
        resolve(user, keys, m, sizes);
        for (size_t j = 0; j < m; j++)
            e[where[j]].size = sizes[j];
    }
}

/* A held post when there is one (b->mu held): handed out again, or
 * dropped once past the retry window.  NULL when none goes out. */
static json_t *take_held(lmc_fleet_event_batcher *b, double now, lmc_fleet_event_take *taken)
{
    if (!b->held)
        return NULL;
    json_t *held = b->held;
    b->held = NULL;
    if (now - b->held_since > b->retry_window) {
        b->st.batches_dropped += b->held_take.placement_batches;
        b->st.entries_dropped += b->held_take.placement_entries;
        json_decref(held);
        return NULL;
    }
    *taken = b->held_take;
    taken->retried = true;
    b->st.posts_retried++;
    b->in_flight = held;
    b->in_flight_since = b->held_since;
    return json_incref(held);
}

/* The body of the queued entries and the pending declaration; NULL when
 * there is nothing (or memory ran out: then settled as refused). */
static json_t *take_fresh(lmc_fleet_event_batcher *b, double now, lmc_fleet_event_size_fn resolve, void *user,
                          lmc_fleet_event_take *taken)
{
    pthread_mutex_lock(&b->mu);
    size_t n;
    cev_entry *e = detach_entries(b, &n);
    size_t decl_n = b->decl_pending ? b->decl_n : 0;
    lmc_fleet_event_compartment *decl = decl_n ? malloc(decl_n * sizeof *decl) : NULL;
    if (decl)
        memcpy(decl, b->decl, decl_n * sizeof *decl);
    else
        decl_n = 0;
    uint64_t revision = b->revision, generation = b->decl_gen;
    token_source src = {b->tokens_fn, b->tokens_user, b->chunk_size, NULL};
    size_t groups = count_groups(e, n);
    uint64_t seq = b->seq;
    if (n + decl_n > 0)   /* seqs are taken now: a lost post leaves a gap */
        b->seq += decl_n + groups;
    b->st.seq = b->seq;
    pthread_mutex_unlock(&b->mu);

    json_t *body = NULL;
    size_t unencodable = 0;
    if (n + decl_n > 0) {
        resolve_sizes(e, n, resolve, user);
        if (src.fn)   /* without the buffer the stores go without tokens */
            src.buf = malloc(src.chunk_size * sizeof *src.buf);
        json_t *list = json_array();
        body = list ? json_pack("{s:o}", "batches", list) : NULL;
        if (!body || add_config_batches(b, decl, decl_n, revision, &seq, now, list) != 0 ||
            add_placement_batches(b, e, n, &src, &seq, now, list, &unencodable) != 0) {
            json_decref(body);
            body = NULL;
        }
        *taken = (lmc_fleet_event_take){groups, n - unencodable, decl_n, decl_n ? revision : 0,
                                generation, false};
    }
    pthread_mutex_lock(&b->mu);
    b->st.entries_unencodable += unencodable;
    b->st.entries_dropped += unencodable;
    b->in_flight = json_incref(body);
    b->in_flight_since = now;
    pthread_mutex_unlock(&b->mu);
    if (n + decl_n > 0 && !body) {   /* the same fate as a refused post */
        lmc_fleet_event_batcher_settle(b, taken, LMC_CEV_REFUSED);
        *taken = (lmc_fleet_event_take){0};
    }
    drop_entries(e, n);
    free(e);
    free(decl);
    free(src.buf);
    return body;
}

json_t *lmc_fleet_event_batcher_take(lmc_fleet_event_batcher *b, double now, lmc_fleet_event_size_fn resolve,
                             void *user, lmc_fleet_event_take *taken)
{
    *taken = (lmc_fleet_event_take){0};
    pthread_mutex_lock(&b->mu);
    json_t *again = take_held(b, now, taken);
    pthread_mutex_unlock(&b->mu);
    return again ? again : take_fresh(b, now, resolve, user, taken);
}

void lmc_fleet_event_batcher_settle(lmc_fleet_event_batcher *b, const lmc_fleet_event_take *taken,
                            lmc_fleet_event_outcome outcome)
{
    pthread_mutex_lock(&b->mu);
    json_t *body = b->in_flight;
    b->in_flight = NULL;
    if (outcome == LMC_CEV_DELIVERED) {
        b->st.posts_ok++;
        b->st.batches_sent += taken->placement_batches + taken->config_batches;
        b->st.entries_sent += taken->placement_entries;
        /* Unless a newer declaration or a re-registration came meanwhile. */
        if (taken->revision && taken->generation == b->decl_gen)
            b->decl_pending = false;
    } else if (outcome == LMC_CEV_RETRY && body) {
        b->st.posts_failed++;
        b->held = body;   /* the reference moves: sent again as it is */
        b->held_take = *taken;
        b->held_take.retried = false;
        b->held_since = b->in_flight_since;
        body = NULL;
    } else {
        b->st.posts_failed++;
        b->st.batches_dropped += taken->placement_batches;
        b->st.entries_dropped += taken->placement_entries;
    }
    pthread_mutex_unlock(&b->mu);
    json_decref(body);
}

lmc_fleet_event_stats lmc_fleet_event_batcher_stats(lmc_fleet_event_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    lmc_fleet_event_stats st = b->st;
    st.seq = b->seq;
    st.queued = b->count;
    st.capacity_revision = b->revision;
    st.capacity_pending = b->decl_pending;
    st.retry_pending = b->held != NULL;
    pthread_mutex_unlock(&b->mu);
    return st;
}
