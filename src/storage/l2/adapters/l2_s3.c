/* "s3" backend: see l2_s3.h.  One curl easy handle per pool slot keeps
 * connections alive between requests; a worker borrows a slot per call.
 * Bodies go straight between the L1 buffer and curl (read/write callbacks
 * over the caller's memory); payloads are sent UNSIGNED-PAYLOAD, as S3
 * allows, so a 2 MiB chunk is not hashed once more before upload.
 *
 * Usage (docs/l2.md, "Usage and capacity of resp and s3"): a size index of
 * every object, filled at start from ListObjectsV2, then kept by PUTs (an
 * overwrite replaces the size), DELETEs and HEADs that find an object
 * gone. */
#include "storage/l2/adapters/l2_s3.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obs/log.h"
#include "storage/l2/l2_internal.h"
#include "storage/l2/l2_size_index.h"
#include "storage/object_key_json.h"

#define UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
#define TEXT_MAX (16u << 20)       /* a listing page or an error body; 1000 keys take ~0.4 MiB */
#define NAME_MAX_LEN 1024          /* longer object names are not ours */
#define REBUILD_MAX_MS 60000       /* the listing at start stops after this */

typedef struct {
    CURL *curl;
    bool busy;
} s3_slot;

typedef struct s3_backend {
    lmc_l2_batch_backend base;     /* first: a backend pointer is an s3 pointer */
    char endpoint[512], host[300], bucket[256], region[64], access[256], secret[256];
    long timeout_ms;
    pthread_mutex_t pool_lock;
    pthread_cond_t pool_free;
    s3_slot *slots;
    size_t n_slots;
    lmc_key_interner *interner;
    lmc_l2_size_index *index;      /* what the bucket holds: usage, max_capacity_gb */
    /* Written by lmc_l2_s3_new() alone, before any other call: */
    bool keep_found;               /* keep `found` for the L2 eviction */
    lmc_l2_found_list found;       /* objects listed at start */
    uint64_t rebuild_keys, rebuild_ms;
    bool rebuild_complete;
    _Atomic uint64_t puts, put_errors, puts_refused, gets, hits, http_errors, stored_bytes;
} s3_backend;

/* ---- one request ------------------------------------------------------------ */

typedef struct {
    const uint8_t *data;       /* upload source */
    size_t len, pos;
} upload;

typedef struct {
    uint8_t *data;             /* download target; NULL: into `text` */
    size_t cap, len;
    bool overflow;
    char *text;                /* growable, for listings */
} download;

static size_t on_read(char *dst, size_t size, size_t n, void *user)
{
    upload *u = user;
    size_t want = size * n, left = u->len - u->pos;
    size_t take = want < left ? want : left;
    memcpy(dst, u->data + u->pos, take);
    u->pos += take;
    return take;
}

static size_t on_write(char *src, size_t size, size_t n, void *user)
{
    download *d = user;
    size_t got = size * n;
    if (!d->data) {
        if (got > TEXT_MAX - d->len) { /* no reply of S3's to us is that long */
            d->overflow = true;
            return 0;
        }
        char *grown = realloc(d->text, d->len + got + 1);
        if (!grown)
            return 0;
        d->text = grown;
        memcpy(d->text + d->len, src, got);
        d->len += got;
        d->text[d->len] = '\0';
        return got;
    }
    if (got > d->cap - d->len) { /* larger than the object we expect */
        d->overflow = true;
        return 0;
    }
    memcpy(d->data + d->len, src, got);
    d->len += got;
    return got;
}

typedef struct {
    const char *method;        /* GET PUT HEAD DELETE */
    const char *object;        /* object name (unencoded) or NULL for the bucket */
    const char *query;         /* canonical query string or "" */
    upload *up;
    download *down;
    CURLcode *curl_rc;         /* NULL: a failed transfer counts in http_errors;
                                * else it is written here instead (the probe's) */
} s3_request;

