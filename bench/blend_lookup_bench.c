/* blend_lookup_bench: CB_UNIFIED_LOOKUP of a long prompt beside a plain
 * LOOKUP of the same prompt (issue 35; docs/cacheblend.md, "Unified
 * lookup"), with `lmcached --engine-type blend` in a child process.
 *
 * A server-driven worker (CPU shared tensors, sd_worker) STOREs 16
 * documents of 2048 tokens, each after its own one-chunk preamble (chunk
 * 0 of a stored range is never fingerprinted), as separate rank-0
 * requests.  The prompt: a new 100-token preamble, then the documents in
 * shuffled order with 1..15 filler tokens before each, cut to 32768 tokens
 * (whole chunks).  Then, alternating in the same run (the order swapped
 * every round), `--rounds` times, each under a fresh request id and
 * followed by an untimed END_SESSION:
 *   LOOKUP  LOOKUP + QUERY_PREFETCH_STATUS polled until it answers (what a
 *           scheduler pays for a prefix lookup);
 *   CB      CB_UNIFIED_LOOKUP re-issued until it answers the result;
 *   NOOP    one round trip, for scale.
 * p50 / p90 of each, p50(CB) / p50(LOOKUP) (goal <= 2), the first round
 * (a fresh server's first lookup: CB first, LOOKUP first with
 * --lookup-first, once the L1 pre-fault is over) apart; every CB result must hold every
 * document chunk inside the prompt at its place (else exit 1).  Then the
 * matcher's memory from /status.
 *
 *   blend_lookup_bench [--rounds N] [--lookup-first] [lmcached flags...]
 *                                                   (N: 200)
 *
 * Other flags go to lmcached after the bench's own (--chunk-size 256 ...),
 * so that they override them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sd_worker.h"
#include "common/server_child.h"
#include "config/config.h"

#define DOCS 16
#define DOC_TOKENS 2048
#define PROMPT 32768
#define PREAMBLE 100
#define LAYERS 2
#define HS 64
#define MAX_ARGS 64

typedef struct {
    uint64_t *toks;           /* the prompt, n tokens (whole chunks) */
    size_t n;
    size_t *want_cur;         /* cur_st of every document chunk inside it, ascending */
    size_t n_want;
    uint64_t *old_of;         /* and its stored old_st */
} prompt;

/* Token ids apart per document, preamble and filler (splitmix64), so that
 * no window of one is a window of another. */
static uint64_t tok(uint64_t stream, uint64_t i)
{
    uint64_t z = (stream << 32 | i) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) % 100000 + 1000;
}

static void doc_tokens(uint64_t *t, size_t d)
{
    for (size_t j = 0; j < DOC_TOKENS; j++)
        t[j] = tok(100 + d, j);
}

/* STOREs document d after its own one-chunk preamble, rank 0, blocks 1.. */
static int store_doc(sd_worker *w, size_t d)
{
    size_t cs = w->cs, n = cs + DOC_TOKENS;
    uint64_t *t = malloc(n * sizeof *t);
    if (!t)
        return -1;
    for (size_t j = 0; j < cs; j++)
        t[j] = tok(200 + d, j);
    doc_tokens(t + cs, d);
    char rid[32];
    snprintf(rid, sizeof rid, "store-%zu", d);
    int rc = sdw_transfer(w, t, 0, n / cs, 1, rid, true) != 0 || sdw_end_session(w, rid) != 0;
    free(t);
    return rc ? -1 : 0;
}

static void shuffle(size_t *a, size_t n, uint64_t seed)
{
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = tok(7, seed + i) % (i + 1), x = a[i];
        a[i] = a[j], a[j] = x;
    }
}

