/* Tensor handles of REGISTER_KV_CACHE (docs/protocol.md, "Shared tensor
 * handles"): wrappers pickled by Python's own pickle from stand-ins of
 * upstream's classes, and the msgpack descriptors of lmcache 0.5.6 and
 * later (tests/pickles/gen_vectors.py), decode field for field; hostile
 * and unsupported ones are refused with a reason, never run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kv/shared_tensor.h"
#include "pickle_vectors.h"
#include "rpc/pickle.h"

#define DECODE(v, t) lmc_shared_tensor_decode(v, sizeof(v), t, err, sizeof err)

static void expect_dims(const lmc_shared_tensor *t, const int64_t *shape, const int64_t *stride,
                        uint32_t ndim)
{
    assert_int_equal(t->ndim, ndim);
    for (uint32_t d = 0; d < ndim; d++) {
        assert_int_equal(t->shape[d], shape[d]);
        assert_int_equal(t->stride[d], stride[d]);
    }
}

static void test_cuda_ipc_upstream_example(void **state)
{
    (void)state;
    lmc_shared_tensor t;
    char err[256] = "";
    assert_int_equal(sizeof good_cuda_ipc_v2, 417);   /* the annotated example's length */
    assert_int_equal(DECODE(good_cuda_ipc_v2, &t), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_CUDA_IPC);
    assert_string_equal(t.dtype, "bfloat16");
    assert_int_equal(t.itemsize, 2);
    static const int64_t shape[] = {2, 1000, 16, 8, 128};
    static const int64_t stride[] = {16384000, 16384, 1024, 128, 1};
    expect_dims(&t, shape, stride, 5);
    assert_int_equal(t.storage_offset, 0);
    assert_int_equal(t.storage_bytes, 2147483648u);   /* LONG1 */
    assert_int_equal(t.base_offset_bytes, 0);
    for (int i = 0; i < LMC_CUDA_IPC_HANDLE_BYTES; i++) {
        assert_int_equal(t.mem_handle[i], i);          /* after the version and 'c' */
        assert_int_equal(t.event_handle[i], 64 + i);
    }
    assert_true(t.event_sync_required);
    assert_string_equal(t.ref_counter_file, "/torch_4242_1234567890_0");
    assert_int_equal(t.ref_counter_slot, 3);
    assert_string_equal(t.device_uuid, "8a3c0b7e-1f2d-4c5b-9e6a-0123456789ab");
}

static void test_cuda_ipc_forms(void **state)
{
    (void)state;
    lmc_shared_tensor t;
    char err[256] = "";
    /* A raw 64-byte handle from an older torch, under the old module path. */
    assert_int_equal(DECODE(good_cuda_ipc_raw64_old_module, &t), 0);
    assert_int_equal(t.mem_handle[63], 63);
    assert_false(t.event_sync_required);
    assert_string_equal(t.dtype, "float16");
    /* Version 3 handle, protocol 5, a storage offset in elements and a
     * storage that starts 1 MiB into its cudaMalloc segment. */
    assert_int_equal(DECODE(good_cuda_ipc_v3_protocol5, &t), 0);
    assert_int_equal(t.storage_offset, 512);
    assert_int_equal(t.base_offset_bytes, 1 << 20);
    assert_int_equal(t.mem_handle[0], 0);
    assert_int_equal(DECODE(good_cuda_ipc_small, &t), 0);
    assert_int_equal(t.storage_bytes, 2 * 4 * 16 * 2 * 8 * 2);
}

static void test_raw_cuda_ipc_and_cpu_shm(void **state)
{
    (void)state;
    lmc_shared_tensor t;
    char err[256] = "";
    assert_int_equal(DECODE(good_raw_cuda_ipc, &t), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_RAW_CUDA_IPC);
    assert_int_equal(t.base_offset_bytes, 4096);
    assert_int_equal(t.storage_bytes, 64 * 2 * 16 * 8 * 64 * 2);
    assert_int_equal(t.mem_handle[10], 10);
    assert_int_equal(DECODE(good_cpu_shm, &t), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_CPU_SHM);
    assert_string_equal(t.shm_name, "/lmcache_kv_4242_0");
    assert_int_equal(t.storage_bytes, 2 * 4 * 16 * 2 * 8 * 2);
    static const int64_t shape[] = {2, 4, 16, 2, 8};
    static const int64_t stride[] = {1024, 256, 16, 8, 1};
    expect_dims(&t, shape, stride, 5);
    assert_string_equal(t.device_uuid, "cpu");
    assert_int_equal(DECODE(good_cpu_shm_fp8_backends, &t), 0);
    assert_string_equal(t.dtype, "float8_e4m3fn");
    assert_int_equal(t.itemsize, 1);
}

static void expect_refused(const uint8_t *v, size_t len, const char *reason)
{
    lmc_shared_tensor t;
    char err[256] = "";
    int rc = lmc_shared_tensor_decode(v, len, &t, err, sizeof err);
    if (rc != -1 || !strstr(err, reason))
        fail_msg("rc %d, err '%s'; wanted -1 and '%s'", rc, err, reason);
}