static int build_auth(s3_backend *S, const s3_request *rq, const char *uri, char *amz_date,
                      char *auth, size_t cap)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(amz_date, 17, "%Y%m%dT%H%M%SZ", &tm);
    lmc_s3_header h[3] = {{"host", S->host},
                          {"x-amz-content-sha256", UNSIGNED_PAYLOAD},
                          {"x-amz-date", amz_date}};
    return lmc_s3_authorization(rq->method, uri, rq->query, h, 3, UNSIGNED_PAYLOAD, S->access,
                                S->secret, S->region, amz_date, auth, cap);
}

/* Performs the request; returns the HTTP status, or 0 when none came. */
static long perform(s3_backend *S, CURL *c, const s3_request *rq)
{
    char uri[2048], url[12288], amz_date[17], auth[700], hdr[3][800];
    int n = snprintf(uri, sizeof uri, "/%s/", S->bucket);
    if (rq->object &&
        lmc_s3_uri_encode(rq->object, strlen(rq->object), true, uri + n, sizeof uri - (size_t)n) < 0)
        return 0;
    snprintf(url, sizeof url, "%s%s%s%s", S->endpoint, uri, rq->query[0] ? "?" : "", rq->query);
    if (build_auth(S, rq, uri, amz_date, auth, sizeof auth) != 0)
        return 0;
    snprintf(hdr[0], sizeof hdr[0], "Authorization: %s", auth);
    snprintf(hdr[1], sizeof hdr[1], "x-amz-date: %s", amz_date);
    snprintf(hdr[2], sizeof hdr[2], "x-amz-content-sha256: %s", UNSIGNED_PAYLOAD);
    struct curl_slist *headers = NULL;
    for (int i = 0; i < 3; i++)
        headers = curl_slist_append(headers, hdr[i]);
    headers = curl_slist_append(headers, "Expect:"); /* no 100-continue round trip */
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, S->timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (strcmp(rq->method, "PUT") == 0) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(c, CURLOPT_READDATA, rq->up);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)(rq->up ? rq->up->len : 0));
    } else if (strcmp(rq->method, "HEAD") == 0) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (strcmp(rq->method, "GET") != 0) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
    }
    download sink = {0};
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, rq->down ? rq->down : &sink);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else if (rq->curl_rc)
        *rq->curl_rc = rc;
    else if (!(rq->down && rq->down->overflow))
        atomic_fetch_add(&S->http_errors, 1);
    free(sink.text);
    curl_slist_free_all(headers);
    return status;
}

static s3_slot *pool_acquire(s3_backend *S)
{
    pthread_mutex_lock(&S->pool_lock);
    for (;;) {
        for (size_t i = 0; i < S->n_slots; i++) {
            if (!S->slots[i].busy) {
                S->slots[i].busy = true;
                pthread_mutex_unlock(&S->pool_lock);
                return &S->slots[i];
            }
        }
        pthread_cond_wait(&S->pool_free, &S->pool_lock);
    }
}

static void pool_release(s3_backend *S, s3_slot *slot)
{
    pthread_mutex_lock(&S->pool_lock);
    slot->busy = false;
    pthread_cond_signal(&S->pool_free);
    pthread_mutex_unlock(&S->pool_lock);
}

/* ---- backend ops -------------------------------------------------------------- */

static bool object_name(const lmc_object_key *k, char *out, size_t cap)
{
    return lmc_object_key_to_string(k, out, cap) > 0;
}

/* ---- store: the whole batch reserved, its parts written apart -------------------- */

/* docs/l2.md, "Parts": the capacity check covers the whole batch, so a
 * batch that would pass max_capacity_gb is refused before anything is
 * written (as fs refuses one); the L2 eviction makes room ahead of that. */
static void *s3_store_begin(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                            size_t n)
{
    s3_backend *S = (s3_backend *)b;
    bool refused;
    atomic_fetch_add(&S->puts, 1);
    lmc_l2_reservation *r = lmc_l2_size_index_reserve_keys(S->index, keys, sizes, n, &refused);
    if (!r) {
        if (refused)
            atomic_fetch_add(&S->puts_refused, 1);
        atomic_fetch_add(&S->put_errors, 1);
    }
    return r;
}