/* The prompt and where each document chunk inside it lies. */
static int build_prompt(prompt *p, size_t cs)
{
    size_t cap = PREAMBLE + DOCS * (DOC_TOKENS + 16), order[DOCS], at = 0;
    size_t max_want = DOCS * DOC_TOKENS / cs;
    p->toks = malloc(cap * sizeof *p->toks);
    p->want_cur = malloc(max_want * sizeof *p->want_cur);
    p->old_of = malloc(max_want * sizeof *p->old_of);
    if (!p->toks || !p->want_cur || !p->old_of)
        return -1;
    for (size_t j = 0; j < PREAMBLE; j++)
        p->toks[at++] = tok(300, j);
    for (size_t d = 0; d < DOCS; d++)
        order[d] = d;
    shuffle(order, DOCS, 1);
    size_t doc_at[DOCS];
    for (size_t i = 0; i < DOCS; i++) {
        size_t fill = 1 + (i * 7) % 15;          /* never a multiple of the chunk size */
        for (size_t j = 0; j < fill; j++)
            p->toks[at++] = tok(400 + i, j);
        doc_at[i] = at;
        doc_tokens(p->toks + at, order[i]);
        at += DOC_TOKENS;
    }
    p->n = (at < PROMPT ? at : PROMPT) / cs * cs;
    p->n_want = 0;
    for (size_t i = 0; i < DOCS; i++)
        for (size_t c = 0; c < DOC_TOKENS / cs; c++)
            if (doc_at[i] + (c + 1) * cs <= p->n) {
                p->want_cur[p->n_want] = doc_at[i] + c * cs;
                p->old_of[p->n_want++] = cs + c * cs;   /* after the stored preamble */
            }
    return 0;
}

static void prompt_free(prompt *p)
{
    free(p->toks);
    free(p->want_cur);
    free(p->old_of);
}

/* Whether a CBUnifiedLookupResult holds exactly the prompt's document
 * chunks, at their places, with no prefix (the preamble is new). */
static bool result_ok(const lmc_client_reply *r, const prompt *p, size_t *found)
{
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_init(&z, 4096);
    bool ok = r->has_response && msgpack_unpack((const char *)r->data, r->len, &off, &z, &o) ==
                                     MSGPACK_UNPACK_SUCCESS;
    const msgpack_object *pre = ok ? lmc_mp_map_get(&o, "prefix_coverage_tokens") : NULL;
    const msgpack_object *seg = ok ? lmc_mp_map_get(&o, "non_prefix_segments") : NULL;
    uint64_t prefix = 1;
    ok = pre && seg && lmc_mp_get_uint(pre, &prefix) && prefix == 0 &&
         seg->type == MSGPACK_OBJECT_ARRAY;
    *found = ok ? seg->via.array.size : 0;
    ok = ok && seg->via.array.size == p->n_want;
    for (size_t i = 0; ok && i < p->n_want; i++) {
        const msgpack_object *m = &seg->via.array.ptr[i];
        const msgpack_object *cur = lmc_mp_map_get(m, "cur_st"), *old = lmc_mp_map_get(m, "old_st");
        uint64_t c, od;
        ok = cur && old && lmc_mp_get_uint(cur, &c) && lmc_mp_get_uint(old, &od) &&
             c == p->want_cur[i] && od == p->old_of[i];
    }
    msgpack_zone_destroy(&z);
    return ok;
}

/* CB_UNIFIED_LOOKUP(key, 1) re-issued until it answers; *polls the calls. */
static int unified_lookup(sd_worker *w, const prompt *p, const char *rid, lmc_client_reply *r,
                          int *polls)
{
    for (*polls = 1;; ++*polls) {
        msgpack_sbuffer a[2];
        msgpack_packer pk;
        sdw_pack_key(&a[0], w, p->toks, 0, p->n, rid, true);
        sdw_sb_packer(&a[1], &pk), msgpack_pack_int(&pk, 1);
        lmc_client_status st = lmc_client_call(w->c, LMC_OP_CB_UNIFIED_LOOKUP, a, 2, 60000, r);
        msgpack_sbuffer_destroy(&a[0]);
        msgpack_sbuffer_destroy(&a[1]);
        if (st != LMC_CLIENT_OK)
            return -1;
        if (r->has_response)
            return 0;
        lmc_client_reply_free(r);
    }
}

typedef struct {
    double *lookup, *cb, *noop;
    int max_polls;
    size_t found;
} samples;

/* One round: NOOP, then LOOKUP and CB in the order `cb_first` says; the
 * END_SESSIONs untimed. */
