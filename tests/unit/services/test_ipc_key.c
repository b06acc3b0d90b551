/* IPCCacheServerKey decoding/validation and ObjectKey resolution order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "modules/services/ipc_key.h"
#include "rpc/wire.h"

#define CS 4

typedef struct {
    const char *model, *rid, *salt;
    int64_t world_size, worker_id, start, end, readers;
    bool worker_none, omit_worker, omit_salt, bool_start;
    uint64_t bad_token;   /* appended when non-zero */
    size_t n_tokens;
} key_spec;

static void pack_str(msgpack_packer *pk, const char *s)
{
    lmc_mp_pack_cstr(pk, s);
}

/* Packs a key map; fields in the newest client's order plus an unknown one. */
static void pack_key(msgpack_sbuffer *sb, const key_spec *k)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 10 - k->omit_worker - k->omit_salt);
    pack_str(&pk, "model_name"), pack_str(&pk, k->model);
    pack_str(&pk, "world_size"), msgpack_pack_int64(&pk, k->world_size);
    if (!k->omit_worker) {
        pack_str(&pk, "worker_id");
        k->worker_none ? msgpack_pack_nil(&pk) : msgpack_pack_int64(&pk, k->worker_id);
    }
    pack_str(&pk, "token_ids");
    msgpack_pack_array(&pk, k->n_tokens + (k->bad_token != 0));
    for (size_t i = 0; i < k->n_tokens; i++)
        msgpack_pack_uint64(&pk, i + 1);
    if (k->bad_token)
        msgpack_pack_uint64(&pk, k->bad_token);
    pack_str(&pk, "start");
    k->bool_start ? msgpack_pack_true(&pk) : msgpack_pack_int64(&pk, k->start);
    pack_str(&pk, "end"), msgpack_pack_int64(&pk, k->end);
    pack_str(&pk, "request_id"), pack_str(&pk, k->rid);
    if (!k->omit_salt)
        pack_str(&pk, "cache_salt"), pack_str(&pk, k->salt);
    pack_str(&pk, "num_kv_readers"), msgpack_pack_int64(&pk, k->readers);
    pack_str(&pk, "future_field"), msgpack_pack_array(&pk, 0);
}

static int decode(const key_spec *k, lmc_ipc_key *out)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_key(&sb, k);
    char err[256];
    int rc = lmc_ipc_key_decode_frame((const uint8_t *)sb.data, sb.size, CS, out, err, sizeof err);
    msgpack_sbuffer_destroy(&sb);   /* strings borrowed: only lengths checked below */
    return rc;
}

static key_spec valid(void)
{
    return (key_spec){.model = "m", .rid = "r1", .salt = "", .world_size = 2, .worker_none = true,
                      .start = 0, .end = 8, .n_tokens = 10};
}

static void test_valid_key(void **st)
{
    (void)st;
    key_spec s = valid();
    lmc_ipc_key k;
    assert_int_equal(decode(&s, &k), 0);
    assert_false(k.has_worker);
    assert_int_equal(k.world_size, 2);
    assert_int_equal(k.n_tokens, 10);
    assert_int_equal(k.tokens[9], 10);
    assert_int_equal(k.num_kv_readers, 1);   /* 0 means 1 */
    assert_int_equal(lmc_ipc_key_num_chunks(&k, CS), 2);
    lmc_ipc_key_free(&k);
    s.worker_none = false, s.worker_id = 1, s.readers = 3, s.omit_salt = true;
    assert_int_equal(decode(&s, &k), 0);
    assert_true(k.has_worker);
    assert_int_equal(k.worker_id, 1);
    assert_int_equal(k.num_kv_readers, 3);
    assert_int_equal(k.salt_len, 0);
    lmc_ipc_key_free(&k);
}

static void expect_invalid(key_spec s)
{
    lmc_ipc_key k;
    assert_int_equal(decode(&s, &k), -1);
}

static void test_invalid_keys(void **st)
{
    (void)st;
    key_spec s;
    s = valid(), s.start = 1, expect_invalid(s);          /* unaligned start */
    s = valid(), s.end = 6, expect_invalid(s);            /* unaligned end */
    s = valid(), s.start = 8, s.end = 4, expect_invalid(s);
    s = valid(), s.end = 12, expect_invalid(s);           /* beyond the tokens */
    s = valid(), s.start = -4, expect_invalid(s);
    s = valid(), s.bad_token = 1ULL << 32, expect_invalid(s);
    s = valid(), s.model = "", expect_invalid(s);
    s = valid(), s.model = "a@b", expect_invalid(s);
    s = valid(), s.salt = "x/y", expect_invalid(s);
    s = valid(), s.world_size = 0, expect_invalid(s);
    s = valid(), s.world_size = 256, expect_invalid(s);
    s = valid(), s.worker_none = false, s.worker_id = 2, expect_invalid(s);
    s = valid(), s.worker_none = false, s.worker_id = -1, expect_invalid(s);
    s = valid(), s.omit_worker = true, expect_invalid(s); /* required, may be None */
    s = valid(), s.bool_start = true, expect_invalid(s);
    s = valid(), s.readers = -1, expect_invalid(s);
    lmc_ipc_key k;
    /* issue 17: lengths a client could otherwise make the server keep */
    char name[LMC_REQUEST_ID_MAX + 2];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    s = valid(), s.model = name + sizeof name - 2 - LMC_MODEL_NAME_MAX, expect_invalid(s);
    s.model = name + sizeof name - 1 - LMC_MODEL_NAME_MAX;          /* 256 bytes */
    assert_int_equal(decode(&s, &k), 0);
    lmc_ipc_key_free(&k);
    s = valid(), s.salt = name + sizeof name - 2 - LMC_CACHE_SALT_MAX, expect_invalid(s);
    s = valid(), s.rid = name, expect_invalid(s);                   /* 1025 bytes */
    s.rid = name + 1;
    assert_int_equal(decode(&s, &k), 0);
    lmc_ipc_key_free(&k);
    char err[64];
    assert_int_equal(lmc_ipc_key_decode_frame((const uint8_t *)"\xc0", 1, CS, &k, err, sizeof err),
                     -1);
    /* truncated map, trailing bytes, non-str field name, hostile lengths */
    static const char *bad[] = {"\x81", "\x80\x00", "\x81\x01\x02", "\x81\xa1x\xdd\xff\xff\xff\xff",
                                "\xdf\xff\xff\xff\xff"};
    static const size_t bad_len[] = {1, 2, 3, 8, 5};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(lmc_ipc_key_decode_frame((const uint8_t *)bad[i], bad_len[i], CS, &k,
                                                  err, sizeof err), -1);
}

