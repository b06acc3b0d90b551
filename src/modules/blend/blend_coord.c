/* The fleet fragment index's client (blend_coord.h; docs/cacheblend.md,
 * "Coordinator directory").  Requests live on one list, oldest first;
 * workers take the oldest queued one, post it with the fleet's HTTP
 * client (its timeout the time left to the deadline) and settle it.  A
 * request taken while in flight is unlinked and marked forgotten: its
 * worker frees it. */
#include "modules/blend/blend_coord.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base64.h"
#include "core/hex.h"
#include "fleet/http_client.h"

typedef struct req {
    struct req *next;
    char rid[LMC_BLEND_COORD_RID_MAX + 1];
    char *body; /* the POST body until a worker takes it */
    double deadline;
    bool queued, in_flight, done, forgotten;
    atomic_bool cancel;
    lmc_blend_coord_match *m;
    size_t n;
} req;

struct lmc_blend_coord {
    pthread_mutex_t mu;
    pthread_cond_t work;
    char *url, *token;
    double timeout_s;
    size_t max, count;
    req *head;
    bool stopping;
    unsigned n_workers;
    pthread_t workers[LMC_BLEND_COORD_MAX_CONCURRENCY];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int lmc_blend_coord_env(double *timeout_s, unsigned *concurrency, char *err, size_t errlen)
{
    *timeout_s = LMC_BLEND_COORD_DEFAULT_TIMEOUT_S;
    *concurrency = LMC_BLEND_COORD_DEFAULT_CONCURRENCY;
    const char *t = getenv("LMCACHE_COORDINATOR_BLEND_TIMEOUT");
    const char *c = getenv("LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY");
    char *end;
    if (t && *t) {
        errno = 0;
        double v = strtod(t, &end);
        if (*end || errno || !isfinite(v) || v <= 0 || v > 3600)
            return snprintf(err, errlen, "LMCACHE_COORDINATOR_BLEND_TIMEOUT=%.32s is not a "
                                         "number of seconds in (0, 3600]", t), -1;
        *timeout_s = v;
    }
    if (c && *c) {
        errno = 0;
        unsigned long v = strtoul(c, &end, 10);
        if (*end || errno || *c == '-' || v < 1 || v > LMC_BLEND_COORD_MAX_CONCURRENCY)
            return snprintf(err, errlen, "LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY=%.32s is "
                                         "not an integer in 1..%u", c,
                            LMC_BLEND_COORD_MAX_CONCURRENCY), -1;
        *concurrency = (unsigned)v;
    }
    return 0;
}

/* ---- the reply ---------------------------------------------------------------- */

static bool parse_match(const json_t *o, lmc_blend_coord_match *m)
{
    const json_t *h = json_object_get(o, "chunk_hash"), *old = json_object_get(o, "old_st");
    const json_t *cur = json_object_get(o, "cur_st");
    size_t len = json_string_length(h);
    if (!json_is_string(h) || len == 0 || len % 2 || len / 2 > LMC_BLEND_HASH_MAX ||
        !json_is_integer(old) || json_integer_value(old) < 0 || !json_is_integer(cur) ||
        json_integer_value(cur) < 0)
        return false;
    m->hash_len = len / 2;
    m->old_st = (uint64_t)json_integer_value(old);
    m->cur_st = (uint64_t)json_integer_value(cur);
    return lmc_hex_decode(json_string_value(h), m->hash_len, m->hash);
}

/* {"matches": [...]} into *out; false on anything else (the caller then
 * answers an empty list). */
static bool parse_reply(const char *text, size_t len, lmc_blend_coord_match **out, size_t *n)
{
    json_t *root = json_loadb(text, len, 0, NULL);
    const json_t *list = json_object_get(root, "matches");
    size_t k = json_array_size(list);
    lmc_blend_coord_match *m = json_is_array(list) && k ? calloc(k, sizeof *m) : NULL;
    bool ok = json_is_array(list) && (k == 0 || m);
    for (size_t i = 0; ok && i < k; i++)
        ok = parse_match(json_array_get(list, i), &m[i]);
    json_decref(root);
    if (!ok || k == 0) {
        free(m);
        m = NULL;
        k = 0;
    }
    *out = m;
    *n = k;
    return ok;
}

/* ---- the workers -------------------------------------------------------------- */

static req *oldest_queued(lmc_blend_coord *c)
{
    for (req *r = c->head; r; r = r->next)
        if (r->queued)
            return r;
    return NULL;
}

/* Posts body (the lock not held) with the time left to deadline; the
 * matches into *m, *n, empty on any failure. */
static void post(lmc_blend_coord *c, char *body, double deadline, const atomic_bool *cancel,
                 lmc_fleet_reply *reply, lmc_blend_coord_match **m, size_t *n)
{
    double left = deadline - now_s();
    *m = NULL;
    *n = 0;
    if (left <= 0)
        return;
    lmc_fleet_request rq = {.method = "POST", .url = c->url, .body = body,
                            .body_len = strlen(body), .auth_token = c->token,
                            .timeout_s = left, .cancel = cancel};
    if (lmc_fleet_http(&rq, reply) == 0 && reply->status == 200)
        parse_reply(reply->body, reply->len, m, n);
}

/* Settles r with the answer (lock held): dropped when r was taken or
 * given up on meanwhile. */
static void settle(req *r, lmc_blend_coord_match *m, size_t n)
{
    r->in_flight = false;
    if (r->forgotten || r->done) {
        free(m);
        if (r->forgotten)
            free(r);
        return;
    }
    r->m = m;
    r->n = n;
    r->done = true;
}

static void *worker(void *arg)
{
    lmc_blend_coord *c = arg;
    lmc_fleet_reply *reply = malloc(sizeof *reply); /* 64 KiB: not on the stack */
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        req *r = reply ? oldest_queued(c) : NULL;
        if (!r) {
            pthread_cond_wait(&c->work, &c->mu);
            continue;
        }
        r->queued = false;
        r->in_flight = true;
        char *body = r->body;
        r->body = NULL;
        double deadline = r->deadline;
        pthread_mutex_unlock(&c->mu);
        lmc_blend_coord_match *m;
        size_t n;
        post(c, body, deadline, &r->cancel, reply, &m, &n);
        free(body);
        pthread_mutex_lock(&c->mu);
        settle(r, m, n);
    }
    pthread_mutex_unlock(&c->mu);
    free(reply);
    return NULL;
}

