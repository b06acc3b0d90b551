/* CacheBlend RPC codecs (docs/cacheblend.md, "Blend RPCs on the wire"):
 * each request decoded from frames packed here as a client would, every
 * refusal with its reason, and the exact reply bytes. */
#include "modules/blend/blend_wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CS 16
#define MAXF 8

/* Up to MAXF frames, each packed into its own buffer. */
typedef struct {
    msgpack_sbuffer sb[MAXF];
    msgpack_packer pk[MAXF];
    lmc_blend_frame f[MAXF];
    size_t n;
} frames;

static msgpack_packer *next(frames *fr)
{
    assert_true(fr->n < MAXF);
    msgpack_sbuffer_init(&fr->sb[fr->n]);
    msgpack_packer_init(&fr->pk[fr->n], &fr->sb[fr->n], msgpack_sbuffer_write);
    return &fr->pk[fr->n++];
}

static lmc_blend_frame *done(frames *fr)
{
    for (size_t i = 0; i < fr->n; i++)
        fr->f[i] = (lmc_blend_frame){(const uint8_t *)fr->sb[i].data, fr->sb[i].size};
    return fr->f;
}

static void release(frames *fr)
{
    for (size_t i = 0; i < fr->n; i++)
        msgpack_sbuffer_destroy(&fr->sb[i]);
    fr->n = 0;
}

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void uint_kv(msgpack_packer *pk, const char *k, uint64_t v)
{
    str(pk, k);
    msgpack_pack_uint64(pk, v);
}

/* An IPCCacheServerKey of 2*CS tokens; worker < 0: None. */
static void key(msgpack_packer *pk, int worker)
{
    msgpack_pack_map(pk, 8);
    str(pk, "model_name"), str(pk, "m");
    uint_kv(pk, "world_size", 2);
    str(pk, "worker_id");
    worker < 0 ? msgpack_pack_nil(pk) : msgpack_pack_int(pk, worker);
    str(pk, "token_ids");
    msgpack_pack_array(pk, 2 * CS);
    for (int i = 0; i < 2 * CS; i++)
        msgpack_pack_int(pk, i + 7);
    uint_kv(pk, "start", 0);
    uint_kv(pk, "end", 2 * CS);
    str(pk, "request_id"), str(pk, "req-1");
    uint_kv(pk, "num_kv_readers", 2);
}

/* A cos/sin cache handle (the "cuda_raw" descriptor of lmcache >= 0.5.6,
 * docs/protocol.md "Shared tensor handles") of the given shape. */
static void rope_handle(msgpack_packer *pk, uint32_t ndim, const uint64_t *shape)
{
    msgpack_sbuffer sb;
    msgpack_packer p;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&p, 6);
    str(&p, "type"), str(&p, "cuda_raw");
    uint_kv(&p, "version", 1);
    str(&p, "metadata");
    msgpack_pack_map(&p, 5);
    str(&p, "dtype"), str(&p, "float32");
    uint64_t n = 1;
    str(&p, "shape");
    msgpack_pack_array(&p, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        msgpack_pack_uint64(&p, shape[i]), n *= shape[i];
    str(&p, "stride");
    msgpack_pack_array(&p, ndim);
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t s = 1;
        for (uint32_t j = i + 1; j < ndim; j++)
            s *= shape[j];
        msgpack_pack_uint64(&p, s);
    }
    uint_kv(&p, "storage_offset", 0);
    str(&p, "device_uuid"), str(&p, "GPU-0");
    uint8_t h[64];
    memset(h, 0x11, sizeof h);
    str(&p, "ipc_handle"), msgpack_pack_bin_with_body(&p, h, sizeof h);
    uint_kv(&p, "alloc_offset", 0);
    uint_kv(&p, "nbytes", n * 4);
    msgpack_pack_ext_with_body(pk, sb.data, sb.size, 1);
    msgpack_sbuffer_destroy(&sb);
}

static const uint64_t SHAPE[2] = {4096, 128};

/* ---- handshake ---------------------------------------------------------- */