/* PUTs of one part, one after the other on this worker's handle; each
 * object is settled as its PUT returns. */
static int64_t s3_store_part(lmc_l2_backend *b, void *batch, size_t from,
                             const lmc_object_key *keys, uint8_t *const *bufs,
                             const uint64_t *sizes, size_t n)
{
    s3_backend *S = (s3_backend *)b;
    lmc_l2_reservation *sb = batch;
    s3_slot *slot = pool_acquire(S);
    bool all = true;
    int64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        char name[NAME_MAX_LEN];
        upload up = {bufs[i], sizes[i], 0};
        s3_request rq = {"PUT", name, "", &up, NULL, NULL};
        uint8_t written =
            object_name(&keys[i], name, sizeof name) && perform(S, slot->curl, &rq) == 200;
        lmc_l2_size_index_settle(S->index, sb, from + i, 1, &written, written);
        all = all && written;
        bytes += (int64_t)sizes[i];
    }
    pool_release(S, slot);
    return all ? bytes : -1;
}

static bool s3_store_end(lmc_l2_backend *b, void *batch)
{
    s3_backend *S = (s3_backend *)b;
    lmc_l2_reservation *sb = batch;
    uint64_t bytes = lmc_l2_reservation_bytes(sb);
    bool ok = lmc_l2_size_index_release(S->index, sb);
    if (ok)
        atomic_fetch_add(&S->stored_bytes, bytes);
    else
        atomic_fetch_add(&S->put_errors, 1);
    return ok;
}

static int64_t s3_store(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                        const uint64_t *sizes, size_t n)
{
    void *batch = s3_store_begin(b, keys, sizes, n);
    if (!batch)
        return -1;
    int64_t bytes = s3_store_part(b, batch, 0, keys, bufs, sizes, n);
    return s3_store_end(b, batch) ? bytes : -1;
}

/* An object the bucket no longer has (deleted by someone else) leaves the
 * index when a lookup misses it. */
