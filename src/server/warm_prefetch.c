#include "server/warm_prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/services/ipc_key.h"
#include "modules/services/layout_registry.h"
#include "storage/l2/l2_service.h"
#include "storage/storage_manager.h"

#define MAX_TOKENS (1u << 20)
#define MAX_JOBS 4096

typedef struct job {
    char id[32];
    bool done;
    size_t found, total;
    lmc_object_key *keys;      /* the keys sent to L2 (their locks are released at done) */
    size_t n_keys;             /* of keys, each holding its string references */
    lmc_lease *leases;         /* the READ leases L2 took for them */
    size_t n_l2, per;
    struct lmc_warm_prefetch *owner;
    struct job *next;
} job;

struct lmc_warm_prefetch {
    lmc_module_ctx *ctx;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    job *jobs;
    size_t n_jobs, running;
    unsigned long long next_id;
};

lmc_warm_prefetch *lmc_warm_prefetch_new(lmc_module_ctx *ctx)
{
    lmc_warm_prefetch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->ctx = ctx;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->idle, NULL);
    return w;
}

static void free_job(job *j)
{
    if (j->keys)
        lmc_keys_drop(j->keys, j->n_keys);
    free(j->keys);
    free(j->leases);
    free(j);
}

void lmc_warm_prefetch_free(lmc_warm_prefetch *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    while (w->running) /* the storage manager answers every prefetch */
        pthread_cond_wait(&w->idle, &w->lock);
    pthread_mutex_unlock(&w->lock);
    for (job *j = w->jobs, *next; j; j = next) {
        next = j->next;
        free_job(j);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->idle);
    free(w);
}

/* Prefetch thread: keys[0..units*per) are loaded, retained and read-locked
 * once; a warm prefetch keeps them resident but unlocked. */
static void on_done(void *user, size_t units)
{
    job *j = user;
    lmc_warm_prefetch *w = j->owner;
    size_t loaded = units * j->per;
    lmc_storage_manager_give_back(w->ctx->storage, j->keys, j->leases, loaded);
    pthread_mutex_lock(&w->lock);
    j->found += loaded;
    j->done = true;
    if (--w->running == 0)
        pthread_cond_broadcast(&w->idle);
    pthread_mutex_unlock(&w->lock);
}

static void on_lookup_done(void *user, size_t units)
{
    (void)user, (void)units;
}

/* ---- request parsing ------------------------------------------------------ */

typedef struct {
    const char *model, *salt;
    int64_t world_size;
    uint64_t *tokens;
    size_t n_tokens;
} prefetch_req;

static int fail(unsigned *status, unsigned code, char *err, size_t errlen, const char *msg)
{
    *status = code;
    snprintf(err, errlen, "%s", msg);
    return -1;
}

static int parse_tokens(const json_t *arr, prefetch_req *r, unsigned *status, char *err,
                        size_t errlen)
{
    if (!json_is_array(arr))
        return fail(status, 422, err, errlen, "token_ids must be an array of ints");
    if (json_array_size(arr) > MAX_TOKENS)
        return fail(status, 400, err, errlen, "too many token_ids (cap 1048576)");
    r->n_tokens = json_array_size(arr);
    r->tokens = malloc((r->n_tokens ? r->n_tokens : 1) * sizeof *r->tokens);
    if (!r->tokens)
        return fail(status, 500, err, errlen, "out of memory");
    for (size_t i = 0; i < r->n_tokens; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) > (json_int_t)UINT32_MAX)
            return fail(status, 422, err, errlen, "token_ids must be ints in 0..2^32-1");
        r->tokens[i] = (uint64_t)json_integer_value(t);
    }
    return 0;
}

