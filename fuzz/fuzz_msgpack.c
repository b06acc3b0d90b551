/* Fuzz target: the msgpack validator every RPC payload frame passes
 * (src/rpc/wire.c), msgpack-c's unpacker behind it, the accessors the
 * handlers use, and the pull reader the key decoder is built on.  A frame
 * the validator accepts must unpack, whole, with msgpack-c; the pull reader
 * must never read outside the frame, whatever it is asked to read. */
#include "check.h"
#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/wire.h"

#define DEPTH 32

static void touch(const msgpack_object *o, unsigned depth)
{
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    const char *s;
    const uint8_t *bin;
    size_t n;
    (void)lmc_mp_get_int(o, &i);
    (void)lmc_mp_get_uint(o, &u);
    (void)lmc_mp_get_double(o, &d);
    (void)lmc_mp_get_bool(o, &b);
    (void)lmc_mp_get_str(o, &s, &n);
    (void)lmc_mp_get_bin(o, &bin, &n);
    (void)lmc_mp_is_nil(o);
    if (depth == 0)
        return;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t k = 0; k < o->via.array.size; k++)
            touch(&o->via.array.ptr[k], depth - 1);
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        (void)lmc_mp_map_get(o, "token_ids");
        for (uint32_t k = 0; k < o->via.map.size; k++) {
            (void)lmc_mp_str_eq(&o->via.map.ptr[k].key, "request_id");
            touch(&o->via.map.ptr[k].val, depth - 1);
        }
    }
}

/* Walks the frame with the pull reader, choosing each read from the next
 * byte, as a decoder expecting some shape would; every read either consumes
 * bytes inside the frame or leaves the reader where it was. */
static void pull(const uint8_t *data, size_t len)
{
    lmc_mp_reader r;
    lmc_mpr_init(&r, data, len);
    uint64_t tokens[64];
    for (int steps = 0; steps < 256 && !lmc_mpr_at_end(&r); steps++) {
        const uint8_t *before = r.p;
        uint32_t count;
        const char *s;
        size_t n;
        uint64_t u;
        int64_t i;
        bool ok;
        switch (*r.p % 7) {
        case 0: ok = lmc_mpr_map(&r, &count); break;
        case 1: ok = lmc_mpr_array(&r, &count); break;
        case 2: ok = lmc_mpr_str(&r, &s, &n) && (n == 0 || (s >= (const char *)data &&
                                                          s + n <= (const char *)data + len));
                break;
        case 3: ok = lmc_mpr_uint(&r, &u); break;
        case 4: ok = lmc_mpr_int(&r, &i); break;
        case 5: ok = lmc_mpr_uints(&r, 64, UINT32_MAX, tokens) > 0; break;
        default: ok = lmc_mpr_nil(&r) || lmc_mpr_skip(&r, DEPTH); break;
        }
        CHECK(r.p >= before && r.p <= data + len);
        if (!ok && r.p == before && !lmc_mpr_skip(&r, DEPTH))
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    pull(data, len);
    if (!lmc_mp_validate(data, len, DEPTH))
        return 0;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&up, (const char *)data, len, &off);
    CHECK(rc == MSGPACK_UNPACK_SUCCESS && off == len);
    touch(&up.data, DEPTH);
    msgpack_unpacked_destroy(&up);
    return 0;
}
