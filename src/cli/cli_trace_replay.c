/* lmcache-cli trace replay (cli_trace_replay.h, docs/cli.md): reads the
 * whole trace once to refuse a bad one before anything reaches the
 * server, then sends its records in batches, each record no earlier than
 * its t_mono divided by --speed after the start, and prints the server's
 * counts and latencies. */
#include "cli/cli_trace_replay.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/storage_trace_reader.h"

/* Within the server's bounds (docs/trace.md, "Replaying a trace"): 4096
 * records, the HTTP frontend's bulk body limit (16 MiB by default). */
#define BATCH_RECORDS 1024
#define BATCH_BYTES (4u << 20)
#define N_OPS 8

typedef struct {
    const char *trace, *server;
    double speed;            /* 0: as fast as possible */
} replay_args;

/* What the server answered, per op name. */
typedef struct {
    char name[64];
    double *us;
    size_t n, cap;
} op_stats;

typedef struct {
    op_stats ops[N_OPS];
    size_t n_ops;
    uint64_t records, skipped, lookups, lookup_keys, hit_keys;
} totals;

typedef struct {
    uint8_t *buf;
    size_t len, cap, records;
} batch;

static void usage(FILE *out)
{
    fprintf(out, "usage: lmcache-cli trace replay TRACE --server http://HOST:PORT "
                 "[--speed X | --as-fast-as-possible]\n");
}

static int parse_args(int argc, char **argv, replay_args *a)
{
    *a = (replay_args){.speed = 1.0};
    bool fast = false, speed = false;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "--server") && i + 1 < argc) {
            a->server = argv[++i];
        } else if (!strcmp(w, "--speed") && i + 1 < argc) {
            char *end;
            a->speed = strtod(argv[++i], &end);
            if (!*argv[i] || *end || !isfinite(a->speed) || !(a->speed > 0)) {
                fprintf(stderr, "lmcache-cli: trace replay: --speed: invalid value '%s' "
                                "(a number > 0)\n", argv[i]);
                return -1;
            }
            speed = true;
        } else if (!strcmp(w, "--as-fast-as-possible")) {
            fast = true;
        } else if (w[0] == '-' || a->trace) {
            fprintf(stderr, "lmcache-cli: trace replay: unexpected argument '%s'\n", w);
            return -1;
        } else {
            a->trace = w;
        }
    }
    if (fast && speed) {
        fprintf(stderr, "lmcache-cli: trace replay: --speed and --as-fast-as-possible "
                        "exclude each other\n");
        return -1;
    }
    if (!a->trace || !a->server) {
        fprintf(stderr, "lmcache-cli: trace replay: %s is required\n",
                a->trace ? "--server" : "TRACE");
        return -1;
    }
    if (fast)
        a->speed = 0;
    return 0;
}

/* ---- the trace ------------------------------------------------------------ */

/* Reads every record: 0, or -1 after printing the reader's reason (which
 * names the byte offset of the frame at fault). */
static int check_trace(const char *path, uint64_t *records)
{
    char err[512];
    lmc_trace_reader *r = lmc_trace_reader_open(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "lmcache-cli: trace replay: %s\n", err);
        return -1;
    }
    lmc_trace_record rec;
    int rc;
    *records = 0;
    while ((rc = lmc_trace_reader_next(r, &rec, err, sizeof err)) == 1)
        (*records)++;
    lmc_trace_reader_close(r);
    if (rc < 0)
        fprintf(stderr, "lmcache-cli: trace replay: %s; nothing was replayed\n", err);
    return rc < 0 ? -1 : 0;
}

static bool batch_add(batch *b, const uint8_t *body, size_t len)
{
    if (b->len + 4 + len > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + 4 + len)
            cap *= 2;
        uint8_t *buf = realloc(b->buf, cap);
        if (!buf)
            return false;
        b->buf = buf;
        b->cap = cap;
    }
    uint8_t *p = b->buf + b->len;
    p[0] = (uint8_t)(len >> 24);
    p[1] = (uint8_t)(len >> 16);
    p[2] = (uint8_t)(len >> 8);
    p[3] = (uint8_t)len;
    memcpy(p + 4, body, len);
    b->len += 4 + len;
    b->records++;
    return true;
}