#define REFUSED(v, reason) expect_refused(v, sizeof(v), reason)

static void test_refusals(void **state)
{
    (void)state;
    REFUSED(bad_expandable_segment, "expandable-segment");
    REFUSED(bad_empty_storage, "empty storage");
    REFUSED(bad_vmm, "VmmCudaIPCWrapper");
    REFUSED(bad_unknown_class, "global lmcache.v1.platform.cuda.ipc_wrapper.NotAWrapper is not "
                               "allowed");
    REFUSED(bad_reduce_os_system, "is not allowed");        /* the global, before REDUCE */
    REFUSED(bad_global_builtins_eval, "global builtins.eval is not allowed");
    REFUSED(bad_past_its_storage, "reaches past the 4095 bytes");
    REFUSED(bad_complex_dtype, "global torch.complex is not allowed");
    REFUSED(bad_shm_name_no_slash, "not a POSIX shared memory name");
    REFUSED(bad_trailing_bytes, "1 bytes after STOP");
    REFUSED(bad_truncated, "runs past the end of the pickle");
    REFUSED(bad_deep_nesting, "nest deeper");
    REFUSED(bad_frame_past_end, "FRAME of 1000000 bytes runs past the end");
    REFUSED(bad_protocol_0, "is not allowed");
}

/* The msgpack descriptors carry the same facts as the pickles, and decode
 * to the same descriptions. */
static void test_descriptors(void **state)
{
    (void)state;
    lmc_shared_tensor t, p;
    char err[256] = "";
    assert_int_equal(DECODE(good_desc_cpu_shm, &t), 0);
    assert_int_equal(DECODE(good_cpu_shm, &p), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_CPU_SHM);
    assert_string_equal(t.shm_name, "/lmcache_kv_4242_0");
    assert_string_equal(t.dtype, "float16");
    assert_int_equal(t.itemsize, 2);
    assert_int_equal(t.storage_bytes, 2 * 4 * 16 * 2 * 8 * 2);
    static const int64_t shape[] = {2, 4, 16, 2, 8};
    static const int64_t stride[] = {1024, 256, 16, 8, 1};
    expect_dims(&t, shape, stride, 5);
    assert_string_equal(t.device_uuid, "cpu");
    assert_memory_equal(&t, &p, sizeof t);   /* both memset, so padding compares too */

    assert_int_equal(DECODE(good_desc_cpu_shm_view, &t), 0);
    assert_int_equal(t.storage_offset, 40);
    assert_int_equal(t.storage_bytes, 2 * 4 * 16 * 2 * 8 * 2 + 80);

    assert_int_equal(DECODE(good_desc_cuda, &t), 0);
    assert_int_equal(DECODE(good_cuda_ipc_v2, &p), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_CUDA_IPC);
    assert_int_equal(t.storage_bytes, 2147483648u);
    assert_string_equal(t.ref_counter_file, "/torch_4242_1234567890_0");
    assert_memory_equal(&t, &p, sizeof t);

    assert_int_equal(DECODE(good_desc_cuda_raw, &t), 0);
    assert_int_equal(DECODE(good_raw_cuda_ipc, &p), 0);
    assert_int_equal(t.wrapper, LMC_WRAPPER_RAW_CUDA_IPC);
    assert_int_equal(t.base_offset_bytes, 4096);
    assert_memory_equal(&t, &p, sizeof t);
}

static void test_descriptor_refusals(void **state)
{
    (void)state;
    REFUSED(bad_desc_version_2, "descriptor version 2 is not 1");
    REFUSED(bad_desc_vmm, "cuda_vmm descriptor");
    REFUSED(bad_desc_unknown_type, "descriptor type 'musa' is not supported");
    REFUSED(bad_desc_no_metadata, "field 'metadata' is missing");
    REFUSED(bad_desc_complex_dtype, "dtype 'complex64' is not supported");
    REFUSED(bad_desc_past_its_segment, "reaches past the 511 bytes");
    REFUSED(bad_desc_negative_offset, "field 'storage_offset' is below 0");
    REFUSED(bad_desc_shape_is_a_string, "field 'shape' is of the wrong type");
    REFUSED(bad_desc_raw_short_handle, "'ipc_handle' is 63 bytes, not 64");
    REFUSED(bad_desc_cuda_empty_storage, "empty storage");
    REFUSED(bad_desc_huge_shape, "overflow");
    REFUSED(bad_desc_truncated, "not one well-formed msgpack map");
    REFUSED(bad_desc_deep, "not one well-formed msgpack map");
}

/* Reader-level rules on hand-made pickles. */
static bool allow_nothing(const uint8_t *m, size_t ml, const uint8_t *n, size_t nl, bool *inst)
{
    (void)m, (void)ml, (void)n, (void)nl;
    *inst = false;
    return false;
}

static const lmc_pv *read_ok(const uint8_t *v, size_t len, lmc_pickle **p)
{
    char err[256] = "";
    *p = lmc_pickle_read(v, len, allow_nothing, err, sizeof err, NULL);
    if (!*p)
        fail_msg("refused: %s", err);
    return lmc_pickle_root(*p);
}

