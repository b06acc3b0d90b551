/* The trace reader (storage_trace_reader.h, docs/trace.md, "Reading a
 * trace"): what the recorder's encoder writes reads back field for field,
 * and a trace cut short, a corrupted frame or a bad header is refused
 * with the byte offset of the frame at fault; the bounds on what a frame
 * may claim (chunk hashes, names, dtypes, shapes) hold. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "storage/storage_trace_reader.h"

#define QUAL "lmcache.v1.distributed.storage_manager.StorageManager."

static lmc_object_key test_key(lmc_key_interner *in, uint8_t b, const char *salt)
{
    lmc_object_key k = {.chunk_hash_len = 32, .kv_rank = 0x02000200, .object_group_id = 3};
    memset(k.chunk_hash, b, 32);
    lmc_object_key_set_strings(&k, lmc_intern(in, "org/model", 9),
                               lmc_intern(in, salt, strlen(salt)));
    return k;
}

/* header + records into a heap buffer; *len its size, offs[i] frame i's offset. */
static uint8_t *sample(lmc_key_interner *in, size_t *len, size_t offs[4])
{
    lmc_object_key keys[2] = {test_key(in, 1, ""), test_key(in, 2, "tenant")};
    uint8_t *buf = malloc(8192);
    size_t n = lmc_storage_trace_encode_header(buf, 8192, "storage", 1.5, 2.0, "{\"a\":1}");
    offs[0] = n;
    n += lmc_storage_trace_encode_record(buf + n, 8192 - n, 0.25, 3.0,
                                         LMC_STORAGE_TRACE_RESERVE_WRITE, keys, 2, 4096);
    offs[1] = n;
    n += lmc_storage_trace_encode_record(buf + n, 8192 - n, 0.5, 3.5,
                                         LMC_STORAGE_TRACE_FINISH_WRITE, keys, 2, 0);
    offs[2] = n;
    n += lmc_storage_trace_encode_record(buf + n, 8192 - n, 0.75, 4.0,
                                         LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT, keys + 1, 1, 0);
    offs[3] = n;
    *len = n;
    return buf;
}

static char path[] = "/tmp/test_trace_reader_XXXXXX";

