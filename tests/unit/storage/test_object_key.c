/* ObjectKey: text forms (docs/hashing.md, "Object keys"), validation, interning. */
#include "storage/object_key.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char HASH_HEX[] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

static lmc_object_key known_key(lmc_key_interner *in, const char *model, const char *salt)
{
    lmc_object_key k = {0};
    for (int i = 0; i < 32; i++)
        k.chunk_hash[i] = (uint8_t)i;
    k.chunk_hash_len = 32;
    k.kv_rank = lmc_kv_rank_pack(4, 1, 4, 1);
    k.object_group_id = 0x1a;
    k.model_name = lmc_intern(in, model, strlen(model));
    k.cache_salt = lmc_intern(in, salt, strlen(salt));
    return k;
}

static void test_known_strings(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key k = known_key(in, "meta-llama/Llama-3-8B", "");
    char buf[512], want[512];
    snprintf(want, sizeof want, "meta-llama/Llama-3-8B@04010401@1a@%s", HASH_HEX);
    assert_int_equal(lmc_object_key_to_string(&k, buf, sizeof buf), strlen(want));
    assert_string_equal(buf, want);
    snprintf(want, sizeof want, "meta-llama-SEP-Llama-3-8B@0x04010401@1a@%s.data", HASH_HEX);
    assert_int_equal(lmc_object_key_to_filename(&k, buf, sizeof buf), strlen(want));
    assert_string_equal(buf, want);

    k = known_key(in, "m", "tenant-A");
    k.object_group_id = 0;
    k.kv_rank = 0;
    snprintf(want, sizeof want, "m@00000000@0@%s@tenant-A", HASH_HEX);
    assert_true(lmc_object_key_to_string(&k, buf, sizeof buf) > 0);
    assert_string_equal(buf, want);
    snprintf(want, sizeof want, "m@0x00000000@0@%s@tenant-A.data", HASH_HEX);
    assert_true(lmc_object_key_to_filename(&k, buf, sizeof buf) > 0);
    assert_string_equal(buf, want);
    assert_true(lmc_object_key_text_cap(&k) >= strlen(want) + 1);
    lmc_key_interner_free(in);
}

static void test_parse_known(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key want = known_key(in, "org/sub/model", "s1"), got;
    char text[512];
    snprintf(text, sizeof text, "org-SEP-sub-SEP-model@0x04010401@1a@%s@s1.data", HASH_HEX);
    assert_int_equal(lmc_object_key_parse_filename(in, text, &got), 0);
    assert_true(lmc_object_key_equal(&got, &want));
    assert_ptr_equal(got.model_name, want.model_name);
    assert_ptr_equal(got.cache_salt, want.cache_salt);
    snprintf(text, sizeof text, "org/sub/model@04010401@1a@%s@s1", HASH_HEX);
    assert_int_equal(lmc_object_key_parse_string(in, text, &got), 0);
    assert_true(lmc_object_key_equal(&got, &want));
    /* Short hashes and the largest group id. */
    assert_int_equal(lmc_object_key_parse_string(in, "x@ffffffff@ffffffff@ab", &got), 0);
    assert_int_equal(got.chunk_hash_len, 1);
    assert_int_equal(got.chunk_hash[0], 0xab);
    assert_int_equal(got.kv_rank, 0xffffffffu);
    assert_int_equal(got.object_group_id, 0xffffffffu);
    assert_string_equal(got.cache_salt, "");
    lmc_key_interner_free(in);
}

