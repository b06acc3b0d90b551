/* Allocation failures in IPCCacheServerKey decoding and resolution
 * (src/modules/services/ipc_key.c): the one-pass frame decoder, a frame that repeats
 * token_ids (two allocations, the first one dropped), and a key resolved
 * into ObjectKeys through a fresh interner. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "alloc_fault.h"
#include "hash/token_hash.h"
#include "modules/services/ipc_key.h"
#include "rpc/wire.h"
#include "storage/object_key.h"

#define CS 16
#define N_TOKENS 320   /* 20 chunks */

typedef struct {
    msgpack_sbuffer once;     /* token_ids given once */
    msgpack_sbuffer twice;    /* token_ids given twice: [1..8], then the real ones */
    lmc_token_hasher *hasher;
} key_fixture;

static void pack_str(msgpack_packer *pk, const char *s)
{
    lmc_mp_pack_cstr(pk, s);
}

static uint64_t token_at(size_t i)
{
    return (uint64_t)(i * 7919u) % 50000u;
}

static void pack_tokens(msgpack_packer *pk, size_t n)
{
    pack_str(pk, "token_ids");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, token_at(i));
}

static void pack_key(msgpack_sbuffer *sb, bool twice)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, twice ? 10 : 9);
    pack_str(&pk, "model_name"), pack_str(&pk, "org/llama");
    pack_str(&pk, "world_size"), msgpack_pack_int(&pk, 4);
    pack_str(&pk, "worker_id"), msgpack_pack_nil(&pk);
    if (twice)
        pack_tokens(&pk, 8);
    pack_tokens(&pk, N_TOKENS);
    pack_str(&pk, "start"), msgpack_pack_int(&pk, 2 * CS);
    pack_str(&pk, "end"), msgpack_pack_int(&pk, N_TOKENS);
    pack_str(&pk, "request_id"), pack_str(&pk, "req-42");
    pack_str(&pk, "cache_salt"), pack_str(&pk, "salty");
    pack_str(&pk, "num_kv_readers"), msgpack_pack_int(&pk, 2);
}

/* Everything a successful decode of pack_key() must give. */
static int check_decoded(const lmc_ipc_key *k)
{
    if (k->model_len != 9 || memcmp(k->model_name, "org/llama", 9) != 0 || k->world_size != 4 ||
        k->has_worker || k->start != 2 * CS || k->end != N_TOKENS || k->request_id_len != 6 ||
        k->salt_len != 5 || memcmp(k->cache_salt, "salty", 5) != 0 || k->num_kv_readers != 2)
        return lmc_fault_violation("decoded key fields are wrong");
    if (!k->tokens || k->n_tokens != N_TOKENS)
        return lmc_fault_violation("decoded %zu tokens, want %d", k->n_tokens, N_TOKENS);
    for (size_t i = 0; i < N_TOKENS; i++)
        if (k->tokens[i] != token_at(i))
            return lmc_fault_violation("token %zu is %llu", i, (unsigned long long)k->tokens[i]);
    return LMC_FAULT_OK;
}

/* A failed decode: -2 with an out-of-memory reason, and nothing to free
 * or use. */
static int check_failed(int rc, const lmc_ipc_key *k, const char *err)
{
    if (!lmc_fault_fired())
        return lmc_fault_violation("decode failed with memory left: %s", err);
    if (rc != -2)
        return lmc_fault_violation("decode returned %d for an allocation failure", rc);
    if (!strstr(err, "out of memory"))
        return lmc_fault_violation("an allocation failure was reported as '%s'", err);
    if (k->tokens || k->n_tokens)
        return lmc_fault_violation("a failed decode left tokens=%p n_tokens=%zu",
                                   (void *)k->tokens, k->n_tokens);
    return LMC_FAULT_ERROR;
}

static int decode(const msgpack_sbuffer *sb)
{
    lmc_ipc_key k;
    char err[256] = "";
    int rc = lmc_ipc_key_decode_frame((const uint8_t *)sb->data, sb->size, CS, &k, err,
                                      sizeof err);
    if (rc != 0)
        return check_failed(rc, &k, err);
    rc = check_decoded(&k);
    lmc_ipc_key_free(&k);
    return rc;
}

static int scenario_decode(void *arg)
{
    return decode(&((key_fixture *)arg)->once);
}