#define REFUSED(call, reason)                                                    \
    do {                                                                         \
        char err_[256] = "";                                                     \
        assert_int_equal((call), -1);                                            \
        if (!strstr(err_, (reason)))                                             \
            fail_msg("reason '%s' does not say '%s'", err_, (reason));           \
    } while (0)

static void test_handshake(void **state)
{
    (void)state;
    frames fr = {0};
    int64_t v = 0;
    char err[256] = "";
    msgpack_pack_int(next(&fr), 1);
    assert_int_equal(lmc_blend_decode_handshake(done(&fr), 1, &v, err, sizeof err), 0);
    assert_int_equal(v, 1);
    assert_true(lmc_blend_handshake_compatible(v, err, sizeof err));
    release(&fr);

    msgpack_pack_int(next(&fr), 2);
    assert_int_equal(lmc_blend_decode_handshake(done(&fr), 1, &v, err, sizeof err), 0);
    assert_false(lmc_blend_handshake_compatible(v, err, sizeof err));
    assert_non_null(strstr(err, "client blend protocol version 2, this server speaks only 1"));
    release(&fr);

    str(next(&fr), "1");
    REFUSED(lmc_blend_decode_handshake(done(&fr), 1, &v, err_, sizeof err_),
            "client_version: not an int");
    msgpack_pack_int(next(&fr), 1);
    REFUSED(lmc_blend_decode_handshake(done(&fr), 2, &v, err_, sizeof err_),
            "cb_protocol_handshake: 2 payload frames, expected 1..1");
    release(&fr);
    static const uint8_t trunc[] = {0xcd, 0x01};
    lmc_blend_frame t = {trunc, sizeof trunc};
    REFUSED(lmc_blend_decode_handshake(&t, 1, &v, err_, sizeof err_),
            "frame 1 (client_version): not one well-formed msgpack value");
}

static void check_bytes(msgpack_sbuffer *sb, const uint8_t *want, size_t n)
{
    assert_int_equal(sb->size, n);
    assert_memory_equal(sb->data, want, n);
    msgpack_sbuffer_clear(sb);
}