static void test_cap_too_small(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key k = known_key(in, "a/b", "salt");
    char buf[256];
    int n = lmc_object_key_to_string(&k, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(lmc_object_key_to_string(&k, buf, (size_t)n + 1), n);
    assert_int_equal(lmc_object_key_to_string(&k, buf, (size_t)n), -1);
    assert_int_equal(lmc_object_key_to_string(&k, buf, 2), -1);
    n = lmc_object_key_to_filename(&k, buf, sizeof buf);
    assert_int_equal(lmc_object_key_to_filename(&k, buf, (size_t)n + 1), n);
    assert_int_equal(lmc_object_key_to_filename(&k, buf, (size_t)n), -1);
    assert_int_equal(lmc_object_key_to_filename(&k, buf, 4), -1);
    lmc_key_interner_free(in);
}

static void test_kv_rank_packing(void **state)
{
    (void)state;
    assert_int_equal(lmc_kv_rank_pack(8, 3, 8, 3), 0x08030803u);
    assert_int_equal(lmc_kv_rank_pack(0x12, 0x34, 0x56, 0x78), 0x12345678u);
    assert_int_equal(lmc_kv_rank_pack(0x1ff, 0, 0, 0), 0xff000000u);
    assert_int_equal(lmc_kv_rank_for_worker(2, 1), 0x02010201u);
    assert_int_equal(lmc_kv_rank_for_worker(1, 0), 0x01000100u);
}

static void test_validation(void **state)
{
    (void)state;
    assert_true(lmc_model_name_valid("a", 1));
    assert_true(lmc_model_name_valid("org/model-1.5", 13));
    assert_false(lmc_model_name_valid("", 0));
    assert_false(lmc_model_name_valid("a@b", 3));
    assert_false(lmc_model_name_valid("a\0b", 3));
    /* issue 17: a length bound, stated in the error texts as text */
    char model[LMC_MODEL_NAME_MAX + 1];
    memset(model, 'm', sizeof model);
    assert_true(lmc_model_name_valid(model, LMC_MODEL_NAME_MAX));
    assert_false(lmc_model_name_valid(model, LMC_MODEL_NAME_MAX + 1));
    assert_int_equal(atoi(LMC_MODEL_NAME_MAX_TEXT), LMC_MODEL_NAME_MAX);
    assert_int_equal(atoi(LMC_CACHE_SALT_MAX_TEXT), LMC_CACHE_SALT_MAX);
    char salt[LMC_CACHE_SALT_MAX + 1];
    memset(salt, 'x', sizeof salt);
    assert_true(lmc_cache_salt_valid("", 0));
    assert_true(lmc_cache_salt_valid(salt, LMC_CACHE_SALT_MAX));
    assert_false(lmc_cache_salt_valid(salt, LMC_CACHE_SALT_MAX + 1));
    assert_false(lmc_cache_salt_valid("a@b", 3));
    assert_false(lmc_cache_salt_valid("a/b", 3));
    assert_false(lmc_cache_salt_valid("a\\b", 3));
    assert_false(lmc_cache_salt_valid("a\0b", 3));
}

static const char *const BAD_STRINGS[] = {
    "m@00000000@0",                        /* 3 fields */
    "m@00000000@0@ab@s@t",                 /* 6 fields */
    "@00000000@0@ab",                      /* empty model */
    "m@0000000@0@ab",                      /* rank 7 digits */
    "m@000000000@0@ab",                    /* rank 9 digits */
    "m@0x000000@0@ab",                     /* 0x in the string form */
    "m@0000000G@0@ab",                     /* bad hex */
    "m@0000000A@0@ab",                     /* uppercase */
    "m@00000000@@ab",                      /* empty group */
    "m@00000000@01@ab",                    /* leading zero group */
    "m@00000000@100000000@ab",             /* group > u32 */
    "m@00000000@0@abc",                    /* odd-length hash */
    "m@00000000@0@",                       /* empty hash */
    "m@00000000@0@AB",                     /* uppercase hash */
    "m@00000000@0@zz",                     /* bad hash hex */
    "m@00000000@0@ab@",                    /* empty salt field */
    "m@00000000@0@ab@a\\b",                /* backslash in salt */
    "m@00000000@0@ab@a/b",                 /* slash in salt */
    "m@00000000@0@ab@s.data.x@",           /* 6 fields */
    "m@00000000@0@"                        /* 33-byte hash */
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20",
    "",
};

static const char *const BAD_FILENAMES[] = {
    "m@0x00000000@0@ab",                   /* no .data */
    "m@0x00000000@0@ab.dat",               /* wrong suffix */
    "m@00000000@0@ab.data",                /* no 0x */
    "m@0X00000000@0@ab.data",              /* 0X */
    "m@0x0000000@0@ab.data",               /* 7 digits */
    "m@0x00000000@0.data",                 /* 3 fields */
    "m@0x00000000@0@ab@s@t.data",          /* 6 fields */
    "a/b@0x00000000@0@ab.data",            /* literal slash */
    "-SEP-@0x00000000@0@ab.data",          /* fine: model "/" (not bad) */
    "@0x00000000@0@ab.data",               /* empty model */
    "m@0x00000000@0@abc.data",             /* odd hash */
    "m@0x00000000@0@ab@.data",             /* empty salt */
    ".data",
    "m@0x00000000@0@ab.data.tmp",          /* temp file */
};

static void test_rejects(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key k;
    for (size_t i = 0; i < sizeof BAD_STRINGS / sizeof BAD_STRINGS[0]; i++) {
        if (lmc_object_key_parse_string(in, BAD_STRINGS[i], &k) != -1)
            fail_msg("accepted string '%s'", BAD_STRINGS[i]);
    }
    for (size_t i = 0; i < sizeof BAD_FILENAMES / sizeof BAD_FILENAMES[0]; i++) {
        int want = strncmp(BAD_FILENAMES[i], "-SEP-@", 6) == 0 ? 0 : -1;
        if (lmc_object_key_parse_filename(in, BAD_FILENAMES[i], &k) != want)
            fail_msg("filename '%s': expected %d", BAD_FILENAMES[i], want);
    }
    assert_int_equal(lmc_object_key_parse_filename(in, "-SEP-@0x00000000@0@ab.data", &k), 0);
    assert_string_equal(k.model_name, "/");
    /* Salt length limit: 128 accepted, 129 rejected. */
    char text[300];
    int n = snprintf(text, sizeof text, "m@00000000@0@ab@");
    memset(text + n, 's', 129);
    text[n + 129] = '\0';
    assert_int_equal(lmc_object_key_parse_string(in, text, &k), -1);
    text[n + 128] = '\0';
    assert_int_equal(lmc_object_key_parse_string(in, text, &k), 0);
    assert_int_equal(strlen(k.cache_salt), 128);
    lmc_key_interner_free(in);
}

/* ---- random round trips ------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void random_str(uint64_t *seed, const char *alphabet, size_t min, size_t max, char *out)
{
    size_t n = min + rng_next(seed) % (max - min + 1), al = strlen(alphabet);
    for (size_t i = 0; i < n; i++)
        out[i] = alphabet[rng_next(seed) % al];
    out[n] = '\0';
}

static lmc_object_key random_key(lmc_key_interner *in, uint64_t *seed)
{
    /* Model names use '/', '-', 'S', 'E', 'P' often, but a generated
     * "-SEP-" would be lossy in the fs form (documented), so retry then. */
    char model[64], salt[LMC_CACHE_SALT_MAX + 1];
    do
        random_str(seed, "ab/-SEP._:0z", 1, 40, model);
    while (strstr(model, "-SEP-"));
    if (rng_next(seed) % 3 == 0)
        salt[0] = '\0';
    else
        random_str(seed, "abcXYZ019-_.:+= ~", 1, LMC_CACHE_SALT_MAX, salt);
    lmc_object_key k = {0};
    k.chunk_hash_len = (uint8_t)(1 + rng_next(seed) % LMC_CHUNK_HASH_MAX);
    for (int i = 0; i < k.chunk_hash_len; i++)
        k.chunk_hash[i] = (uint8_t)rng_next(seed);
    k.kv_rank = (uint32_t)rng_next(seed);
    k.object_group_id = (uint32_t)(rng_next(seed) >> (rng_next(seed) % 33));
    k.model_name = lmc_intern(in, model, strlen(model));
    k.cache_salt = lmc_intern(in, salt, strlen(salt));
    return k;
}