/* ---- the server ----------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len;
} reply_buf;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *user)
{
    reply_buf *r = user;
    size_t n = size * nmemb;
    char *d = realloc(r->data, r->len + n + 1);
    if (!d)
        return 0;
    memcpy(d + r->len, ptr, n);
    r->data = d;
    r->len += n;
    d[r->len] = '\0';
    return n;
}

/* POSTs one batch; the parsed reply, or NULL after printing why. */
static json_t *post(CURL *c, const char *url, const batch *b)
{
    reply_buf r = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/octet-stream");
    const char *token = getenv("LMCACHE_HTTP_AUTH_TOKEN");
    char auth[1024];
    if (token && *token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, b->len ? (const char *)b->buf : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b->len);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    json_t *j = rc == CURLE_OK && r.data ? json_loadb(r.data, r.len, 0, NULL) : NULL;
    if (rc != CURLE_OK)
        fprintf(stderr, "lmcache-cli: trace replay: %s: %s\n", url, curl_easy_strerror(rc));
    else if (status != 200 || !json_is_object(j))
        fprintf(stderr, "lmcache-cli: trace replay: %s answered %ld: %s\n", url, status,
                r.data ? r.data : "");
    free(r.data);
    if (rc != CURLE_OK || status != 200 || !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static op_stats *op_of(totals *t, const char *name)
{
    for (size_t i = 0; i < t->n_ops; i++)
        if (!strcmp(t->ops[i].name, name))
            return &t->ops[i];
    if (t->n_ops == N_OPS)
        return NULL;
    op_stats *o = &t->ops[t->n_ops++];
    snprintf(o->name, sizeof o->name, "%s", name);
    return o;
}

static void count_result(totals *t, json_t *res)
{
    t->records++;
    if (json_is_true(json_object_get(res, "skipped"))) {
        t->skipped++;
        return;
    }
    const char *name = json_string_value(json_object_get(res, "op"));
    op_stats *o = name ? op_of(t, name) : NULL;
    if (!o)
        return;
    if (!strcmp(name, "submit_prefetch_task")) {
        t->lookups++;
        t->lookup_keys += (uint64_t)json_integer_value(json_object_get(res, "keys"));
        t->hit_keys += (uint64_t)json_integer_value(json_object_get(res, "granted"));
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        double *us = realloc(o->us, cap * sizeof *us);
        if (!us)
            return;
        o->us = us;
        o->cap = cap;
    }
    o->us[o->n++] = json_number_value(json_object_get(res, "us"));
}

static int send_batch(CURL *c, const char *url, batch *b, totals *t)
{
    json_t *j = post(c, url, b);
    if (!j)
        return -1;
    json_t *results = json_object_get(j, "results");
    size_t i;
    json_t *res;
    json_array_foreach(results, i, res)
        count_result(t, res);
    json_decref(j);
    b->len = b->records = 0;
    return 0;
}

/* ---- pacing and the report ------------------------------------------------ */

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double when)
{
    double d = when - mono_now();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    size_t i = (size_t)ceil(p * (double)n);
    return v[i ? i - 1 : 0];
}

static void report(totals *t)
{
    printf("records replayed: %llu\n", (unsigned long long)t->records);
    printf("records skipped: %llu\n", (unsigned long long)t->skipped);
    printf("lookups: %llu\n", (unsigned long long)t->lookups);
    printf("lookup keys: %llu\n", (unsigned long long)t->lookup_keys);
    printf("hit keys: %llu\n", (unsigned long long)t->hit_keys);
    printf("hit rate: %.4f\n",
           t->lookup_keys ? (double)t->hit_keys / (double)t->lookup_keys : 0.0);
    printf("%-36s %8s %10s %10s %10s\n", "op", "count", "p50_us", "p90_us", "p99_us");
    for (size_t i = 0; i < t->n_ops; i++) {
        op_stats *o = &t->ops[i];
        if (!o->n)
            continue;
        qsort(o->us, o->n, sizeof *o->us, cmp_double);
        printf("%-36s %8zu %10.1f %10.1f %10.1f\n", o->name, o->n, pct(o->us, o->n, 0.5),
               pct(o->us, o->n, 0.9), pct(o->us, o->n, 0.99));
    }
}

/* Sends every record, paced; the last request gives back what the replay
 * still holds.  0 or -1 (already printed). */
static int replay(const replay_args *a, CURL *c, const char *url, const char *release_url,
                  totals *t)
{
    char err[512];
    lmc_trace_reader *r = lmc_trace_reader_open(a->trace, err, sizeof err);
    if (!r) {
        fprintf(stderr, "lmcache-cli: trace replay: %s\n", err);
        return -1;
    }
    batch b = {0};
    lmc_trace_record rec;
    double start = mono_now();
    int rc = 0, got;
    while (rc == 0 && (got = lmc_trace_reader_next(r, &rec, err, sizeof err)) == 1) {
        double due = a->speed > 0 ? start + rec.t_mono / a->speed : 0;
        bool wait = due > mono_now();
        if (b.records && (wait || b.records == BATCH_RECORDS || b.len >= BATCH_BYTES))
            rc = send_batch(c, url, &b, t);
        if (wait)
            sleep_until(due);
        if (rc == 0 && !batch_add(&b, rec.frame, rec.frame_len)) {
            fprintf(stderr, "lmcache-cli: trace replay: out of memory\n");
            rc = -1;
        }
    }
    if (rc == 0 && got < 0) {   /* changed since it was checked */
        fprintf(stderr, "lmcache-cli: trace replay: %s\n", err);
        rc = -1;
    }
    if (rc == 0)
        rc = send_batch(c, release_url, &b, t);
    free(b.buf);
    lmc_trace_reader_close(r);
    return rc;
}

int lmc_cli_trace_replay_main(int argc, char **argv)
{
    replay_args a;
    if (parse_args(argc, argv, &a) != 0) {
        usage(stderr);
        return 2;
    }
    uint64_t records;
    if (check_trace(a.trace, &records) != 0)
        return 1;
    size_t n = strlen(a.server);
    while (n && a.server[n - 1] == '/')
        n--;
    char url[2048], release_url[2100];
    snprintf(url, sizeof url, "%.*s/api/trace/replay", (int)n, a.server);
    snprintf(release_url, sizeof release_url, "%s?release=1", url);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    totals t = {0};
    int rc = c ? replay(&a, c, url, release_url, &t) : -1;
    if (c)
        curl_easy_cleanup(c);
    curl_global_cleanup();
    if (rc == 0)
        report(&t);
    for (size_t i = 0; i < t.n_ops; i++)
        free(t.ops[i].us);
    return rc == 0 ? 0 : 1;
}
