/* Allocation failures in the modules' shared services (docs/testing.md):
 * the layout registry and the request-session table, whose cached hash
 * chains a LOOKUP and the stores of a growing prompt build on.  A failure
 * must leave no half-registered layout and no session whose cached chain
 * disagrees with hashing the tokens directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fault.h"
#include "hash/token_hash.h"
#include "modules/services/layout_registry.h"
#include "modules/services/sessions.h"

#define CS 4
#define N_TOKENS 64

static int layouts(void *arg)
{
    (void)arg;
    lmc_layout_registry *r = lmc_layout_registry_new();
    if (!r)
        return LMC_FAULT_ERROR;
    lmc_layout a, got;
    char err[128];
    lmc_layout_build(&a, 16, 2, 8, "float16", 7, false, err, sizeof err);
    int rc = LMC_FAULT_OK;
    const char *models[] = {"org/a", "org/b", "org/c"};
    for (int i = 0; i < 3 && rc == LMC_FAULT_OK; i++) {
        if (lmc_layout_registry_acquire(r, models[i], 2, &a) != 0)
            rc = lmc_layout_registry_get(r, models[i], strlen(models[i]), 2, NULL)
                     ? lmc_fault_violation("a failed acquire left %s registered", models[i])
                     : LMC_FAULT_ERROR;
    }
    if (rc == LMC_FAULT_OK && !lmc_layout_registry_get(r, "org/b", 5, 2, &got))
        rc = lmc_fault_violation("an acquired layout is not found");
    json_t *j = rc == LMC_FAULT_OK ? lmc_layout_registry_to_json(r) : NULL;
    if (rc == LMC_FAULT_OK && !j)
        rc = LMC_FAULT_ERROR;
    else if (j && json_array_size(j) != 3)
        rc = lmc_fault_violation("to_json listed %zu of 3 layouts", json_array_size(j));
    json_decref(j);
    lmc_layout_registry_free(r);
    return rc;
}

typedef struct {
    lmc_token_hasher *hasher;
    uint64_t tokens[N_TOKENS];
    uint8_t direct[N_TOKENS / CS * LMC_TOKEN_HASH_LEN];
} sessions_fixture;

/* A LOOKUP's session (created, hashed), a store's hash range through
 * another request's session, an END_SESSION. */
static int sessions(void *arg)
{
    sessions_fixture *f = arg;
    lmc_sessions_options o = {.max_sessions = 2, .hasher = f->hasher};
    lmc_sessions *s = lmc_sessions_new(&o);
    if (!s)
        return LMC_FAULT_ERROR;
    int rc = LMC_FAULT_OK;
    lmc_session *se = lmc_sessions_acquire(s, "lookup", 6, true);
    if (!se) {
        rc = LMC_FAULT_ERROR;
    } else {
        const uint8_t *h;
        int hr = lmc_session_hashes(se, f->tokens, N_TOKENS, 0, N_TOKENS, &h);
        if (hr == LMC_HASH_ENOMEM)
            rc = LMC_FAULT_ERROR;
        else if (hr != LMC_HASH_OK || memcmp(h, f->direct, sizeof f->direct) != 0)
            rc = lmc_fault_violation("session hashes differ from direct hashing");
        lmc_sessions_release(s, se);
    }
    uint8_t part[8 * LMC_TOKEN_HASH_LEN];
    for (int i = 0; i < 3 && rc == LMC_FAULT_OK; i++) {   /* stores of a growing prompt */
        size_t start = (size_t)i * 4 * CS, end = start + 8 * CS;
        int hr = lmc_sessions_hash_range(s, "store", 5, f->tokens, N_TOKENS, start, end, part);
        if (hr == LMC_HASH_ENOMEM)
            rc = LMC_FAULT_ERROR;
        else if (hr != LMC_HASH_OK ||
                 memcmp(part, f->direct + start / CS * LMC_TOKEN_HASH_LEN, sizeof part) != 0)
            rc = lmc_fault_violation("a store's hash range differs from direct hashing");
    }
    if ((se = lmc_sessions_remove(s, "lookup", 6)) != NULL)
        lmc_sessions_release(s, se);
    lmc_sessions_free(s);
    return rc;
}

static void test_layouts(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("modules.layouts", layouts, NULL, NULL, 0), 0);
}

static void test_sessions(void **state)
{
    (void)state;
    sessions_fixture f;
    assert_int_equal(lmc_token_hasher_new("blake3", CS, NULL, &f.hasher, NULL, 0), 0);
    for (int i = 0; i < N_TOKENS; i++)
        f.tokens[i] = (uint64_t)i * 7919u % 50000u;
    assert_int_equal(lmc_hash_chunks(f.hasher, f.tokens, N_TOKENS, 0, N_TOKENS, f.direct), 0);
    assert_int_equal(lmc_fault_run("modules.sessions", sessions, &f, NULL, 0), 0);
    lmc_token_hasher_free(f.hasher);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_sessions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