static int round_once(sd_worker *w, const prompt *p, size_t i, bool cb_first, samples *s)
{
    char lrid[32], crid[32];
    snprintf(lrid, sizeof lrid, "lookup-%zu", i);
    snprintf(crid, sizeof crid, "cb-%zu", i);
    double t0 = sdw_now_s();
    if (sdw_call(w->c, LMC_OP_NOOP, NULL, 0, NULL) != 0)
        return -1;
    s->noop[i] = sdw_now_s() - t0;
    for (int leg = 0; leg < 2; leg++) {
        bool cb = (leg == 0) == cb_first;
        t0 = sdw_now_s();
        if (!cb) {
            int64_t hits;
            if (sdw_lookup_wait(w, p->toks, p->n / w->cs, lrid, &hits) != 0)
                return -1;
            s->lookup[i] = sdw_now_s() - t0;
        } else {
            lmc_client_reply r;
            int polls;
            if (unified_lookup(w, p, crid, &r, &polls) != 0)
                return -1;
            s->cb[i] = sdw_now_s() - t0;
            bool ok = result_ok(&r, p, &s->found);
            lmc_client_reply_free(&r);
            s->max_polls = polls > s->max_polls ? polls : s->max_polls;
            if (!ok) {
                fprintf(stderr, "blend_lookup_bench: round %zu: CB_UNIFIED_LOOKUP found %zu "
                        "segments, want the prompt's %zu document chunks at their places\n",
                        i, s->found, p->n_want);
                return -1;
            }
        }
        if (sdw_end_session(w, cb ? crid : lrid) != 0)
            return -1;
    }
    return 0;
}

static void report(const char *what, double *v, size_t n, double first)
{
    qsort(v, n, sizeof *v, sdw_cmp_double);
    printf("  %-8s first %8.1f us | steady p50 %8.1f us, p90 %8.1f us\n", what, first * 1e6,
           v[n / 2] * 1e6, v[n * 9 / 10] * 1e6);
}

static int measure(sd_worker *w, const prompt *p, size_t rounds, bool lookup_first)
{
    samples s = {malloc(rounds * sizeof(double)), malloc(rounds * sizeof(double)),
                 malloc(rounds * sizeof(double)), 0, 0};
    int rc = s.lookup && s.cb && s.noop ? 0 : -1;
    for (size_t i = 0; i < rounds && rc == 0; i++)
        rc = round_once(w, p, i, (i % 2 == 0) != lookup_first, &s);
    if (rc == 0) {
        double l0 = s.lookup[0], c0 = s.cb[0], n0 = s.noop[0];
        /* steady state: rounds 1.. */
        report("NOOP", s.noop + 1, rounds - 1, n0);
        report("LOOKUP", s.lookup + 1, rounds - 1, l0);
        report("CB", s.cb + 1, rounds - 1, c0);
        double l50 = s.lookup[1 + (rounds - 1) / 2], c50 = s.cb[1 + (rounds - 1) / 2];
        printf("  CB_UNIFIED_LOOKUP / LOOKUP: first round %.2fx, steady p50 %.2fx "
               "(goal <= 2x: %s); %zu of %zu document chunks found every round, at most %d "
               "calls to an answer\n", c0 / l0, c50 / l50, c50 <= 2 * l50 ? "met" : "NOT met",
               s.found, p->n_want, s.max_polls);
    }
    free(s.lookup);
    free(s.cb);
    free(s.noop);
    return rc;
}

/* The JSON integer after "key": in body (-1 if absent). */
static long long json_int(const char *body, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(body, pat);
    return at ? strtoll(at + strlen(pat), NULL, 10) : -1;
}

static long long registered(int http)
{
    static char body[1 << 16];
    sdw_status_get(http, body, sizeof body);
    const char *blend = strstr(body, "\"blend\"");
    return blend ? json_int(blend, "registered_chunks") : -1;
}

/* Waits for the STORE hook's registrations (they run after the reply). */
static long long wait_registered(int http, long long want)
{
    long long n = -1;
    for (int i = 0; i < 500 && (n = registered(http)) != want; i++)
        usleep(10 * 1000);
    return n;
}

static void print_memory(int http)
{
    static char body[1 << 16];
    sdw_status_get(http, body, sizeof body);
    const char *blend = strstr(body, "\"blend\"");
    long long bytes = blend ? json_int(blend, "matcher_bytes") : -1,
              max = blend ? json_int(blend, "max_chunks") : -1,
              live = blend ? json_int(blend, "registered_chunks") : -1;
    printf("matcher (/status modules.blend): matcher_bytes %lld (%.1f MiB, allocated at start), "
           "max_chunks %lld, registered_chunks %lld; %.1f B per chunk at the --blend-max-chunks "
           "bound (docs/cacheblend.md, \"Capacity and memory\": 68 B each, at most 72, plus "
           "4 MiB)\n", bytes, bytes / 1048576.0, max, live, max > 0 ? (double)bytes / max : 0);
}