typedef int (*print_fn)(const lmc_object_key *, char *, size_t);
typedef int (*parse_fn)(lmc_key_interner *, const char *, lmc_object_key *);

static void round_trip(lmc_key_interner *in, const lmc_object_key *k, print_fn print,
                       parse_fn parse)
{
    char text[1024], again[1024];
    lmc_object_key got;
    int n = print(k, text, sizeof text);
    assert_true(n > 0 && (size_t)n < lmc_object_key_text_cap(k));
    if (parse(in, text, &got) != 0)
        fail_msg("did not parse back: '%s'", text);
    assert_true(lmc_object_key_equal(&got, k));
    assert_ptr_equal(got.model_name, k->model_name);
    assert_ptr_equal(got.cache_salt, k->cache_salt);
    assert_int_equal(print(&got, again, sizeof again), n);
    assert_string_equal(again, text);
}

static void test_random_round_trips(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    uint64_t seed = 0xfeedface;
    for (int i = 0; i < 2000; i++) {
        lmc_object_key k = random_key(in, &seed);
        round_trip(in, &k, lmc_object_key_to_string, lmc_object_key_parse_string);
        round_trip(in, &k, lmc_object_key_to_filename, lmc_object_key_parse_filename);
    }
    lmc_key_interner_free(in);
}