static void test_handshake_reply(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(lmc_blend_encode_handshake_reply(&pk, 1), 0);
    check_bytes(&sb, (const uint8_t[]){0x92, 0x01, 0xc3}, 3);
    assert_int_equal(lmc_blend_encode_handshake_reply(&pk, 7), 0);
    check_bytes(&sb, (const uint8_t[]){0x92, 0x01, 0xc2}, 3);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- register / unregister rope ----------------------------------------- */

/* The six frames of a dual-RoPE registration, with frame `bad` (1-based)
 * replaced by what `alt` packs. */
static void rope_frames(frames *fr, size_t n, int bad, void (*alt)(msgpack_packer *))
{
    for (size_t i = 1; i <= n; i++) {
        msgpack_packer *pk = next(fr);
        if ((int)i == bad) {
            alt(pk);
            continue;
        }
        switch (i) {
        case 1: msgpack_pack_int(pk, 3); break;
        case 2:
            msgpack_pack_array(pk, 2);
            rope_handle(pk, 2, SHAPE);
            rope_handle(pk, 2, (const uint64_t[]){8192, 64});
            break;
        case 3: msgpack_pack_int(pk, 128); break;
        case 4: msgpack_pack_true(pk); break;
        case 5:
            msgpack_pack_array(pk, 3);
            msgpack_pack_int(pk, 0), msgpack_pack_int(pk, 1), msgpack_pack_int(pk, -1);
            break;
        default:
            msgpack_pack_array(pk, 3);
            msgpack_pack_array(pk, 2), msgpack_pack_int(pk, 512), msgpack_pack_int(pk, 64);
            msgpack_pack_array(pk, 0);
            msgpack_pack_array(pk, 2), msgpack_pack_int(pk, 0), msgpack_pack_int(pk, 128);
        }
    }
    done(fr);
}

static void test_register_rope(void **state)
{
    (void)state;
    frames fr = {0};
    lmc_blend_register_rope r;
    char err[256] = "";
    rope_frames(&fr, 6, 0, NULL);
    assert_int_equal(lmc_blend_decode_register_rope(fr.f, 6, &r, err, sizeof err), 0);
    assert_int_equal(r.instance_id, 3);
    assert_int_equal(r.n_caches, 2);
    assert_int_equal(r.caches[0].shape[0], 4096);
    assert_int_equal(r.caches[1].shape[1], 64);
    assert_string_equal(r.caches[0].dtype, "float32");
    assert_int_equal(r.head_size, 128);
    assert_true(r.is_neox);
    assert_int_equal(r.n_group_to_cache, 3);
    assert_int_equal(r.group_to_cache[1], 1);
    assert_int_equal(r.group_to_cache[2], LMC_BLEND_NO_CACHE);
    assert_int_equal(r.n_group_rot, 3);
    assert_true(r.group_rot[0].rotate);
    assert_int_equal(r.group_rot[0].offset, 512);
    assert_int_equal(r.group_rot[0].width, 64);
    assert_false(r.group_rot[1].rotate);
    assert_int_equal(r.group_rot[2].width, 128);
    assert_int_equal(r.n_frames, 6);
    lmc_blend_register_rope_free(&r);
    release(&fr);

    /* An older client: four frames. */
    rope_frames(&fr, 4, 0, NULL);
    assert_int_equal(lmc_blend_decode_register_rope(fr.f, 4, &r, err, sizeof err), 0);
    assert_int_equal(r.n_caches, 2);
    assert_int_equal(r.n_group_to_cache, 0);
    assert_int_equal(r.n_group_rot, 0);
    lmc_blend_register_rope_free(&r);
    release(&fr);
}

static void one_handle(msgpack_packer *pk) { rope_handle(pk, 2, SHAPE); }
static void no_caches(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }

static void test_register_rope_variants(void **state)
{
    (void)state;
    frames fr = {0};
    lmc_blend_register_rope r;
    char err[256] = "";
    /* A single handle rather than a list (older revisions). */
    rope_frames(&fr, 4, 2, one_handle);
    assert_int_equal(lmc_blend_decode_register_rope(fr.f, 4, &r, err, sizeof err), 0);
    assert_int_equal(r.n_caches, 1);
    lmc_blend_register_rope_free(&r);
    release(&fr);
    /* A NoPE model: no caches, no group map. */
    rope_frames(&fr, 4, 2, no_caches);
    assert_int_equal(lmc_blend_decode_register_rope(fr.f, 4, &r, err, sizeof err), 0);
    assert_int_equal(r.n_caches, 0);
    assert_null(r.caches);
    lmc_blend_register_rope_free(&r);
    release(&fr);
}

static void not_ext(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 1); }
static void three_d(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    rope_handle(pk, 3, (const uint64_t[]){2, 4096, 128});
}
static void odd_rot(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    rope_handle(pk, 2, (const uint64_t[]){4096, 63});
}
static void many_caches(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 17);
    for (int i = 0; i < 17; i++)
        rope_handle(pk, 2, SHAPE);
}
static void bad_pickle(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_ext_with_body(pk, "\x80\x04junk", 6, 1);
}
static void head0(msgpack_packer *pk) { msgpack_pack_int(pk, 0); }
static void neg_instance(msgpack_packer *pk) { msgpack_pack_int(pk, -1); }
static void int_neox(msgpack_packer *pk) { msgpack_pack_int(pk, 1); }
static void g2c_range(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 2); }
static void g2c_many(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1025);
    for (int i = 0; i < 1025; i++)
        msgpack_pack_int(pk, 0);
}
static void rot_one(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1), msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 4);
}
static void rot_width0(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1), msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 0), msgpack_pack_int(pk, 0);
}
static void rot_neg(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1), msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, -64), msgpack_pack_int(pk, 64);
}
static void rot_past(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1), msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 1 << 20), msgpack_pack_int(pk, 64);
}

static void rope_refused(int bad, void (*alt)(msgpack_packer *), const char *reason)
{
    frames fr = {0};
    lmc_blend_register_rope r;
    rope_frames(&fr, 6, bad, alt);
    REFUSED(lmc_blend_decode_register_rope(fr.f, 6, &r, err_, sizeof err_), reason);
    assert_null(r.caches);
    assert_null(r.group_rot);
    release(&fr);
}