static pid_t start_server(int argc, char **argv, char *url, size_t url_len, int *http,
                          size_t *cs)
{
    char port[16], http_port[16];
    snprintf(port, sizeof port, "%d", 20000 + getpid() % 20000);
    *http = 40001 + getpid() % 20000;
    snprintf(http_port, sizeof http_port, "%d", *http);
    snprintf(url, url_len, "tcp://127.0.0.1:%s", port);
    char *args[MAX_ARGS] = {"lmcached", "--host", "127.0.0.1", "--port", port, "--engine-type",
                            "blend", "--chunk-size", "256", "--l1-size-gb", "0.5",
                            "--eviction-policy", "LRU", "--log-level", "WARNING", "--http-host",
                            "127.0.0.1", "--http-port", http_port, "--cpu-kv-layout", "hint"};
    int n = 21;
    for (int i = 0; i < argc && n < MAX_ARGS - 1; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    lmc_config cfg;
    char err[256];
    if (lmc_config_parse(&cfg, n, args, NULL, stdout, err, sizeof err) != LMC_CONFIG_OK) {
        fprintf(stderr, "blend_lookup_bench: %s\n", err);
        return -1;
    }
    *cs = (size_t)cfg.mp.chunk_size;
    pid_t pid = bench_server_fork(&cfg);
    lmc_config_free(&cfg);
    return pid;
}

static int run(sd_worker *w, int http, size_t rounds, bool lookup_first)
{
    for (int i = 0; i < 500 && sdw_call(w->c, LMC_OP_NOOP, NULL, 0, NULL) != 0; i++)
        usleep(10 * 1000);
    /* The first round on a fresh server whose page tables are filled, as
     * sd_transfer_bench measures it (BENCHMARKS.md, row 47). */
    double pf = sdw_wait_status(http, sdw_l1_prefaulted);
    if (sdw_register_worker(w, false) != 0)
        return -1;
    double em = sdw_wait_status(http, sdw_engine_mapped);
    printf("  (L1 pre-fault over %.2f s after the first poll, engine segments faulted in "
           "%.2f s after the registration)\n", pf, em);
    for (size_t d = 0; d < DOCS; d++)
        if (store_doc(w, d) != 0)
            return -1;
    long long want = DOCS * (long long)(DOC_TOKENS / w->cs);
    long long got = wait_registered(http, want);
    if (got != want) {
        fprintf(stderr, "blend_lookup_bench: %lld chunks registered, want %lld\n", got, want);
        return -1;
    }
    prompt p;
    int rc = build_prompt(&p, w->cs);
    if (rc == 0) {
        printf("blend_lookup_bench: %d documents of %d tokens stored (%lld chunks registered); "
               "prompt %zu tokens (%zu document chunks in it), chunk size %zu, %zu rounds\n",
               DOCS, DOC_TOKENS, got, p.n, p.n_want, w->cs, rounds);
        rc = measure(w, &p, rounds, lookup_first);
    }
    prompt_free(&p);
    if (rc == 0)
        print_memory(http);
    return rc;
}

int main(int argc, char **argv)
{
    size_t rounds = 200;
    bool lookup_first = false;
    int first = 1;
    for (bool more = true; more;) {
        more = false;
        if (first + 1 < argc && strcmp(argv[first], "--rounds") == 0)
            rounds = strtoul(argv[first + 1], NULL, 10), first += 2, more = true;
        else if (first < argc && strcmp(argv[first], "--lookup-first") == 0)
            lookup_first = true, first++, more = true;
    }
    if (rounds < 3) {
        fprintf(stderr, "usage: blend_lookup_bench [--rounds N>=3] [--lookup-first] "
                "[lmcached flags...]\n");
        return 1;
    }
    char url[64];
    int http;
    size_t cs;
    pid_t pid = start_server(argc - first, argv + first, url, sizeof url, &http, &cs);
    if (pid < 0)
        return 1;
    sd_worker w = {.c = lmc_client_connect(url), .instance = 1, .world = 1, .model = "blend",
                   .nb = 1 + (cs + DOC_TOKENS) / SDW_BS, .layers = LAYERS, .hs = HS, .cs = cs};
    int rc = !w.c || cs == 0 || DOC_TOKENS % cs != 0 || run(&w, http, rounds, lookup_first) != 0;
    if (rc)
        fprintf(stderr, "blend_lookup_bench: a request failed\n");
    sdw_free_tensors(&w);
    if (w.c)
        lmc_client_close(w.c);
    bench_server_kill(pid);
    return rc;
}