static void s3_lookup(lmc_l2_backend *b, const lmc_object_key *keys, const uint64_t *sizes,
                      size_t n, uint8_t *found)
{
    s3_backend *S = (s3_backend *)b;
    s3_slot *slot = pool_acquire(S);
    for (size_t i = 0; i < n; i++) {
        char name[NAME_MAX_LEN];
        s3_request rq = {"HEAD", name, "", NULL, NULL, NULL};
        found[i] = 0;
        long st = object_name(&keys[i], name, sizeof name) ? perform(S, slot->curl, &rq) : 0;
        if (st == 404)
            lmc_l2_size_index_forget(S->index, lmc_l2_key_id(name, strlen(name)));
        if (st != 200)
            continue;
        curl_off_t len = -1;
        curl_easy_getinfo(slot->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
        found[i] = len >= 0 && (!sizes || (uint64_t)len == sizes[i]);
    }
    pool_release(S, slot);
}

static void s3_load(lmc_l2_backend *b, const lmc_object_key *keys, uint8_t *const *bufs,
                    const uint64_t *sizes, size_t n, uint8_t *ok)
{
    s3_backend *S = (s3_backend *)b;
    s3_slot *slot = pool_acquire(S);
    for (size_t i = 0; i < n; i++) {
        char name[NAME_MAX_LEN];
        download d = {.data = bufs[i], .cap = sizes[i]};
        s3_request rq = {"GET", name, "", NULL, &d, NULL};
        long st = object_name(&keys[i], name, sizeof name) ? perform(S, slot->curl, &rq) : 0;
        ok[i] = st == 200 && !d.overflow && d.len == sizes[i]; /* never a short object */
        atomic_fetch_add(&S->gets, 1);
        if (ok[i])
            atomic_fetch_add(&S->hits, 1);
    }
    pool_release(S, slot);
}

/* S3 cannot pin objects: one deleted between lookup and load fails the load. */
static void s3_unlock(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    (void)b, (void)keys, (void)n;
}

/* S3 answers 204 to a DELETE whether or not the object was there: either
 * way it is gone afterwards, and counts as deleted. */
static size_t s3_remove(lmc_l2_backend *b, const lmc_object_key *keys, size_t n)
{
    s3_backend *S = (s3_backend *)b;
    s3_slot *slot = pool_acquire(S);
    size_t deleted = 0;
    for (size_t i = 0; i < n; i++) {
        char name[NAME_MAX_LEN];
        s3_request rq = {"DELETE", name, "", NULL, NULL, NULL};
        long st = object_name(&keys[i], name, sizeof name) ? perform(S, slot->curl, &rq) : 0;
        if (st / 100 == 2 || st == 404) {
            lmc_l2_size_index_forget(S->index, lmc_l2_key_id(name, strlen(name)));
            deleted++;
        }
    }
    pool_release(S, slot);
    return deleted;
}

static void s3_usage(lmc_l2_backend *b, lmc_l2_usage *u)
{
    s3_backend *S = (s3_backend *)b;
    lmc_l2_size_index_usage(S->index, u);
}

/* ---- listing (ListObjectsV2, paged) -------------------------------------------- */

/* Copies the text between <tag> and </tag>, searched in [*from, end), into
 * out with the five XML entities decoded; advances *from past it.  False
 * when the field is missing or does not fit in cap. */
static bool xml_field(const char **from, const char *end, const char *tag, char *out,
                      size_t cap)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    /* Searched within the range only: a field missing from one entry must
     * not send every entry's search through the rest of the page. */
    const char *a = memmem(*from, (size_t)(end - *from), open, strlen(open));
    const char *z = a ? memmem(a, (size_t)(end - a), close, strlen(close)) : NULL;
    if (!z)
        return false;
    a += strlen(open);
    size_t o = 0;
    for (const char *p = a; p < z; p++) {
        static const struct { const char *ent; char ch; } ents[] = {
            {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        if (o + 1 >= cap)
            return false;
        char ch = *p;
        for (size_t e = 0; e < 5 && *p == '&'; e++) {
            size_t l = strlen(ents[e].ent);
            if (strncmp(p, ents[e].ent, l) == 0) {
                ch = ents[e].ch;
                p += l - 1;
                break;
            }
        }
        out[o++] = ch;
    }
    out[o] = '\0';
    *from = z + strlen(close);
    return true;
}

/* "<digits>" of at most 18 digits, else -1. */
static long long parse_size(const char *s)
{
    size_t n = strspn(s, "0123456789");
    return n == 0 || n > 18 || s[n] ? -1 : atoll(s);
}

/* ISO 8601 "YYYY-MM-DDTHH:MM:SS[.mmm]Z" in ms since the epoch; 0 when
 * unparsable (such objects sort first). */
static int64_t parse_time_ms(const char *s)
{
    struct tm tm = {0};
    int ms = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec) != 6)
        return 0;
    const char *dot = strchr(s, '.');
    if (dot)
        ms = (int)strtol(dot + 1, NULL, 10) % 1000;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t < 0 ? 0 : (int64_t)t * 1000 + ms;
}

/* Called for every object of a listing that parses as an object key. */
typedef void (*listed_fn)(s3_backend *S, const char *name, const lmc_object_key *k,
                          uint64_t size, int64_t mtime_ms, void *ctx);

/* The objects of one page's XML; entries with a missing, over-long or
 * malformed field are skipped. */
static void parse_contents(s3_backend *S, const char *xml, listed_fn fn, void *ctx)
{
    const char *p = xml, *start;
    while ((start = strstr(p, "<Contents>")) != NULL) {
        const char *end = strstr(start, "</Contents>");
        if (!end)
            return;
        char name[NAME_MAX_LEN], size[32], when[64];
        const char *f = start;
        long long sz = -1;
        lmc_object_key k;
        if (xml_field(&f, end, "Key", name, sizeof name) &&
            (f = start, xml_field(&f, end, "Size", size, sizeof size)) &&
            (sz = parse_size(size)) >= 0 &&
            lmc_object_key_parse_string(S->interner, name, &k) == 0) { /* else foreign */
            f = start;
            int64_t ms = xml_field(&f, end, "LastModified", when, sizeof when)
                             ? parse_time_ms(when) : 0;
            fn(S, name, &k, (uint64_t)sz, ms, ctx);
        }
        p = end + strlen("</Contents>");
    }
}

