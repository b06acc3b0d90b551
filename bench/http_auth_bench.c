/* The HTTP frontend's bearer-token check (docs/http.md, "Authentication")
 * in process: ns per lmc_http_auth_ok() call for the right token and for
 * wrong ones that differ in the first byte, the last byte or the length,
 * beside a same-run baseline of the check with no token configured.
 *
 *   http_auth_bench [CALLS]   (default 2000000)
 *
 * The wrong tokens must cost the same as the right one (the comparison is
 * of SHA-256 digests by CRYPTO_memcmp): their spread is printed too.
 * bench/http_bench.sh runs it beside the wrk measurement. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/http_auth.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* ns per call of `calls` checks. */
static double run(const lmc_http_auth *a, const char *header, long calls, bool want)
{
    long ok = 0;
    double start = now_ns();
    for (long i = 0; i < calls; i++)
        ok += lmc_http_auth_ok(a, header);
    double t = (now_ns() - start) / (double)calls;
    if (ok != (want ? calls : 0)) {
        fprintf(stderr, "http_auth_bench: wrong answer for '%s'\n", header);
        exit(1);
    }
    return t;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 2000000;
    enum { N_CASES = 6, ROUNDS = 20 };
    const char *token = "Zm9vYmFyYmF6cXV4MDEyMzQ1Njc4OWFiY2RlZg-_Example";
    char right[128], first[128], last[128], shorter[128], longer[128];
    snprintf(right, sizeof right, "Bearer %s", token);
    snprintf(first, sizeof first, "Bearer X%s", token + 1);
    snprintf(last, sizeof last, "Bearer %.*sX", (int)strlen(token) - 1, token);
    snprintf(shorter, sizeof shorter, "Bearer %.8s", token);
    snprintf(longer, sizeof longer, "Bearer %s%s", token, token);
    lmc_http_auth off, on;
    if (lmc_http_auth_init(&off, NULL) != 0 || lmc_http_auth_init(&on, token) != 0) {
        fprintf(stderr, "http_auth_bench: SHA-256 unavailable\n");
        return 1;
    }
    /* Rounds visit every case in turn, so that drifting load on the
     * machine hits them alike; the best round of each is kept. */
    const lmc_http_auth *auth[N_CASES] = {&off, &on, &on, &on, &on, &on};
    const char *header[N_CASES] = {right, right, first, last, shorter, longer};
    double best[N_CASES];
    for (int c = 0; c < N_CASES; c++)
        best[c] = 1e30;
    for (int r = 0; r < ROUNDS; r++)
        for (int c = 0; c < N_CASES; c++) {
            double t = run(auth[c], header[c], calls / ROUNDS, c < 2);
            best[c] = t < best[c] ? t : best[c];
        }
    double base = best[0], ok = best[1], *wrong = best + 2;
    printf("http_auth_bench: %ld calls per case in %d rounds, best round, ns per call\n", calls,
           ROUNDS);
    printf("| token | ns |\n|---|---:|\n");
    printf("| none configured (baseline) | %.1f |\n", base);
    printf("| right (%zu bytes) | %.1f |\n", strlen(token), ok);
    printf("| wrong first byte | %.1f |\n| wrong last byte | %.1f |\n", wrong[0], wrong[1]);
    printf("| 8-byte prefix | %.1f |\n| token twice | %.1f |\n", wrong[2], wrong[3]);
    printf("http_auth_bench: the check costs %.2f us per request over the baseline; "
           "first vs last wrong byte differ by %.1f ns\n", (ok - base) / 1e3,
           wrong[1] - wrong[0]);
    lmc_http_auth_free(&off);
    lmc_http_auth_free(&on);
    return 0;
}