static int parse_request(const json_t *b, prefetch_req *r, unsigned *status, char *err,
                         size_t errlen)
{
    const char *src = json_string_value(json_object_get(b, "source_tier"));
    const char *dst = json_string_value(json_object_get(b, "target_tier"));
    json_t *ws = json_object_get(b, "world_size"), *salt = json_object_get(b, "cache_salt");
    *r = (prefetch_req){.model = json_string_value(json_object_get(b, "model_name")),
                        .salt = salt ? json_string_value(salt) : ""};
    if (!json_is_object(b) || !r->model || !json_is_integer(ws) || (salt && !r->salt))
        return fail(status, 422, err, errlen,
                    "body must be {model_name: str, world_size: int, token_ids: [int], "
                    "cache_salt: str, source_tier: \"l2\", target_tier: \"l1\"}");
    if ((src && strcmp(src, "l2")) || (dst && strcmp(dst, "l1")))
        return fail(status, 400, err, errlen, "only source_tier \"l2\" -> target_tier \"l1\"");
    if (!lmc_cache_salt_valid(r->salt, strlen(r->salt)))
        return fail(status, 400, err, errlen, "invalid cache_salt");
    r->world_size = json_integer_value(ws);
    if (r->world_size < 1 || r->world_size > 255 || !lmc_model_name_valid(r->model, strlen(r->model)))
        return fail(status, 422, err, errlen, "world_size must be 1..255 and model_name valid");
    return parse_tokens(json_object_get(b, "token_ids"), r, status, err, errlen);
}

/* ---- submit / query ------------------------------------------------------------ */

static job *new_job(lmc_warm_prefetch *w)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->owner = w;
    pthread_mutex_lock(&w->lock);
    snprintf(j->id, sizeof j->id, "warm-%llu", ++w->next_id);
    pthread_mutex_unlock(&w->lock);
    return j;
}

static void add_job(lmc_warm_prefetch *w, job *j, bool running)
{
    pthread_mutex_lock(&w->lock);
    j->next = w->jobs;
    w->jobs = j;
    w->n_jobs++;
    w->running += running;
    pthread_mutex_unlock(&w->lock);
}

/* Keys of every rank and group of `n_chunks` chunks, chunk-major. */
static lmc_object_key *expand(lmc_warm_prefetch *w, const prefetch_req *r, const lmc_layout *l,
                              size_t n_chunks, size_t *n_keys)
{
    uint8_t *hashes = malloc(n_chunks * LMC_TOKEN_HASH_LEN);
    size_t per = l->num_groups * (size_t)r->world_size;
    lmc_object_key *keys = malloc(n_chunks * per * sizeof *keys);
    lmc_ipc_key k = {.model_name = r->model, .model_len = strlen(r->model),
                     .world_size = (uint32_t)r->world_size, .cache_salt = r->salt,
                     .salt_len = strlen(r->salt)};
    bool ok = hashes && keys &&
              lmc_hash_chunks(w->ctx->hasher, r->tokens, r->n_tokens, 0,
                              n_chunks * lmc_token_hasher_chunk_size(w->ctx->hasher),
                              hashes) == LMC_HASH_OK &&
              lmc_ipc_key_object_keys(&k, hashes, n_chunks, l->num_groups, w->ctx->interner,
                                      keys) == 0;
    free(hashes);
    if (!ok) {
        free(keys);
        return NULL;
    }
    *n_keys = n_chunks * per;
    return keys;
}

/* Starts the L2 part after the L1-resident prefix; false when nothing was
 * sent (the job is then complete already). */
static bool start_l2(lmc_warm_prefetch *w, job *j, lmc_object_key *keys, size_t n,
                     size_t l1_keys, const lmc_layout *l)
{
    size_t rest = n - l1_keys;
    if (rest < j->per || !lmc_l2_attached(w->ctx->storage))
        return false;
    j->keys = malloc(rest * sizeof *j->keys);
    j->leases = calloc(rest, sizeof *j->leases);
    if (!j->keys || !j->leases)
        return false;   /* the job's owner frees both */
    memcpy(j->keys, keys + l1_keys, rest * sizeof *j->keys);
    lmc_keys_hold(j->keys, rest); /* the job outlives the request */
    j->n_keys = rest;
    lmc_l2_prefetch_request req = {
        .keys = j->keys, .leases = j->leases, .n = rest, .keys_per_unit = (uint32_t)j->per,
        .object_size = l->object_size, .readers = 1, .retain = true,
        .on_lookup_done = on_lookup_done, .on_done = on_done, .user = j,
    };
    add_job(w, j, true); /* before submitting: on_done may run at once */
    if (lmc_l2_prefetch(w->ctx->storage, &req) == 0)
        return true;
    on_done(j, 0); /* refused: completes with what L1 had */
    return true;
}