/* One page; returns true and fills `token` when another page follows. */
static bool list_page(s3_backend *S, s3_slot *slot, const char *prefix, char *token,
                      size_t token_cap, listed_fn fn, void *ctx, bool *failed)
{
    char query[8192], enc_prefix[2048], enc_token[3200];
    if (lmc_s3_uri_encode(prefix, strlen(prefix), false, enc_prefix, sizeof enc_prefix) < 0 ||
        lmc_s3_uri_encode(token, strlen(token), false, enc_token, sizeof enc_token) < 0) {
        *failed = true;
        return false;
    }
    int qn = token[0] /* canonical query: parameters sorted by name */
                 ? snprintf(query, sizeof query, "continuation-token=%s&list-type=2&prefix=%s",
                            enc_token, enc_prefix)
                 : snprintf(query, sizeof query, "list-type=2&prefix=%s", enc_prefix);
    if (qn < 0 || (size_t)qn >= sizeof query) {
        *failed = true;
        return false;
    }
    download d = {0};
    s3_request rq = {"GET", NULL, query, NULL, &d, NULL};
    if (perform(S, slot->curl, &rq) != 200 || !d.text) {
        free(d.text);
        *failed = true;
        return false;
    }
    parse_contents(S, d.text, fn, ctx);
    const char *q = d.text;
    bool truncated = strstr(d.text, "<IsTruncated>true</IsTruncated>") != NULL;
    bool more = truncated && xml_field(&q, d.text + d.len, "NextContinuationToken", token,
                                       token_cap);
    *failed = truncated && !more; /* a next page we cannot ask for */
    free(d.text);
    return more;
}

static void add_listed(s3_backend *S, const char *name, const lmc_object_key *k, uint64_t size,
                       int64_t mtime_ms, void *entries)
{
    (void)S, (void)mtime_ms;
    json_array_append_new(entries, json_pack("{s:o, s:I, s:s}", "key", lmc_object_key_json(k),
                                             "size_bytes", (json_int_t)size, "name", name));
}

static void s3_list(lmc_l2_backend *b, const char *model, json_t *entries)
{
    s3_backend *S = (s3_backend *)b;
    char prefix[600], token[1024] = "";
    snprintf(prefix, sizeof prefix, "%s%s", model ? model : "", model ? "@" : "");
    s3_slot *slot = pool_acquire(S);
    bool failed = false;
    while (list_page(S, slot, prefix, token, sizeof token, add_listed, entries, &failed)) {
    }
    pool_release(S, slot);
    if (failed)
        LMC_WARN("s3: listing %s failed", S->bucket);
}

/* ---- the rebuild at start ------------------------------------------------------ */

/* For the L2 eviction, objects written within the same second are one
 * batch, older batches first (as fs orders recovered files by mtime). */
static void rebuild_object(s3_backend *S, const char *name, const lmc_object_key *k,
                           uint64_t size, int64_t mtime_ms, void *ctx)
{
    (void)ctx;
    if (lmc_l2_size_index_put(S->index, lmc_l2_key_id(name, strlen(name)), size) != 0 ||
        (S->keep_found && lmc_l2_found_add(&S->found, k, size, mtime_ms / 1000, mtime_ms) != 0))
        return;
    S->rebuild_keys++;
}

/* Fills the index from the bucket's listing (docs/l2.md, "Usage and
 * capacity of resp and s3"), within REBUILD_MAX_MS. */