static void test_register_rope_refusals(void **state)
{
    (void)state;
    rope_refused(1, neg_instance, "instance_id: -1 outside 0..");
    rope_refused(2, not_ext, "cos_sin_caches_ipc[0]: not a tensor handle (msgpack ext 1)");
    rope_refused(2, three_d, "cos_sin_caches_ipc[0]: shape must be [max_position >= 1, rot_dim");
    rope_refused(2, odd_rot, "rot_dim even");
    rope_refused(2, many_caches, "cos_sin_caches_ipc: 17 caches, at most 16");
    rope_refused(2, bad_pickle, "cos_sin_caches_ipc[0]: ");
    rope_refused(2, head0, "cos_sin_caches_ipc: not a list of tensor handles");
    rope_refused(3, head0, "head_size: 0 outside 1..65536");
    rope_refused(4, int_neox, "is_neox_style: not a bool");
    rope_refused(5, g2c_range, "group_to_cache[0]: 2 outside -1..1");
    rope_refused(5, g2c_many, "group_to_cache: 1025 groups, at most 1024");
    rope_refused(6, rot_one, "group_rot[0]: not [] or [offset, width]");
    rope_refused(6, rot_width0, "group_rot[0] width: 0 outside 1..");
    rope_refused(6, rot_neg, "group_rot[0] offset: -64 outside 0..");
    rope_refused(6, rot_past, "group_rot[0]: offset + width past 1048576 elements");

    frames fr = {0};
    lmc_blend_register_rope r;
    rope_frames(&fr, 5, 2, no_caches);
    REFUSED(lmc_blend_decode_register_rope(fr.f, 5, &r, err_, sizeof err_),
            "group_to_cache[0]: no cos_sin cache was sent to refer to");
    REFUSED(lmc_blend_decode_register_rope(fr.f, 3, &r, err_, sizeof err_),
            "cb_register_rope: 3 payload frames, expected 4..6");
    release(&fr);
}

static void test_unregister_rope(void **state)
{
    (void)state;
    frames fr = {0};
    int64_t id = -1;
    char err[256] = "";
    msgpack_pack_int(next(&fr), 9);
    assert_int_equal(lmc_blend_decode_unregister_rope(done(&fr), 1, &id, err, sizeof err), 0);
    assert_int_equal(id, 9);
    release(&fr);
    msgpack_pack_int(next(&fr), -9);
    REFUSED(lmc_blend_decode_unregister_rope(done(&fr), 1, &id, err_, sizeof err_),
            "instance_id: -9 outside 0..");
    release(&fr);
    /* Above int64: out of range, not "not an int". */
    msgpack_pack_uint64(next(&fr), UINT64_MAX);
    REFUSED(lmc_blend_decode_unregister_rope(done(&fr), 1, &id, err_, sizeof err_),
            "instance_id: 18446744073709551615 outside 0..9223372036854775807");
    release(&fr);
}

/* ---- unified lookup ----------------------------------------------------- */

static void test_unified_lookup(void **state)
{
    (void)state;
    frames fr = {0};
    lmc_blend_unified_lookup u;
    char err[256] = "";
    key(next(&fr), -1);
    msgpack_pack_int(next(&fr), 4);
    assert_int_equal(lmc_blend_decode_unified_lookup(done(&fr), 2, CS, &u, err, sizeof err), 0);
    assert_false(u.key.has_worker);
    assert_int_equal(u.key.n_tokens, 2 * CS);
    assert_int_equal(u.key.tokens[1], 8);
    assert_int_equal(u.key.num_kv_readers, 2);
    assert_int_equal(u.tp_size, 4);
    lmc_blend_unified_lookup_free(&u);
    /* tp_size is optional. */
    assert_int_equal(lmc_blend_decode_unified_lookup(fr.f, 1, CS, &u, err, sizeof err), 0);
    assert_int_equal(u.tp_size, 0);
    lmc_blend_unified_lookup_free(&u);
    /* A chunk size the key's end is not a multiple of. */
    REFUSED(lmc_blend_decode_unified_lookup(fr.f, 2, 3 * CS, &u, err_, sizeof err_), "key: ");
    release(&fr);

    key(next(&fr), -1);
    str(next(&fr), "4");
    REFUSED(lmc_blend_decode_unified_lookup(done(&fr), 2, CS, &u, err_, sizeof err_),
            "tp_size: not an int");
    REFUSED(lmc_blend_decode_unified_lookup(fr.f, 0, CS, &u, err_, sizeof err_),
            "cb_unified_lookup: 0 payload frames, expected 1..2");
    release(&fr);
}