static int scenario_decode_repeated(void *arg)
{
    return decode(&((key_fixture *)arg)->twice);
}

/* Decode, hash, resolve: what a LOOKUP does before it touches the L1. */
static int scenario_object_keys(void *arg)
{
    key_fixture *fx = arg;
    lmc_ipc_key k;
    char err[256] = "";
    int drc = lmc_ipc_key_decode_frame((const uint8_t *)fx->once.data, fx->once.size, CS, &k,
                                       err, sizeof err);
    if (drc != 0)
        return check_failed(drc, &k, err);
    enum { CHUNKS = (N_TOKENS - 2 * CS) / CS, GROUPS = 2, RANKS = 4 };
    uint8_t hashes[CHUNKS * LMC_TOKEN_HASH_LEN];
    int rc = LMC_FAULT_OK;
    int hrc = lmc_hash_chunks(fx->hasher, k.tokens, k.n_tokens, k.start, k.end, hashes);
    if (hrc == LMC_HASH_ENOMEM) {
        rc = lmc_fault_fired() ? LMC_FAULT_ERROR : lmc_fault_violation("ENOMEM with memory left");
        lmc_ipc_key_free(&k);
        return rc;
    }
    if (hrc != LMC_HASH_OK) {
        lmc_ipc_key_free(&k);
        return lmc_fault_violation("hashing failed: %s", lmc_hash_strerror(hrc));
    }
    lmc_key_interner *in = lmc_key_interner_new();
    if (!in) {
        lmc_ipc_key_free(&k);
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("interner_new failed with memory left");
    }
    static lmc_object_key out[CHUNKS * GROUPS * RANKS];
    memset(out, 0xab, sizeof out);
    if (lmc_ipc_key_object_keys(&k, hashes, CHUNKS, GROUPS, in, out) != 0) {
        rc = lmc_fault_fired() ? LMC_FAULT_ERROR
                               : lmc_fault_violation("object_keys failed with memory left");
        /* Nothing half-built: no key was written. */
        for (size_t i = 0; rc == LMC_FAULT_ERROR && i < sizeof out; i++)
            if (((const uint8_t *)out)[i] != 0xab)
                rc = lmc_fault_violation("failed object_keys wrote key %zu",
                                         i / sizeof out[0]);
    } else {
        for (size_t i = 0; i < CHUNKS * GROUPS * RANKS && rc == LMC_FAULT_OK; i++) {
            const lmc_object_key *ok = &out[i];
            size_t c = i / (GROUPS * RANKS), r = i % RANKS;
            if (strcmp(ok->model_name, "org/llama") != 0 || strcmp(ok->cache_salt, "salty") != 0 ||
                ok->object_group_id != (i / RANKS) % GROUPS ||
                ok->kv_rank != lmc_kv_rank_for_worker(4, (uint32_t)r) ||
                memcmp(ok->chunk_hash, hashes + c * LMC_TOKEN_HASH_LEN, LMC_TOKEN_HASH_LEN) != 0)
                rc = lmc_fault_violation("object key %zu is wrong", i);
        }
    }
    lmc_key_interner_free(in);
    lmc_ipc_key_free(&k);
    return rc;
}

/* ---- cmocka ----------------------------------------------------------------- */

static key_fixture g_fx;

static int setup(void **state)
{
    (void)state;
    pack_key(&g_fx.once, false);
    pack_key(&g_fx.twice, true);
    char err[128];
    return lmc_token_hasher_new("blake3", CS, NULL, &g_fx.hasher, err, sizeof err);
}

static int teardown(void **state)
{
    (void)state;
    msgpack_sbuffer_destroy(&g_fx.once);
    msgpack_sbuffer_destroy(&g_fx.twice);
    lmc_token_hasher_free(g_fx.hasher);
    return 0;
}

static void test_decode(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("ipc_key.decode", scenario_decode, &g_fx, NULL, 0), 0);
}

static void test_decode_repeated(void **state)
{
    (void)state;
    assert_int_equal(
        lmc_fault_run("ipc_key.decode_repeated", scenario_decode_repeated, &g_fx, NULL, 0), 0);
}

static void test_object_keys(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("ipc_key.object_keys", scenario_object_keys, &g_fx, NULL, 0),
                     0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_decode_repeated),
        cmocka_unit_test(test_object_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