static void test_reader_opcodes(void **state)
{
    (void)state;
    lmc_pickle *p;
    /* PROTO 2; LONG1 -2; (None,) by TUPLE1, memoized with BINPUT and
     * fetched again with BINGET; TUPLE3 of the three; STOP. */
    static const uint8_t a[] = {0x80, 0x02, 0x8a, 0x01, 0xfe, 'N', 0x85, 'q', 0x07,
                                'h',  0x07, 0x87, '.'};
    const lmc_pv *r = read_ok(a, sizeof a, &p);
    assert_int_equal(r->kind, LMC_PV_TUPLE);
    assert_int_equal(r->n, 3);
    assert_int_equal(r->items[0]->kind, LMC_PV_INT);
    assert_int_equal(r->items[0]->i, -2);
    assert_int_equal(r->items[1]->kind, LMC_PV_TUPLE);
    assert_ptr_equal(r->items[1], r->items[2]);   /* one value, referred to twice */
    lmc_pickle_free(p);
    /* BININT -1, BININT2 65535, NEWFALSE, TUPLE3; LONG4 of 8 bytes. */
    static const uint8_t b[] = {'J', 0xff, 0xff, 0xff, 0xff, 'M', 0xff, 0xff, 0x89, 0x87, '.'};
    r = read_ok(b, sizeof b, &p);
    assert_int_equal(r->items[0]->i, -1);
    assert_int_equal(r->items[1]->i, 65535);
    assert_int_equal(r->items[2]->kind, LMC_PV_BOOL);
    assert_int_equal(r->items[2]->i, 0);
    lmc_pickle_free(p);
    /* A dict with SETITEM, looked up; the last of a repeated key wins. */
    static const uint8_t c[] = {'}', 0x8c, 1, 'k', 'K', 1, 's', 0x8c, 1, 'k', 'K', 2, 's', '.'};
    r = read_ok(c, sizeof c, &p);
    assert_int_equal(lmc_pv_dict_get(r, "k")->i, 2);
    assert_null(lmc_pv_dict_get(r, "x"));
    lmc_pickle_free(p);
}

static void expect_reader_refuses(const uint8_t *v, size_t len, const char *reason)
{
    char err[256] = "";
    lmc_pickle *p = lmc_pickle_read(v, len, allow_nothing, err, sizeof err, NULL);
    if (p || !strstr(err, reason)) {
        lmc_pickle_free(p);
        fail_msg("err '%s'; wanted '%s'", err, reason);
    }
}

static void test_reader_refusals(void **state)
{
    (void)state;
    /* REDUCE is not in the subset, whatever is on the stack. */
    static const uint8_t reduce[] = {'N', ')', 'R', '.'};
    expect_reader_refuses(reduce, sizeof reduce, "opcode 0x52 at byte 2 is not allowed");
    /* A dict fetched from the memo could be put inside itself. */
    static const uint8_t cycle[] = {'}', 0x94, 0x8c, 1, 'k', 'h', 0, 's', '.'};
    expect_reader_refuses(cycle, sizeof cycle, "a dict or object referred to twice");
    static const uint8_t no_memo[] = {'h', 5, '.'};
    expect_reader_refuses(no_memo, sizeof no_memo, "memo index 5 was never set");
    static const uint8_t big_int[] = {0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, '.'};
    expect_reader_refuses(big_int, sizeof big_int, "integer of 9 bytes");
    static const uint8_t underflow[] = {'(', 's', '.'};
    expect_reader_refuses(underflow, sizeof underflow, "stack underflow");
    static const uint8_t two_values[] = {'N', 'N', '.'};
    expect_reader_refuses(two_values, sizeof two_values, "STOP with 2 values");
    static const uint8_t no_stop[] = {'N'};
    expect_reader_refuses(no_stop, sizeof no_stop, "truncated");
    static const uint8_t newobj_args[] = {'K', 1, 0x85, 'K', 1, 0x85, 0x81, '.'};
    expect_reader_refuses(newobj_args, sizeof newobj_args, "NEWOBJ of something");
    static const uint8_t int_key[] = {'}', 'K', 1, 'K', 2, 's', '.'};
    expect_reader_refuses(int_key, sizeof int_key, "dict keys must be strings");
    /* A string that claims more bytes than its frame holds. */
    static const uint8_t frame[] = {0x95, 3, 0, 0, 0, 0, 0, 0, 0, 0x8c, 5, 'a', 'b', 'c', 'd',
                                    'e', '.'};
    expect_reader_refuses(frame, sizeof frame, "past the end of its frame");
    expect_reader_refuses(NULL, 0, "empty pickle");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_ipc_upstream_example),
        cmocka_unit_test(test_cuda_ipc_forms),
        cmocka_unit_test(test_raw_cuda_ipc_and_cpu_shm),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_descriptors),
        cmocka_unit_test(test_descriptor_refusals),
        cmocka_unit_test(test_reader_opcodes),
        cmocka_unit_test(test_reader_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