/* ---- retrieve ----------------------------------------------------------- */

typedef struct {
    int64_t old_st, old_ed, cur_st, cur_ed;
    int hash_len;      /* 0: absent */
    int pred;          /* 0 absent, 1 nil, 2 a hash, 3 a short hash */
} mspec;

static void match(msgpack_packer *pk, mspec m)
{
    uint8_t h[40];
    memset(h, 0xab, sizeof h);
    msgpack_pack_map(pk, 4 + (m.hash_len > 0) + (m.pred > 0));
    str(pk, "old_st"), msgpack_pack_int64(pk, m.old_st);
    str(pk, "old_ed"), msgpack_pack_int64(pk, m.old_ed);
    str(pk, "cur_st"), msgpack_pack_int64(pk, m.cur_st);
    str(pk, "cur_ed"), msgpack_pack_int64(pk, m.cur_ed);
    if (m.hash_len)
        str(pk, "hash"), msgpack_pack_bin_with_body(pk, h, m.hash_len);
    if (m.pred == 1)
        str(pk, "predecessor_hash"), msgpack_pack_nil(pk);
    else if (m.pred >= 2)
        str(pk, "predecessor_hash"), msgpack_pack_bin_with_body(pk, h, m.pred == 2 ? 32 : 8);
}

static const mspec GOOD2 = {64, 80, 16, 32, 32, 2};

typedef struct {
    int worker;
    mspec m;
    void (*blocks)(msgpack_packer *);
    int64_t instance;
    int event_len;
} rspec;

static void tables(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, 5), msgpack_pack_int(pk, 6), msgpack_pack_int(pk, 70000);
    msgpack_pack_array(pk, 0);
}

static void retrieve_frames(frames *fr, rspec s)
{
    key(next(fr), s.worker);
    msgpack_packer *pk = next(fr);
    msgpack_pack_array(pk, 2);
    match(pk, s.m);
    match(pk, GOOD2);
    (s.blocks ? s.blocks : tables)(next(fr));
    msgpack_pack_int64(next(fr), s.instance);
    uint8_t ev[70];
    memset(ev, 0xee, sizeof ev);
    msgpack_pack_bin_with_body(next(fr), ev, (size_t)s.event_len);
    done(fr);
}

static const rspec GOOD = {1, {32, 48, 0, 16, 32, 1}, NULL, 3, 64};

static void test_retrieve(void **state)
{
    (void)state;
    frames fr = {0};
    lmc_blend_retrieve r;
    char err[256] = "";
    retrieve_frames(&fr, GOOD);
    assert_int_equal(lmc_blend_decode_retrieve(fr.f, 5, CS, &r, err, sizeof err), 0);
    assert_true(r.key.has_worker);
    assert_int_equal(r.key.worker_id, 1);
    assert_int_equal(r.n_matches, 2);
    assert_int_equal(r.matches[0].old_st, 32);
    assert_int_equal(r.matches[0].cur_ed, 16);
    assert_int_equal(r.matches[0].hash[31], 0xab);
    assert_false(r.matches[0].has_predecessor);
    assert_true(r.matches[1].has_predecessor);
    assert_int_equal(r.matches[1].predecessor[0], 0xab);
    assert_int_equal(r.n_groups, 2);
    assert_int_equal(r.group_len[0], 3);
    assert_int_equal(r.blocks[0][2], 70000);
    assert_int_equal(r.group_len[1], 0);
    assert_int_equal(r.instance_id, 3);
    assert_int_equal(r.event_len, 64);
    assert_int_equal(r.event[63], 0xee);
    lmc_blend_retrieve_free(&r);
    release(&fr);

    rspec cpu = GOOD;   /* the CPU path: an empty event handle */
    cpu.event_len = 0;
    retrieve_frames(&fr, cpu);
    assert_int_equal(lmc_blend_decode_retrieve(fr.f, 5, CS, &r, err, sizeof err), 0);
    assert_int_equal(r.event_len, 0);
    lmc_blend_retrieve_free(&r);
    release(&fr);
}