json_t *lmc_warm_prefetch_submit(lmc_warm_prefetch *w, const json_t *body, unsigned *status,
                                 char *err, size_t errlen)
{
    prefetch_req r = {0};
    lmc_layout layout;
    json_t *reply = NULL;
    pthread_mutex_lock(&w->lock);
    bool full = w->n_jobs >= MAX_JOBS;
    pthread_mutex_unlock(&w->lock);
    if (full) {
        fail(status, 503, err, errlen, "too many prefetch jobs; poll the finished ones");
        goto out;
    }
    if (parse_request(body, &r, status, err, errlen) != 0)
        goto out;
    /* Fewer tokens than a chunk: nothing to look up, with or without a
     * registered layout (docs/http.md). */
    size_t n_chunks = r.n_tokens / lmc_token_hasher_chunk_size(w->ctx->hasher), n = 0;
    if (n_chunks == 0) {
        *status = 202;
        reply = json_pack("{s:i, s:s}", "chunks", 0, "status", "noop");
        goto out;
    }
    if (!lmc_layout_registry_get(w->ctx->layouts, r.model, strlen(r.model),
                                 (uint32_t)r.world_size, &layout)) {
        fail(status, 503, err, errlen, "no memory layout registered for this model and world_size");
        goto out;
    }
    lmc_object_key *keys = expand(w, &r, &layout, n_chunks, &n);
    job *j = keys ? new_job(w) : NULL;
    if (!j) {
        if (keys)
            lmc_keys_drop(keys, n);
        free(keys);
        fail(status, 500, err, errlen, "out of memory");
        goto out;
    }
    j->total = n;
    j->per = layout.num_groups * (size_t)r.world_size;
    /* The leading run already in L1 counts as found; only the rest loads. */
    lmc_lease *leases = malloc(n * sizeof *leases);
    size_t locked = leases ? lmc_storage_manager_lease_read(w->ctx->storage, keys, n, 1, true,
                                                            NULL, leases, NULL)
                           : 0;
    lmc_storage_manager_give_back(w->ctx->storage, keys, leases, locked);
    free(leases);
    j->found = locked / j->per * j->per;
    if (!start_l2(w, j, keys, n, j->found, &layout)) {
        j->done = true;
        add_job(w, j, false);
    }
    lmc_keys_drop(keys, n);
    free(keys);
    *status = 202;
    reply = json_pack("{s:s, s:I, s:s}", "request_id", j->id, "chunks", (json_int_t)n_chunks,
                      "status", "submitted");
out:
    free(r.tokens);
    return reply;
}

json_t *lmc_warm_prefetch_query(lmc_warm_prefetch *w, const char *request_id, unsigned *status,
                                char *err, size_t errlen)
{
    json_t *reply = NULL;
    job *gone = NULL;
    pthread_mutex_lock(&w->lock);
    for (job **p = &w->jobs; *p; p = &(*p)->next) {
        job *j = *p;
        if (strcmp(j->id, request_id) != 0)
            continue;
        if (!j->done) {
            reply = json_pack("{s:s, s:s}", "request_id", j->id, "status", "pending");
        } else { /* the first poll that sees completion consumes the job */
            reply = json_pack("{s:s, s:s, s:I, s:I}", "request_id", j->id, "status", "completed",
                              "found_keys", (json_int_t)j->found, "total_keys",
                              (json_int_t)j->total);
            *p = j->next;
            w->n_jobs--;
            gone = j;
        }
        break;
    }
    pthread_mutex_unlock(&w->lock);
    if (gone)
        free_job(gone);
    if (!reply)
        fail(status, 404, err, errlen, "unknown prefetch request id");
    return reply;
}