/* issue 17: a token count past LMC_KEY_MAX_TOKENS is refused before any
 * memory is taken for it, however many bytes follow. */
static void test_token_count_bound(void **st)
{
    (void)st;
    size_t n = LMC_KEY_MAX_TOKENS + 1;
    static const char head[] = "\x81\xa9token_ids\xdd";
    size_t len = sizeof head - 1 + 4 + n;
    uint8_t *frame = calloc(1, len);
    assert_non_null(frame);
    memcpy(frame, head, sizeof head - 1);
    for (int i = 0; i < 4; i++)
        frame[sizeof head - 1 + (size_t)i] = (uint8_t)(n >> (24 - 8 * i));
    lmc_ipc_key k;
    char err[128];
    assert_int_equal(lmc_ipc_key_decode_frame(frame, len, CS, &k, err, sizeof err), -1);
    assert_non_null(strstr(err, "at most 16777216 token ids"));
    /* one fewer passes the count (and fails later: no other field) */
    n--;
    for (int i = 0; i < 4; i++)
        frame[sizeof head - 1 + (size_t)i] = (uint8_t)(n >> (24 - 8 * i));
    assert_int_equal(lmc_ipc_key_decode_frame(frame, len - 1, CS, &k, err, sizeof err), -1);
    assert_null(strstr(err, "token ids"));
    free(frame);
}

static void test_resolution_order(void **st)
{
    (void)st;
    lmc_ipc_key k = {.model_name = "m", .model_len = 1, .world_size = 2, .cache_salt = "s",
                     .salt_len = 1};
    uint8_t hashes[2 * LMC_TOKEN_HASH_LEN];
    for (size_t i = 0; i < sizeof hashes; i++)
        hashes[i] = (uint8_t)(i / LMC_TOKEN_HASH_LEN + 1);
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key keys[8];
    assert_int_equal(lmc_ipc_key_object_keys(&k, hashes, 2, 2, in, keys), 0);
    /* chunk -> group -> rank */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(keys[i].chunk_hash[0], i / 4 + 1);
        assert_int_equal(keys[i].object_group_id, (i / 2) % 2);
        assert_int_equal(keys[i].kv_rank, lmc_kv_rank_for_worker(2, (uint32_t)(i % 2)));
        assert_string_equal(keys[i].cache_salt, "s");
    }
    assert_int_equal(keys[1].kv_rank, 0x02010201u);
    k.has_worker = true, k.worker_id = 1;
    assert_int_equal(lmc_ipc_key_object_keys(&k, hashes, 2, 1, in, keys), 0);
    assert_int_equal(keys[0].kv_rank, 0x02010201u);
    assert_int_equal(keys[1].chunk_hash[0], 2);
    assert_ptr_equal(keys[0].model_name, lmc_intern(in, "m", 1));
    /* issue 17: the find-only form takes interned names and interns none */
    lmc_object_key found[2];
    assert_int_equal(lmc_ipc_key_object_keys_find(&k, hashes, 2, 1, in, found), 0);
    for (int i = 0; i < 2; i++) {
        assert_true(lmc_object_key_equal(&found[i], &keys[i]));
        assert_ptr_equal(found[i].model_name, keys[i].model_name);
        assert_ptr_equal(found[i].cache_salt, keys[i].cache_salt);
    }
    size_t before = lmc_key_interner_count(in);
    k.cache_salt = "new-salt", k.salt_len = 8;
    found[0].kv_rank = 77;
    assert_int_equal(lmc_ipc_key_object_keys_find(&k, hashes, 2, 1, in, found), 1);
    assert_int_equal(found[0].kv_rank, 77);           /* untouched */
    k.model_name = "never", k.model_len = 5, k.cache_salt = "s", k.salt_len = 1;
    assert_int_equal(lmc_ipc_key_object_keys_find(&k, hashes, 2, 1, in, found), 1);
    assert_int_equal(lmc_key_interner_count(in), before);
    lmc_key_interner_free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_key),
        cmocka_unit_test(test_invalid_keys),
        cmocka_unit_test(test_token_count_bound),
        cmocka_unit_test(test_resolution_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