static void retrieve_refused(rspec s, const char *reason)
{
    frames fr = {0};
    lmc_blend_retrieve r;
    retrieve_frames(&fr, s);
    REFUSED(lmc_blend_decode_retrieve(fr.f, 5, CS, &r, err_, sizeof err_), reason);
    assert_null(r.matches);
    assert_null(r.blocks);
    assert_null(r.key.tokens);
    release(&fr);
}

static void flat(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 5); }
static void neg_block(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1), msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 5), msgpack_pack_int(pk, -1);
}
static void many_groups(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1025);
    for (int i = 0; i < 1025; i++)
        msgpack_pack_array(pk, 0);
}

static void test_retrieve_refusals(void **state)
{
    (void)state;
    rspec s = GOOD;
    s.worker = -1;
    retrieve_refused(s, "key: worker_id is None, a retrieve names the caller's rank");
    s = GOOD, s.m.hash_len = 31;
    retrieve_refused(s, "cb_match_result[0].hash: 31 bytes, a chunk hash has 32");
    s = GOOD, s.m.hash_len = 0;
    retrieve_refused(s, "cb_match_result[0].hash: missing");
    s = GOOD, s.m.pred = 3;
    retrieve_refused(s, "cb_match_result[0].predecessor_hash: 8 bytes, a chunk hash has 32");
    s = GOOD, s.m.old_ed = 49;
    retrieve_refused(s, "cb_match_result[0]: [32, 49) -> [0, 16) is not one chunk of 16 tokens");
    s = GOOD, s.m.cur_st = -16;
    retrieve_refused(s, "cb_match_result[0].cur_st: -16 outside 0..16777216");
    s = GOOD, s.m.old_st = (1 << 24) + 1;
    retrieve_refused(s, "cb_match_result[0].old_st: 16777217 outside 0..16777216");
    s = GOOD, s.blocks = flat;
    retrieve_refused(s, "gpu_block_ids[0]: not a list (one block table per engine group)");
    s = GOOD, s.blocks = neg_block;
    retrieve_refused(s, "gpu_block_ids[0][1]: -1 outside 0..2147483647");
    s = GOOD, s.blocks = many_groups;
    retrieve_refused(s, "gpu_block_ids: 1025 groups, at most 1024");
    s = GOOD, s.instance = -2;
    retrieve_refused(s, "instance_id: -2 outside 0..");
    s = GOOD, s.event_len = 63;
    retrieve_refused(s, "event_ipc_handle: 63 bytes, expected 0 or 64");

    frames fr = {0};
    lmc_blend_retrieve r;
    retrieve_frames(&fr, GOOD);
    REFUSED(lmc_blend_decode_retrieve(fr.f, 4, CS, &r, err_, sizeof err_),
            "cb_retrieve_pre_computed: 4 payload frames, expected 5..5");
    release(&fr);

    /* More matches than the bound: refused on the count, before any is read. */
    key(next(&fr), 0);
    msgpack_packer *pk = next(&fr);
    msgpack_pack_array(pk, LMC_BLEND_MAX_MATCHES + 1);
    for (int i = 0; i <= LMC_BLEND_MAX_MATCHES; i++)
        msgpack_pack_nil(pk);
    tables(next(&fr));
    msgpack_pack_int(next(&fr), 0);
    msgpack_pack_bin(next(&fr), 0);
    REFUSED(lmc_blend_decode_retrieve(done(&fr), 5, CS, &r, err_, sizeof err_),
            "cb_match_result: 65537 matches, at most 65536");
    release(&fr);
}

