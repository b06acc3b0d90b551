/* Allocation failures in wire decoding and encoding (src/rpc): the
 * validator and pull reader (which must not allocate at all), a request's
 * payload frames decoded into msgpack objects, a reply that outgrows the
 * call's inline buffer, and the body of an error frame. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "alloc_fault.h"
#include "rpc/call.h"
#include "rpc/wire.h"

#define N_TOKENS 600
#define N_ITEMS 40

/* Frames packed once, before any run (their buffers are not the runs'). */
typedef struct {
    msgpack_sbuffer key;    /* {"model_name", "request_id", "token_ids": [600 ints], "extra"} */
    msgpack_sbuffer items;  /* [40 x {"id": i, "name": "item-i"}] */
    msgpack_sbuffer uid, op;
} frames_fixture;

static void pack_str(msgpack_packer *pk, const char *s)
{
    lmc_mp_pack_cstr(pk, s);
}

static void fixture_init(frames_fixture *f)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(&f->key);
    msgpack_packer_init(&pk, &f->key, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "model_name"), pack_str(&pk, "org/model-7b");
    pack_str(&pk, "request_id"), pack_str(&pk, "req-1");
    pack_str(&pk, "token_ids");
    msgpack_pack_array(&pk, N_TOKENS);
    for (uint64_t i = 0; i < N_TOKENS; i++)
        msgpack_pack_uint64(&pk, i * 977u % 70000u);
    pack_str(&pk, "extra"), msgpack_pack_array(&pk, 2), msgpack_pack_nil(&pk),
        msgpack_pack_double(&pk, 0.5);

    msgpack_sbuffer_init(&f->items);
    msgpack_packer_init(&pk, &f->items, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, N_ITEMS);
    for (int i = 0; i < N_ITEMS; i++) {
        char name[32];
        snprintf(name, sizeof name, "item-%d", i);
        msgpack_pack_map(&pk, 2);
        pack_str(&pk, "id"), msgpack_pack_int(&pk, i);
        pack_str(&pk, "name"), pack_str(&pk, name);
    }

    msgpack_sbuffer_init(&f->uid);
    msgpack_packer_init(&pk, &f->uid, msgpack_sbuffer_write);
    msgpack_pack_uint64(&pk, 7);
    msgpack_sbuffer_init(&f->op);
    msgpack_packer_init(&pk, &f->op, msgpack_sbuffer_write);
    msgpack_pack_int(&pk, LMC_OP_LOOKUP);
}

static void fixture_free(frames_fixture *f)
{
    msgpack_sbuffer_destroy(&f->key);
    msgpack_sbuffer_destroy(&f->items);
    msgpack_sbuffer_destroy(&f->uid);
    msgpack_sbuffer_destroy(&f->op);
}

static uint64_t token_at(size_t i)
{
    return (uint64_t)i * 977u % 70000u;
}

/* ---- validator and pull reader: no allocation at all --------------------- */

static int scenario_pull_decode(void *arg)
{
    const frames_fixture *f = arg;
    const uint8_t *data = (const uint8_t *)f->key.data;
    if (!lmc_mp_validate(data, f->key.size, 32))
        return lmc_fault_violation("a valid key frame did not validate");
    lmc_mp_reader r;
    lmc_mpr_init(&r, data, f->key.size);
    uint32_t fields, n;
    uint64_t tokens[N_TOKENS];
    size_t got = 0;
    if (!lmc_mpr_map(&r, &fields) || fields != 4)
        return lmc_fault_violation("key is not a map of 4");
    for (uint32_t i = 0; i < fields; i++) {
        const char *name, *s;
        size_t len, slen;
        if (!lmc_mpr_str(&r, &name, &len))
            return lmc_fault_violation("field %u has no str name", i);
        if (len == 9 && memcmp(name, "token_ids", 9) == 0) {
            if (!lmc_mpr_array(&r, &n) || n != N_TOKENS)
                return lmc_fault_violation("token_ids is not an array of %d", N_TOKENS);
            got = lmc_mpr_uints(&r, n, UINT32_MAX, tokens);
        } else if (!lmc_mpr_str(&r, &s, &slen) && !lmc_mpr_skip(&r, 32)) {
            return lmc_fault_violation("cannot skip field %.*s", (int)len, name);
        }
    }
    if (!lmc_mpr_at_end(&r) || got != N_TOKENS)
        return lmc_fault_violation("read %zu of %d tokens", got, N_TOKENS);
    for (size_t i = 0; i < N_TOKENS; i++)
        if (tokens[i] != token_at(i))
            return lmc_fault_violation("token %zu is %llu", i, (unsigned long long)tokens[i]);
    /* wire.h promises this path never allocates: a hostile length must not
     * become an allocation before the frame is checked. */
    if (lmc_fault_count() != 0)
        return lmc_fault_violation("validating and pull-reading allocated %ld times",
                                   lmc_fault_count());
    return LMC_FAULT_OK;
}