static void rebuild(s3_backend *S)
{
    int64_t start = lmc_l2_now_ms();
    char token[1024] = "";
    bool failed = false, more = true;
    s3_slot *slot = pool_acquire(S);
    while (more && !failed && lmc_l2_now_ms() - start <= REBUILD_MAX_MS)
        more = list_page(S, slot, "", token, sizeof token, rebuild_object, NULL, &failed);
    pool_release(S, slot);
    S->rebuild_complete = !more && !failed;
    S->rebuild_ms = (uint64_t)(lmc_l2_now_ms() - start);
    if (!S->rebuild_complete)
        LMC_WARN("s3: counted %llu objects in bucket %s within %llu ms, not all of them: usage "
                 "counts those and what this server stores (docs/l2.md)",
                 (unsigned long long)S->rebuild_keys, S->bucket,
                 (unsigned long long)S->rebuild_ms);
}

static void s3_for_each_recovered(lmc_l2_backend *b, lmc_l2_recovered_fn fn, void *user)
{
    s3_backend *S = (s3_backend *)b;
    lmc_l2_found_hand_over(&S->found, fn, user);
}

/* ---- health (docs/l2.md, "Health") ------------------------------------------- */

static const char *status_hint(long st)
{
    switch (st) {
    case 301: return " (the bucket is in another region or behind another endpoint)";
    case 403: return " (access denied: check the keys)";
    case 404: return " (no such bucket)";
    default: return "";
    }
}

/* HEAD bucket, signed, on a handle of its own (the pool's stay with the
 * workers): the cheapest request that proves endpoint, keys and bucket. */
static int s3_probe(lmc_l2_backend *b, char *why, size_t cap)
{
    s3_backend *S = (s3_backend *)b;
    CURL *c = curl_easy_init();
    if (!c)
        return snprintf(why, cap, "out of memory"), -1;
    CURLcode rc = CURLE_OK;
    s3_request head = {"HEAD", NULL, "", NULL, NULL, &rc};
    long st = perform(S, c, &head);
    curl_easy_cleanup(c);
    if (st == 200)
        return 0;
    if (st == 0)
        snprintf(why, cap, "HEAD bucket %s at %s: %s", S->bucket, S->endpoint,
                 rc != CURLE_OK ? curl_easy_strerror(rc) : "the request could not be signed");
    else
        snprintf(why, cap, "HEAD bucket %s at %s: HTTP %ld%s", S->bucket, S->endpoint, st,
                 status_hint(st));
    return -1;
}

/* ---- status, lifetime ------------------------------------------------------------ */

static json_t *s3_status(lmc_l2_backend *b)
{
    s3_backend *S = (s3_backend *)b;
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:b}}",
                     "endpoint", S->endpoint, "bucket", S->bucket,
                     "puts", (json_int_t)atomic_load(&S->puts),
                     "put_errors", (json_int_t)atomic_load(&S->put_errors),
                     "puts_refused_full", (json_int_t)atomic_load(&S->puts_refused),
                     "gets", (json_int_t)atomic_load(&S->gets),
                     "get_hits", (json_int_t)atomic_load(&S->hits),
                     "http_errors", (json_int_t)atomic_load(&S->http_errors),
                     "stored_bytes", (json_int_t)atomic_load(&S->stored_bytes),
                     "usage_rebuild", "keys", (json_int_t)S->rebuild_keys, "ms",
                     (json_int_t)S->rebuild_ms, "complete", S->rebuild_complete);
}

static void s3_destroy(lmc_l2_backend *b)
{
    s3_backend *S = (s3_backend *)b;
    for (size_t i = 0; S->slots && i < S->n_slots; i++)
        curl_easy_cleanup(S->slots[i].curl);
    free(S->slots);
    lmc_l2_found_clear(&S->found);
    lmc_l2_size_index_free(S->index);
    lmc_key_interner_free(S->interner);
    pthread_mutex_destroy(&S->pool_lock);
    pthread_cond_destroy(&S->pool_free);
    free(S);
}

static const lmc_l2_backend_ops s3_ops = {
    .store = s3_store,
    .lookup_and_lock = s3_lookup,
    .load = s3_load,
    .unlock = s3_unlock,
    .remove = s3_remove,
    .usage = s3_usage,
    .list = s3_list,
    .status = s3_status,
    .destroy = s3_destroy,
    .for_each_recovered = s3_for_each_recovered,
    .probe = s3_probe,
};