/* ---- replies ------------------------------------------------------------ */

static size_t put(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    p[0] = (uint8_t)(0xa0 + n);
    memcpy(p + 1, s, n);
    return n + 1;
}

/* The CBMatchResult of docs/cacheblend.md's example (stored at 512, reused
 * at 100, chunk size 256), with a 32-byte hash of 0xaa. */
static size_t example_match(uint8_t *p, bool pred)
{
    size_t n = 0;
    p[n++] = pred ? 0x86 : 0x85;
    n += put(p + n, "old_st"), p[n++] = 0xcd, p[n++] = 0x02, p[n++] = 0x00;
    n += put(p + n, "old_ed"), p[n++] = 0xcd, p[n++] = 0x03, p[n++] = 0x00;
    n += put(p + n, "cur_st"), p[n++] = 0x64;
    n += put(p + n, "cur_ed"), p[n++] = 0xcd, p[n++] = 0x01, p[n++] = 0x64;
    n += put(p + n, "hash"), p[n++] = 0xc4, p[n++] = 0x20;
    memset(p + n, 0xaa, 32), n += 32;
    if (pred) {
        n += put(p + n, "predecessor_hash"), p[n++] = 0xc4, p[n++] = 0x20;
        memset(p + n, 0xbb, 32), n += 32;
    }
    return n;
}

static void test_replies(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    lmc_blend_match m = {.old_st = 512, .old_ed = 768, .cur_st = 100, .cur_ed = 356};
    memset(m.hash, 0xaa, 32);
    uint8_t want[512];
    size_t n = example_match(want, false);
    assert_int_equal(lmc_blend_encode_match(&pk, &m), 0);
    check_bytes(&sb, want, n);

    lmc_blend_match p = m;
    p.has_predecessor = true;
    memset(p.predecessor, 0xbb, 32);
    n = example_match(want, true);
    assert_int_equal(lmc_blend_encode_match(&pk, &p), 0);
    check_bytes(&sb, want, n);

    n = 0;
    want[n++] = 0x83;
    n += put(want + n, "prefix_coverage_tokens"), want[n++] = 0xcd, want[n++] = 1, want[n++] = 0;
    n += put(want + n, "non_prefix_segments"), want[n++] = 0x91;
    n += example_match(want + n, false);
    n += put(want + n, "segmented_prefix_segments"), want[n++] = 0x90;
    assert_int_equal(lmc_blend_encode_lookup_result(&pk, 256, &m, 1, NULL, 0), 0);
    check_bytes(&sb, want, n);

    uint8_t ev[64];
    memset(ev, 0x5a, sizeof ev);
    want[0] = 0x92, want[1] = 0xc4, want[2] = 0x40;
    memcpy(want + 3, ev, 64);
    want[67] = 0xc2;
    assert_int_equal(lmc_blend_encode_retrieve_reply(&pk, ev, 64, false), 0);
    check_bytes(&sb, want, 68);
    assert_int_equal(lmc_blend_encode_retrieve_reply(&pk, ev, 0, true), 0);
    check_bytes(&sb, (const uint8_t[]){0x92, 0xc4, 0x00, 0xc3}, 4);
    /* The CPU path's b"" has no buffer at all (UBSan: no NULL to memcpy). */
    assert_int_equal(lmc_blend_encode_retrieve_reply(&pk, NULL, 0, false), 0);
    check_bytes(&sb, (const uint8_t[]){0x92, 0xc4, 0x00, 0xc2}, 4);
    msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake),
        cmocka_unit_test(test_handshake_reply),
        cmocka_unit_test(test_register_rope),
        cmocka_unit_test(test_register_rope_variants),
        cmocka_unit_test(test_register_rope_refusals),
        cmocka_unit_test(test_unregister_rope),
        cmocka_unit_test(test_unified_lookup),
        cmocka_unit_test(test_retrieve),
        cmocka_unit_test(test_retrieve_refusals),
        cmocka_unit_test(test_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