/* ---- payload frames decoded into msgpack objects -------------------------- */

static void frame_from(zmq_msg_t *m, const void *data, size_t len)
{
    zmq_msg_init_size(m, len);
    memcpy(zmq_msg_data(m), data, len);
}

enum { N_FRAMES = 5 };

static void frames_make(const frames_fixture *f, zmq_msg_t frames[N_FRAMES])
{
    frame_from(&frames[CALL_IDENTITY], "\x00peer", 5);
    frame_from(&frames[CALL_UID], f->uid.data, f->uid.size);
    frame_from(&frames[CALL_OP], f->op.data, f->op.size);
    frame_from(&frames[CALL_FIRST_ARG], f->key.data, f->key.size);
    frame_from(&frames[CALL_FIRST_ARG + 1], f->items.data, f->items.size);
}

/* The decoded key must be exactly what was packed. */
static int check_key(const msgpack_object *key)
{
    const char *s;
    size_t len;
    const msgpack_object *toks = lmc_mp_map_get(key, "token_ids");
    if (!lmc_mp_get_str(lmc_mp_map_get(key, "model_name"), &s, &len) || len != 12 ||
        memcmp(s, "org/model-7b", 12) != 0)
        return lmc_fault_violation("decoded model_name is wrong");
    if (!toks || toks->type != MSGPACK_OBJECT_ARRAY || toks->via.array.size != N_TOKENS)
        return lmc_fault_violation("decoded token_ids is not an array of %d", N_TOKENS);
    for (uint32_t i = 0; i < N_TOKENS; i++) {
        uint64_t u;
        if (!lmc_mp_get_uint(&toks->via.array.ptr[i], &u) || u != token_at(i))
            return lmc_fault_violation("decoded token %u is wrong", i);
    }
    return LMC_FAULT_OK;
}

static int check_items(const msgpack_object *items)
{
    if (items->type != MSGPACK_OBJECT_ARRAY || items->via.array.size != N_ITEMS)
        return lmc_fault_violation("decoded items is not an array of %d", N_ITEMS);
    for (uint32_t i = 0; i < N_ITEMS; i++) {
        int64_t id;
        char want[32];
        snprintf(want, sizeof want, "item-%u", i);
        if (!lmc_mp_get_int(lmc_mp_map_get(&items->via.array.ptr[i], "id"), &id) || id != i ||
            !lmc_mp_str_eq(lmc_mp_map_get(&items->via.array.ptr[i], "name"), want))
            return lmc_fault_violation("decoded item %u is wrong", i);
    }
    return LMC_FAULT_OK;
}

/* A call over the fixture's frames, as the socket thread makes one; NULL
 * with *rc set (a clean error, or a violation) when it could not be made. */
static lmc_rpc_call *new_call(const frames_fixture *f, int *rc)
{
    zmq_msg_t frames[N_FRAMES];
    frames_make(f, frames);
    lmc_rpc_call *c = lmc_call_new(NULL, frames, N_FRAMES);
    if (!c) {
        for (int i = 0; i < N_FRAMES; i++)
            zmq_msg_close(&frames[i]);
        *rc = lmc_fault_fired() ? LMC_FAULT_ERROR
                                : lmc_fault_violation("lmc_call_new failed with memory left");
    }
    return c;
}

static int scenario_call_args(void *arg)
{
    int made;
    lmc_rpc_call *c = new_call(arg, &made);
    if (!c)
        return made;
    int rc = LMC_FAULT_OK;
    const msgpack_object *key = lmc_rpc_call_arg(c, 0);
    const msgpack_object *items = key ? lmc_rpc_call_arg(c, 1) : NULL;
    if (!key || !items) {
        /* Both frames are valid: only memory can have made them undecodable,
         * and the handler gets NULL, as for a bad argument. */
        rc = lmc_fault_fired() ? LMC_FAULT_ERROR
                               : lmc_fault_violation("a valid argument did not decode");
        /* The answer must stay NULL, not become a half-decoded object. */
        if (!key && lmc_rpc_call_arg(c, 0) != NULL)
            rc = lmc_fault_violation("argument 0 decoded on a second try after failing");
    } else if ((rc = check_key(key)) == LMC_FAULT_OK) {
        rc = check_items(items);
        /* A second access returns the same object without decoding again. */
        if (rc == LMC_FAULT_OK && lmc_rpc_call_arg(c, 0) != key)
            rc = lmc_fault_violation("argument 0 changed on the second access");
    }
    lmc_call_free(c);
    return rc;
}