static void write_file(const uint8_t *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void test_round_trip(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    size_t len, offs[4];
    uint8_t *data = sample(in, &len, offs);
    write_file(data, len);
    char err[256];
    lmc_trace_reader *r = lmc_trace_reader_open(path, err, sizeof err);
    assert_non_null(r);
    const lmc_trace_header *h = lmc_trace_reader_header(r);
    assert_int_equal(h->format_version, 1);
    assert_int_equal(h->schema_version, 2);
    assert_string_equal(h->level, "storage");
    assert_true(h->t_mono_start == 1.5 && h->t_wall_start == 2.0);
    assert_string_equal(h->sm_config_json, "{\"a\":1}");
    assert_int_equal(strlen(h->sm_config_digest), 64);

    lmc_trace_record rec;
    assert_int_equal(lmc_trace_reader_next(r, &rec, err, sizeof err), 1);
    assert_int_equal(rec.offset, offs[0]);
    assert_int_equal(rec.op, LMC_STORAGE_TRACE_RESERVE_WRITE);
    assert_string_equal(rec.qualname, QUAL "reserve_write");
    assert_true(rec.t_mono == 0.25 && rec.t_wall == 3.0);
    assert_int_equal(rec.n_keys, 2);
    assert_int_equal(rec.object_size, 4096);
    lmc_object_key want = test_key(in, 2, "tenant");
    assert_true(lmc_object_key_equal(&rec.keys[1], &want));
    assert_string_equal(rec.keys[0].cache_salt, "");
    assert_int_equal(rec.frame_len, offs[1] - offs[0] - 4);
    assert_memory_equal(rec.frame, data + offs[0] + 4, rec.frame_len);

    assert_int_equal(lmc_trace_reader_next(r, &rec, err, sizeof err), 1);
    assert_int_equal(rec.op, LMC_STORAGE_TRACE_FINISH_WRITE);
    assert_int_equal(rec.object_size, 0);
    assert_int_equal(lmc_trace_reader_next(r, &rec, err, sizeof err), 1);
    assert_int_equal(rec.op, LMC_STORAGE_TRACE_READ_PREFETCHED_EXIT);
    assert_int_equal(rec.offset, offs[2]);
    assert_int_equal(rec.n_keys, 1);
    assert_int_equal(lmc_trace_reader_next(r, &rec, err, sizeof err), 0);
    lmc_trace_reader_close(r);
    free(data);
    lmc_key_interner_free(in);
}

/* Expects the file refused at `offset` ("at byte N"), by open or by next. */
static void expect_refused(const uint8_t *data, size_t len, size_t offset, const char *why)
{
    char err[512], at[64];
    write_file(data, len);
    lmc_trace_reader *r = lmc_trace_reader_open(path, err, sizeof err);
    lmc_trace_record rec;
    int rc = -1;   /* open refused it */
    while (r && (rc = lmc_trace_reader_next(r, &rec, err, sizeof err)) == 1)
        ;
    assert_int_equal(rc, -1);
    snprintf(at, sizeof at, "at byte %zu", offset);
    if (!strstr(err, at) || !strstr(err, why))
        fail_msg("'%s' lacks '%s' or '%s'", err, at, why);
    lmc_trace_reader_close(r);
}

static void test_cut_short_and_corrupted(void **state)
{
    (void)state;
    lmc_key_interner *in = lmc_key_interner_new();
    size_t len, offs[4];
    uint8_t *data = sample(in, &len, offs);
    expect_refused(data, offs[2] - 1, offs[1], "cut short");          /* body short */
    expect_refused(data, offs[1] + 3, offs[1], "cut short");          /* prefix short */
    expect_refused(data, offs[0] - 1, 0, "cut short");                /* header short */
    expect_refused(data, 0, 0, "empty");
    uint8_t *bad = malloc(len + 1);
    memcpy(bad, data, len);
    bad[offs[1] + 5] = 0xc1;   /* never-used msgpack byte inside the 2nd record */
    expect_refused(bad, len, offs[1], "does not decode");
    memcpy(bad, data, offs[1]);   /* the 2nd record with a nil after it, in its frame */
    memcpy(bad + offs[1], data + offs[1], offs[2] - offs[1]);
    bad[offs[2]] = 0xc0;
    bad[offs[1] + 3] += 1;
    expect_refused(bad, offs[2] + 1, offs[1], "bytes after");
    memcpy(bad, data, len);
    memcpy(bad + 25, "XXXX", 4);   /* the magic */
    assert_memory_equal(data + 25, "LMCT", 4);
    expect_refused(bad, len, 0, "bad magic");
    memcpy(bad, data, len);
    bad[offs[0]] = 0x7f;       /* a frame of ~2 GiB claimed */
    expect_refused(bad, len, offs[0], "claims");
    free(bad);
    free(data);
    lmc_key_interner_free(in);
}

/* ---- hand-made records ------------------------------------------------- */

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

typedef struct {
    size_t hash_len;
    const char *model, *salt, *dtype;
    uint64_t dims[3];
    size_t n_dims;
} rec_spec;

static int decode_spec(const rec_spec *s, lmc_trace_record *rec, char *err, size_t errlen)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    pack_str(&pk, "type"), pack_str(&pk, "record");
    pack_str(&pk, "t_mono"), msgpack_pack_double(&pk, 1);
    pack_str(&pk, "t_wall"), msgpack_pack_uint8(&pk, 2);
    pack_str(&pk, "qualname"), pack_str(&pk, QUAL "reserve_write");
    pack_str(&pk, "args"), msgpack_pack_map(&pk, 2);
    pack_str(&pk, "keys"), msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2), pack_str(&pk, "__t__"), pack_str(&pk, "ObjectKey");
    pack_str(&pk, "v"), msgpack_pack_map(&pk, s->salt ? 5 : 4);
    uint8_t hash[64] = {7};
    pack_str(&pk, "chunk_hash"), msgpack_pack_bin(&pk, s->hash_len);
    msgpack_pack_bin_body(&pk, hash, s->hash_len);
    pack_str(&pk, "model_name"), pack_str(&pk, s->model);
    pack_str(&pk, "kv_rank"), msgpack_pack_uint32(&pk, 1);
    pack_str(&pk, "object_group_id"), msgpack_pack_uint32(&pk, 0);
    if (s->salt)
        pack_str(&pk, "cache_salt"), pack_str(&pk, s->salt);
    pack_str(&pk, "layout_desc"), msgpack_pack_map(&pk, 2);
    pack_str(&pk, "__t__"), pack_str(&pk, "MemoryLayoutDesc");
    pack_str(&pk, "v"), msgpack_pack_map(&pk, 2);
    pack_str(&pk, "shapes"), msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, s->n_dims);
    for (size_t i = 0; i < s->n_dims; i++)
        msgpack_pack_uint64(&pk, s->dims[i]);
    msgpack_pack_array(&pk, 1), msgpack_pack_uint8(&pk, 3);
    pack_str(&pk, "dtypes"), msgpack_pack_array(&pk, 2);
    pack_str(&pk, s->dtype), pack_str(&pk, "torch.int64");
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_trace_scratch *scr = lmc_trace_scratch_new(in);
    int rc = lmc_trace_decode_record(scr, (const uint8_t *)sb.data, sb.size, rec, err, errlen);
    lmc_trace_scratch_free(scr);
    lmc_key_interner_free(in);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void test_record_bounds(void **state)
{
    (void)state;
    char err[256];
    lmc_trace_record rec = {0};
    rec_spec ok = {32, "m", NULL, "torch.bfloat16", {4, 5, 6}, 3};
    assert_int_equal(decode_spec(&ok, &rec, err, sizeof err), 0);
    assert_int_equal(rec.object_size, 4 * 5 * 6 * 2 + 3 * 8);   /* salt absent (schema 1): "" */
    rec_spec s = ok;
    s.hash_len = 33;
    assert_int_equal(decode_spec(&s, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "chunk_hash"));
    s = ok, s.model = "a@b";
    assert_int_equal(decode_spec(&s, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "model_name"));
    s = ok, s.salt = "x/y";
    assert_int_equal(decode_spec(&s, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache_salt"));
    s = ok, s.dtype = "torch.complex64";
    assert_int_equal(decode_spec(&s, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "dtypes[0]"));
    s = ok, s.dims[0] = 1ull << 32, s.dims[1] = 1ull << 31;   /* x2 bytes overflows */
    assert_int_equal(decode_spec(&s, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "64 bits"));
}

static void test_header_schema_1_and_refusals(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char err[256];
    lmc_trace_header h;
    for (int variant = 0; variant < 3; variant++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 6);
        pack_str(&pk, "type"), pack_str(&pk, "header");
        pack_str(&pk, "magic"), msgpack_pack_bin(&pk, 4), msgpack_pack_bin_body(&pk, "LMCT", 4);
        pack_str(&pk, "format_version"), msgpack_pack_int(&pk, variant == 2 ? 2 : 1);
        pack_str(&pk, "level"), pack_str(&pk, "storage");
        if (variant == 0)
            pack_str(&pk, "lmcache_version"), pack_str(&pk, "0.3.9");
        else
            pack_str(&pk, "trace_schema_version"), msgpack_pack_int(&pk, 3);
        pack_str(&pk, "t_mono_start"), msgpack_pack_double(&pk, 0);
        /* no t_wall_start in 1 and 2: refused before it matters in 2 */
        int rc = lmc_trace_decode_header((const uint8_t *)sb.data, sb.size, &h, err, sizeof err);
        assert_int_equal(rc, -1);
        assert_non_null(strstr(err, variant == 0 ? "t_wall_start"
                                    : variant == 1 ? "trace_schema_version" : "format_version"));
        msgpack_sbuffer_destroy(&sb);
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    pack_str(&pk, "type"), pack_str(&pk, "header");
    pack_str(&pk, "magic"), msgpack_pack_bin(&pk, 4), msgpack_pack_bin_body(&pk, "LMCT", 4);
    pack_str(&pk, "format_version"), msgpack_pack_int(&pk, 1);
    pack_str(&pk, "level"), pack_str(&pk, "storage");
    pack_str(&pk, "lmcache_version"), pack_str(&pk, "0.3.9");
    pack_str(&pk, "t_mono_start"), msgpack_pack_double(&pk, 0);
    pack_str(&pk, "t_wall_start"), msgpack_pack_int(&pk, 7);
    assert_int_equal(lmc_trace_decode_header((const uint8_t *)sb.data, sb.size, &h, err,
                                             sizeof err), 0);
    assert_int_equal(h.schema_version, 1);
    assert_string_equal(h.sm_config_json, "");
    assert_string_equal(h.sm_config_digest, "");
    lmc_trace_header_clear(&h);
    msgpack_sbuffer_destroy(&sb);
}

/* msgpack-c allocates what a container claims before reading it: a frame
 * is walked first, so a short frame that claims billions of elements, or
 * one of more than LMC_TRACE_OBJECTS_MAX small values, is refused by
 * counting, not by an allocation that fails or succeeds. */
static void test_container_claims(void **state)
{
    (void)state;
    char err[256];
    lmc_key_interner *in = lmc_key_interner_new();
    lmc_trace_scratch *scr = lmc_trace_scratch_new(in);
    lmc_trace_record rec = {0};
    static const uint8_t claim[] = {0x81, 0xa1, 'k', 0xdd, 0xff, 0xff, 0xff, 0xf0, 0xc0};
    assert_int_equal(lmc_trace_decode_record(scr, claim, sizeof claim, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "not one msgpack value"));
    size_t n = LMC_TRACE_OBJECTS_MAX + 1;
    uint8_t *many = malloc(5 + n);
    many[0] = 0xdd;
    many[1] = (uint8_t)(n >> 24), many[2] = (uint8_t)(n >> 16);
    many[3] = (uint8_t)(n >> 8), many[4] = (uint8_t)n;
    memset(many + 5, 0xc0, n);
    assert_int_equal(lmc_trace_decode_record(scr, many, 5 + n, &rec, err, sizeof err), -1);
    assert_non_null(strstr(err, "more than"));
    free(many);
    lmc_trace_scratch_free(scr);
    lmc_key_interner_free(in);
}

static int setup(void **state)
{
    (void)state;
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_cut_short_and_corrupted),
        cmocka_unit_test(test_record_bounds),
        cmocka_unit_test(test_header_schema_1_and_refusals),
        cmocka_unit_test(test_container_claims),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