/* ---- the API ------------------------------------------------------------------ */

static int refuse(char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "%s", why);
    return -1;
}

static int check_opts(const lmc_blend_coord_opts *o, char *err, size_t errlen)
{
    if (!o || !o->url || !o->url[0])
        return refuse(err, errlen, "blend coordinator client: no coordinator URL");
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s))
        return refuse(err, errlen, "LMCACHE_COORDINATOR_BLEND_TIMEOUT must be > 0 seconds");
    if (o->concurrency < 1 || o->concurrency > LMC_BLEND_COORD_MAX_CONCURRENCY)
        return refuse(err, errlen, "LMCACHE_COORDINATOR_BLEND_MATCH_CONCURRENCY must be in "
                                   "1..64");
    if (o->max_outstanding < 1)
        return refuse(err, errlen, "blend coordinator client: max_outstanding must be >= 1");
    return 0;
}

/* {url without a trailing '/'}/directory/blend-lookup */
static char *lookup_url(const char *base)
{
    size_t len = strlen(base);
    while (len && base[len - 1] == '/')
        len--;
    static const char path[] = "/directory/blend-lookup";
    char *u = malloc(len + sizeof path);
    if (u) {
        memcpy(u, base, len);
        memcpy(u + len, path, sizeof path);
    }
    return u;
}

lmc_blend_coord *lmc_blend_coord_new(const lmc_blend_coord_opts *o, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen) != 0)
        return NULL;
    lmc_blend_coord *c = calloc(1, sizeof *c);
    if (!c || !(c->url = lookup_url(o->url)) ||
        (o->auth_token && o->auth_token[0] && !(c->token = strdup(o->auth_token)))) {
        if (c) {
            free(c->url);
            free(c);
        }
        refuse(err, errlen, "blend coordinator client: out of memory");
        return NULL;
    }
    c->timeout_s = o->timeout_s;
    c->max = o->max_outstanding;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    for (; c->n_workers < o->concurrency; c->n_workers++)
        if (pthread_create(&c->workers[c->n_workers], NULL, worker, c) != 0)
            break;
    if (c->n_workers == 0) {
        lmc_blend_coord_free(c);
        refuse(err, errlen, "blend coordinator client: cannot start a thread");
        return NULL;
    }
    return c;
}

static void free_req(req *r)
{
    free(r->body);
    free(r->m);
    free(r);
}

void lmc_blend_coord_free(lmc_blend_coord *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    for (req *r = c->head; r; r = r->next)
        atomic_store(&r->cancel, true);
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < c->n_workers; i++)
        pthread_join(c->workers[i], NULL);
    for (req *r = c->head, *n; r; r = n) {
        n = r->next;
        free_req(r);
    }
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->mu);
    free(c->url);
    free(c->token);
    free(c);
}