/* ---- a reply that outgrows the inline buffer ---------------------------- */

static int scenario_reply(void *arg)
{
    int made;
    lmc_rpc_call *c = new_call(arg, &made);
    if (!c)
        return made;
    /* As handlers do: pack everything, check nothing. */
    msgpack_packer *pk = lmc_rpc_call_reply(c);
    msgpack_pack_array(pk, 300);
    for (int i = 0; i < 300; i++)
        msgpack_pack_uint64(pk, 1000000u + (uint64_t)i);
    lmc_handler_result r = lmc_call_settle(c, LMC_HANDLER_REPLY);
    int rc;
    if (r == LMC_HANDLER_REPLY) {
        /* What would be sent must be the whole document. */
        lmc_mp_reader rd;
        uint32_t n;
        uint64_t vals[300];
        lmc_mpr_init(&rd, (const uint8_t *)c->reply.data, c->reply.size);
        rc = lmc_mpr_array(&rd, &n) && n == 300 && lmc_mpr_uints(&rd, n, UINT64_MAX, vals) == 300 &&
                     lmc_mpr_at_end(&rd) && vals[299] == 1000299u
                 ? LMC_FAULT_OK
                 : lmc_fault_violation("a REPLY would send a %zu-byte cut or wrong document",
                                       c->reply.size);
    } else if (r == LMC_HANDLER_ERROR && strcmp(c->error_type, "MemoryError") == 0) {
        rc = lmc_fault_fired() ? LMC_FAULT_ERROR
                               : lmc_fault_violation("MemoryError with memory left");
    } else {
        rc = lmc_fault_violation("settle gave %d (%s)", (int)r, c->error_type);
    }
    lmc_call_free(c);
    return rc;
}

/* ---- the body of an error frame ------------------------------------------ */

static int scenario_error_body(void *arg)
{
    (void)arg;
    lmc_rpc_call *c = lmc_call_new(NULL, NULL, 0);
    if (!c)
        return lmc_fault_fired() ? LMC_FAULT_ERROR
                                 : lmc_fault_violation("lmc_call_new failed with memory left");
    char msg[400];
    memset(msg, 'm', sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    lmc_rpc_call_fail(c, "ValidationError", "%s", msg);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    size_t len;
    const char *body = lmc_call_error_body(c, &sb, &len);
    /* Either the real message or the MemoryError stand-in; always a
     * complete {"error_type", "message"} map. */
    lmc_mp_reader r;
    uint32_t n;
    const char *k1, *v1, *k2, *v2;
    size_t k1l, v1l, k2l, v2l;
    lmc_mpr_init(&r, (const uint8_t *)body, len);
    int rc = LMC_FAULT_OK;
    if (!(lmc_mpr_map(&r, &n) && n == 2 && lmc_mpr_str(&r, &k1, &k1l) &&
          lmc_mpr_str(&r, &v1, &v1l) && lmc_mpr_str(&r, &k2, &k2l) &&
          lmc_mpr_str(&r, &v2, &v2l) && lmc_mpr_at_end(&r)))
        rc = lmc_fault_violation("error body of %zu bytes is not a map of two strs", len);
    else if (v1l == 15 && memcmp(v1, "ValidationError", 15) == 0 && v2l == strlen(msg))
        rc = LMC_FAULT_OK;
    else if (v1l == 11 && memcmp(v1, "MemoryError", 11) == 0 && lmc_fault_fired())
        rc = LMC_FAULT_OK; /* the client is still told, just less precisely */
    else
        rc = lmc_fault_violation("error body says %.*s", (int)v1l, v1);
    msgpack_sbuffer_destroy(&sb);
    lmc_call_free(c);
    return rc;
}

/* ---- cmocka ----------------------------------------------------------------- */

static frames_fixture g_fx;

static int setup(void **state)
{
    (void)state;
    fixture_init(&g_fx);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fixture_free(&g_fx);
    return 0;
}

static void test_pull_decode(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("rpc.pull_decode", scenario_pull_decode, &g_fx, NULL, 0), 0);
}

static void test_call_args(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("rpc.call_args", scenario_call_args, &g_fx, NULL, 0), 0);
}

static void test_reply(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("rpc.reply", scenario_reply, &g_fx, NULL, 0), 0);
}

static void test_error_body(void **state)
{
    (void)state;
    assert_int_equal(lmc_fault_run("rpc.error_body", scenario_error_body, NULL, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_decode),
        cmocka_unit_test(test_call_args),
        cmocka_unit_test(test_reply),
        cmocka_unit_test(test_error_body),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
