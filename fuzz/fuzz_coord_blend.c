/* Fuzz target: the coordinator's POST /directory/blend-lookup body
 * (src/coordinator/coord_blend_http.c, docs/coordinator.md "Blend lookup"):
 * JSON, its namespace and its tokens, as base64 (src/core/base64.h) or a
 * list, then a match over a small fragment index holding two chunks of
 * the namespace {"m", 1, ""}.  Besides "no crash, no sanitizer report":
 * a refused body has a reason and no tokens; an accepted one decodes the
 * same twice, and every match lies inside the query (cur_st + chunk <=
 * tokens), ascending, one per chunk hash, its stored position one of the
 * index's. */
#include "check.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord_blend.h"

#define CHUNK 4

static coordinator_blend *index_of_two(void)
{
    coordinator_blend_opts o = {.chunk_size = CHUNK, .probe_stride = 1, .max_chunks = 8};
    coordinator_blend *b = coordinator_blend_new(&o);
    CHECK(b);
    coordinator_blend_ns ns = {"m", "", 1, 0, 1};
    const uint32_t a[CHUNK] = {1, 2, 3, 4}, c[CHUNK] = {65, 66, 67, 68};
    const uint8_t ha[32] = {1}, hc[32] = {2};
    CHECK(coordinator_blend_add(b, &ns, ha, sizeof ha, a, 4) == COORD_BLEND_ADDED);
    CHECK(coordinator_blend_add(b, &ns, hc, sizeof hc, c, 8) == COORD_BLEND_ADDED);
    return b;
}

static void check_matches(const coordinator_blend_hit *h, size_t n, size_t n_tokens)
{
    for (size_t i = 0; i < n; i++) {
        CHECK(h[i].cur_st + CHUNK <= n_tokens);
        CHECK(h[i].old_st == 4 || h[i].old_st == 8);
        CHECK(i == 0 || h[i - 1].cur_st <= h[i].cur_st);
        for (size_t j = 0; j < i; j++)
            CHECK(memcmp(h[i].hash, h[j].hash, h[i].hash_len) != 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, len, 0, &jerr);
    coordinator_blend_ns ns;
    uint32_t *tokens = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    char why[200] = "";
    if (coordinator_blend_parse_query(body, &ns, &tokens, &n, why, sizeof why) != 0) {
        CHECK(why[0] != '\0' && !tokens);
        json_decref(body);
        return 0;
    }
    CHECK(coordinator_blend_parse_query(body, &ns, &again, &n2, why, sizeof why) == 0);
    CHECK(n2 == n && (n == 0 || memcmp(tokens, again, n * sizeof *tokens) == 0));
    coordinator_blend *b = index_of_two();
    coordinator_blend_hit *hits = NULL;
    size_t n_hits = 0;
    if (coordinator_blend_match(b, &ns, tokens, n, &hits, &n_hits) == 0)
        check_matches(hits, n_hits, n);
    free(hits);
    coordinator_blend_free(b);
    free(tokens);
    free(again);
    json_decref(body);
    return 0;
}