static void test_sep_in_model_is_lossy(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_object_key k = known_key(in, "a-SEP-b", ""), got;
    char name[256], again[256];
    assert_true(lmc_object_key_to_filename(&k, name, sizeof name) > 0);
    assert_int_equal(lmc_object_key_parse_filename(in, name, &got), 0);
    assert_string_equal(got.model_name, "a/b");
    /* ...but the filename itself still round-trips exactly. */
    assert_true(lmc_object_key_to_filename(&got, again, sizeof again) > 0);
    assert_string_equal(again, name);
    lmc_key_interner_free(in);
}

/* ---- interning ---------------------------------------------------------- */

static void test_intern_identity(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    const char *a = lmc_intern(in, "model-a", 7);
    const char *b = lmc_intern(in, "model-b", 7);
    assert_ptr_not_equal(a, b);
    assert_ptr_equal(lmc_intern(in, "model-a", 7), a);
    /* Length-delimited input, no NUL needed; prefixes are distinct. */
    const char *ab = lmc_intern(in, "model-abc", 7);
    assert_ptr_equal(ab, a);
    assert_string_equal(ab, "model-a");
    assert_ptr_not_equal(lmc_intern(in, "model-abc", 9), a);
    const char *empty = lmc_intern(in, "", 0);
    assert_string_equal(empty, "");
    assert_ptr_equal(lmc_intern(in, "x", 0), empty);
    /* Pointers survive table growth. */
    char buf[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(buf, sizeof buf, "s%d", i);
        assert_non_null(lmc_intern(in, buf, (size_t)n));
    }
    assert_ptr_equal(lmc_intern(in, "model-a", 7), a);
    assert_ptr_equal(lmc_intern(in, "model-b", 7), b);
    assert_ptr_equal(lmc_intern(in, "s17", 3), lmc_intern(in, "s17", 3));
    lmc_key_interner_free(in);
}


/* issue 17: a query looks a string up without interning it, and a bounded
 * interner refuses new strings at its maximum while still finding (and
 * re-interning) the ones it holds. */