static req **find(lmc_blend_coord *c, const char *rid)
{
    req **p = &c->head;
    while (*p && strcmp((*p)->rid, rid) != 0)
        p = &(*p)->next;
    return p;
}

/* Unlinks *p (lock held); its worker frees it when it is in flight. */
static void forget(lmc_blend_coord *c, req **p)
{
    req *r = *p;
    *p = r->next;
    c->count--;
    if (r->in_flight) {
        r->forgotten = true;
        atomic_store(&r->cancel, true);
    } else {
        free_req(r);
    }
}

/* Forgets the requests nobody took LMC_BLEND_COORD_FORGET_S after their
 * deadline (lock held). */
static void forget_stale(lmc_blend_coord *c, double now)
{
    for (req **p = &c->head; *p;)
        if (now > (*p)->deadline + LMC_BLEND_COORD_FORGET_S)
            forget(c, p);
        else
            p = &(*p)->next;
}

/* The POST body; NULL when the tokens or names cannot go (then the
 * answer is an empty list). */
static char *request_body(const uint64_t *tokens, size_t n, const char *model,
                          uint32_t world_size, const char *salt)
{
    if (n == 0 || n > LMC_BLEND_COORD_MAX_TOKENS)
        return NULL;
    uint8_t *raw = malloc(4 * n);
    char *b64 = malloc(lmc_base64_len(4 * n) + 1);
    bool ok = raw && b64;
    for (size_t i = 0; ok && i < n; i++) {
        ok = tokens[i] <= UINT32_MAX;
        for (int j = 0; j < 4; j++)
            raw[4 * i + j] = (uint8_t)(tokens[i] >> (8 * j));
    }
    char *text = NULL;
    if (ok) {
        lmc_base64_encode(raw, 4 * n, b64);
        json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "tokens_b64", b64, "model_name", model,
                              "world_size", (json_int_t)world_size, "cache_salt",
                              salt ? salt : "");
        text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    free(raw);
    free(b64);
    return text;
}

int lmc_blend_coord_submit(lmc_blend_coord *c, const char *rid, const uint64_t *tokens, size_t n,
                           const char *model, uint32_t world_size, const char *salt)
{
    if (!c || !rid || strlen(rid) > LMC_BLEND_COORD_RID_MAX || !model || (n && !tokens))
        return -1;
    pthread_mutex_lock(&c->mu);
    bool known = *find(c, rid) != NULL;
    if (!known)
        forget_stale(c, now_s());
    bool full = !known && c->count >= c->max;
    pthread_mutex_unlock(&c->mu);
    if (known)
        return 0;
    if (full)
        return -1;
    req *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    snprintf(r->rid, sizeof r->rid, "%s", rid);
    atomic_init(&r->cancel, false);
    r->body = request_body(tokens, n, model, world_size, salt); /* outside the lock */
    r->deadline = now_s() + c->timeout_s;
    r->done = r->body == NULL; /* nothing to ask: the answer is empty */
    r->queued = !r->done;
    pthread_mutex_lock(&c->mu);
    req **tail = find(c, rid); /* a submit of the same id may have won the race */
    int rc = 0;
    if (*tail || c->count >= c->max) {
        rc = *tail ? 0 : -1;
        free_req(r);
    } else {
        *tail = r;
        c->count++;
        pthread_cond_signal(&c->work);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

lmc_blend_coord_state lmc_blend_coord_poll(lmc_blend_coord *c, const char *rid,
                                           lmc_blend_coord_match **matches, size_t *n)
{
    *matches = NULL;
    *n = 0;
    if (!c || !rid)
        return LMC_BLEND_COORD_UNKNOWN;
    pthread_mutex_lock(&c->mu);
    req *r = *find(c, rid);
    lmc_blend_coord_state st = !r ? LMC_BLEND_COORD_UNKNOWN : LMC_BLEND_COORD_PENDING;
    if (r && !r->done && now_s() >= r->deadline) { /* given up on: a late answer is dropped */
        r->done = true;
        r->queued = false;
        atomic_store(&r->cancel, true);
    }
    if (r && r->done) {
        st = LMC_BLEND_COORD_DONE;
        *matches = r->n ? malloc(r->n * sizeof **matches) : NULL;
        if (*matches) {
            memcpy(*matches, r->m, r->n * sizeof **matches);
            *n = r->n;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

void lmc_blend_coord_take(lmc_blend_coord *c, const char *rid)
{
    if (!c || !rid)
        return;
    pthread_mutex_lock(&c->mu);
    req **p = find(c, rid);
    if (*p)
        forget(c, p);
    pthread_mutex_unlock(&c->mu);
}