static const lmc_l2_store_batch_ops s3_batch_ops = {
    .begin = s3_store_begin,
    .part = s3_store_part,
    .end = s3_store_end,
};

/* "http://host:port/..." -> "host:port", the Host header curl will send. */
static bool host_of(const char *endpoint, char *out, size_t cap)
{
    const char *p = strstr(endpoint, "://");
    p = p ? p + 3 : endpoint;
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= cap)
        return false;
    memcpy(out, p, n);
    out[n] = '\0';
    return true;
}

static bool ensure_bucket(s3_backend *S, bool create)
{
    s3_slot *slot = pool_acquire(S);
    s3_request head = {"HEAD", NULL, "", NULL, NULL, NULL};
    long st = perform(S, slot->curl, &head);
    if (st == 404 && create) {
        upload none = {(const uint8_t *)"", 0, 0};
        s3_request put = {"PUT", NULL, "", &none, NULL, NULL};
        st = perform(S, slot->curl, &put);
    }
    pool_release(S, slot);
    return st == 200;
}

static const char *or_env(const char *v, const char *env)
{
    return v && *v ? v : (getenv(env) ? getenv(env) : "");
}

lmc_l2_backend *lmc_l2_s3_new(const lmc_l2_s3_options *o, char *err, size_t errlen)
{
    s3_backend *S = calloc(1, sizeof *S);
    if (!S) {
        snprintf(err, errlen, "s3: out of memory");
        return NULL;
    }
    /* Stores are split through the store_batch ops (docs/l2.md, "Parts"). */
    S->base = (lmc_l2_batch_backend){
        .base = {.ops = &s3_ops, .type = "s3",
                 .split_ops = LMC_L2_SPLIT_LOOKUP | LMC_L2_SPLIT_LOAD | LMC_L2_SPLIT_STORE_BATCH},
        .store_batch = &s3_batch_ops};
    snprintf(S->endpoint, sizeof S->endpoint, "%s", o->endpoint ? o->endpoint : "");
    size_t el = strlen(S->endpoint);
    while (el && S->endpoint[el - 1] == '/')
        S->endpoint[--el] = '\0';
    snprintf(S->bucket, sizeof S->bucket, "%s", o->bucket ? o->bucket : "");
    snprintf(S->region, sizeof S->region, "%s", o->region && *o->region ? o->region : "us-east-1");
    snprintf(S->access, sizeof S->access, "%s", or_env(o->access_key, "AWS_ACCESS_KEY_ID"));
    snprintf(S->secret, sizeof S->secret, "%s", or_env(o->secret_key, "AWS_SECRET_ACCESS_KEY"));
    S->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    S->keep_found = o->keep_found;
    S->index = lmc_l2_size_index_new(o->capacity_bytes);
    S->n_slots = o->num_connections ? o->num_connections : 1;
    pthread_mutex_init(&S->pool_lock, NULL);
    pthread_cond_init(&S->pool_free, NULL);
    S->slots = calloc(S->n_slots, sizeof *S->slots);
    S->interner = lmc_key_interner_new();
    bool ok = S->slots && S->interner && S->index && host_of(S->endpoint, S->host, sizeof S->host) &&
              S->bucket[0];
    for (size_t i = 0; ok && i < S->n_slots; i++)
        ok = (S->slots[i].curl = curl_easy_init()) != NULL;
    if (!ok) {
        snprintf(err, errlen, "s3: need an http(s) endpoint and a bucket");
        s3_destroy(&S->base.base);
        return NULL;
    }
    if (ensure_bucket(S, o->create_bucket))
        rebuild(S);
    else
        LMC_WARN("s3: bucket %s at %s is not reachable yet; operations will fail until it is, "
                 "and usage counts only what this server stores",
                 S->bucket, S->endpoint);
    return &S->base.base;
}