static void test_intern_find_only_and_bound(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new_bounded(3);
    assert_null(lmc_intern_find(in, "m", 1));
    assert_int_equal(lmc_key_interner_count(in), 0);
    const char *m = lmc_intern(in, "m", 1);
    assert_ptr_equal(lmc_intern_find(in, "mx", 1), m);   /* length-delimited */
    assert_null(lmc_intern_find(in, "mx", 2));
    assert_int_equal(lmc_key_interner_count(in), 1);
    const char *salt = lmc_intern(in, "", 0);
    assert_ptr_equal(lmc_intern_find(in, "", 0), salt);
    assert_non_null(lmc_intern(in, "s1", 2));
    assert_true(lmc_key_interner_full(in));
    assert_null(lmc_intern(in, "s2", 2));          /* refused, counted */
    assert_null(lmc_intern(in, "s3", 2));
    assert_int_equal(lmc_key_interner_refused(in), 2);
    assert_null(lmc_intern_find(in, "s2", 2));
    assert_ptr_equal(lmc_intern(in, "m", 1), m);    /* held ones still come back */
    assert_int_equal(lmc_key_interner_count(in), 3);
    assert_int_equal(lmc_key_interner_refused(in), 2);
    lmc_key_interner_free(in);
    /* 100k lookups of unknown names leave an interner as they found it */
    in = lmc_key_interner_new();
    char buf[32];
    for (int i = 0; i < 100000; i++) {
        int n = snprintf(buf, sizeof buf, "salt-%d", i);
        assert_null(lmc_intern_find(in, buf, (size_t)n));
    }
    assert_int_equal(lmc_key_interner_count(in), 0);
    assert_false(lmc_key_interner_full(in));
    lmc_key_interner_free(in);
}

/* issue 17: a full bounded interner evicts the strings nothing references
 * (no caller's reference, no key holding one) and refuses only when every
 * string it holds is in use. */
static void test_full_interner_evicts_unreferenced(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new_bounded(3);
    const char *m = lmc_intern(in, "model", 5);
    const char *salt = lmc_intern(in, "keep", 4);
    lmc_object_key k = {.chunk_hash_len = 1};
    lmc_object_key_set_strings(&k, m, salt);   /* k takes both references */
    lmc_object_key copies[4] = {k, k, k, k};
    lmc_keys_hold(copies, 4);                  /* four more keys name them */
    lmc_keys_drop(&k, 1);                      /* the first key goes */
    const char *gone = lmc_intern(in, "gone", 4);
    assert_non_null(gone);
    lmc_intern_release(gone);                  /* nothing names "gone" now */
    assert_int_equal(lmc_key_interner_count(in), 3);
    /* Full: the unreferenced "gone" makes room; the held two stay. */
    const char *fresh = lmc_intern(in, "fresh", 5);
    assert_non_null(fresh);
    assert_int_equal(lmc_key_interner_evicted(in), 1);
    assert_int_equal(lmc_key_interner_refused(in), 0);
    assert_null(lmc_intern_find(in, "gone", 4));
    const char *again = lmc_intern_find(in, "model", 5);
    assert_ptr_equal(again, m);
    lmc_intern_release(again);
    assert_string_equal(copies[3].cache_salt, "keep");
    /* Every string in use: a new one is refused, nothing is evicted. */
    assert_null(lmc_intern(in, "new", 3));
    assert_int_equal(lmc_key_interner_refused(in), 1);
    assert_int_equal(lmc_key_interner_evicted(in), 1);
    /* Keys that never came from an interner hold nothing. */
    lmc_object_key plain = {.model_name = "literal", .cache_salt = ""};
    lmc_keys_hold(&plain, 1);
    lmc_keys_drop(&plain, 1);
    /* The last copies go: both names become evictable, "fresh" too. */
    lmc_keys_drop(copies, 4);
    lmc_intern_release(fresh);
    assert_non_null(lmc_intern(in, "new", 3));
    assert_int_equal(lmc_key_interner_evicted(in), 4);
    assert_int_equal(lmc_key_interner_count(in), 1);
    assert_null(lmc_intern_find(in, "model", 5));
    lmc_key_interner_free(in);
}

/* Threads intern, copy, hold and drop keys of a few hot names and many
 * passing ones through a small interner: a held name never changes or
 * disappears under its keys (ASan and TSan watch the frees). */
#define EVICT_THREADS 4
#define EVICT_ROUNDS 20000

static void *evict_worker(void *arg)
{
    lmc_key_interner *in = arg;
    char buf[32];
    uint64_t seed = (uint64_t)(uintptr_t)&buf;
    for (int r = 0; r < EVICT_ROUNDS; r++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        bool hot = (seed >> 60) < 4;
        int n = hot ? snprintf(buf, sizeof buf, "hot-%d", (int)((seed >> 40) % 4))
                    : snprintf(buf, sizeof buf, "pass-%llu", (unsigned long long)(seed >> 20));
        const char *s = lmc_intern(in, buf, (size_t)n);
        if (!s)
            continue;   /* every slot in use at that moment */
        lmc_object_key k = {.chunk_hash_len = 1};
        lmc_object_key_set_strings(&k, s, lmc_intern(in, "", 0));
        if (!k.cache_salt) {
            lmc_intern_release(s);
            continue;
        }
        lmc_object_key copy = k;
        lmc_keys_hold(&copy, 1);
        lmc_keys_drop(&k, 1);
        if (strcmp(copy.model_name, buf) != 0 || copy.cache_salt[0] != '\0')
            return (void *)1;
        lmc_keys_drop(&copy, 1);
    }
    return NULL;
}

static void test_eviction_under_threads(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new_bounded(16);
    pthread_t t[EVICT_THREADS];
    for (int i = 0; i < EVICT_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, evict_worker, in), 0);
    for (int i = 0; i < EVICT_THREADS; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_null(rc);
    }
    assert_true(lmc_key_interner_count(in) <= 16);
    assert_true(lmc_key_interner_evicted(in) > 0);
    lmc_key_interner_free(in);
}

#define N_THREADS 8
#define N_STRINGS 3000

typedef struct {
    lmc_key_interner *in;
    int id;
    const char *got[N_STRINGS];
} intern_job;

static void *intern_worker(void *arg)
{
    intern_job *job = arg;
    char buf[32];
    /* Each thread walks the same names in a different order. */
    for (int j = 0; j < N_STRINGS; j++) {
        int i = (j * 7 + job->id * 997) % N_STRINGS;
        int n = snprintf(buf, sizeof buf, "name-%d", i);
        job->got[i] = lmc_intern(job->in, buf, (size_t)n);
    }
    return NULL;
}

static void test_intern_concurrent(void **state)
{
    (void)state;
    static intern_job jobs[N_THREADS];
    pthread_t th[N_THREADS];
    lmc_key_interner *in = lmc_key_interner_new();
    for (int t = 0; t < N_THREADS; t++) {
        jobs[t].in = in;
        jobs[t].id = t;
        assert_int_equal(pthread_create(&th[t], NULL, intern_worker, &jobs[t]), 0);
    }
    for (int t = 0; t < N_THREADS; t++)
        pthread_join(th[t], NULL);
    char buf[32];
    for (int i = 0; i < N_STRINGS; i++) {
        snprintf(buf, sizeof buf, "name-%d", i);
        assert_non_null(jobs[0].got[i]);
        assert_string_equal(jobs[0].got[i], buf);
        for (int t = 1; t < N_THREADS; t++)
            assert_ptr_equal(jobs[t].got[i], jobs[0].got[i]);
    }
    lmc_key_interner_free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_strings),
        cmocka_unit_test(test_parse_known),
        cmocka_unit_test(test_cap_too_small),
        cmocka_unit_test(test_kv_rank_packing),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_random_round_trips),
        cmocka_unit_test(test_sep_in_model_is_lossy),
        cmocka_unit_test(test_intern_identity),
        cmocka_unit_test(test_intern_find_only_and_bound),
        cmocka_unit_test(test_full_interner_evicts_unreferenced),
        cmocka_unit_test(test_eviction_under_threads),
        cmocka_unit_test(test_intern_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
