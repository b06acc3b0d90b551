/* Fuzz target: the whitelisting pickle reader and the tensor-wrapper
 * decoder of REGISTER_KV_CACHE, pickles and msgpack descriptors alike
 * (src/rpc/pickle.c, src/kv/shared_tensor.c), on arbitrary bytes.
 * Whatever it accepts must be a wrapper this server can use: a known
 * dtype, 1..8 dimensions, a tensor inside its memory. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv/shared_tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    lmc_shared_tensor t;
    char err[256];
    int rc = lmc_shared_tensor_decode(data, len, &t, err, sizeof err);
    if (rc != 0) {
        CHECK(rc == -1 || rc == -2);
        CHECK(memchr(err, '\0', sizeof err) && err[0] != '\0');
        return 0;
    }
    CHECK(t.itemsize > 0 && lmc_torch_dtype_itemsize(t.dtype, strlen(t.dtype)) == t.itemsize);
    CHECK(t.ndim >= 1 && t.ndim <= LMC_TENSOR_MAX_DIMS);
    CHECK(t.storage_offset >= 0 && t.storage_bytes > 0);
    uint64_t last = (uint64_t)t.storage_offset;
    for (uint32_t d = 0; d < t.ndim; d++) {
        CHECK(t.shape[d] > 0 && t.stride[d] >= 0);
        last += (uint64_t)(t.shape[d] - 1) * (uint64_t)t.stride[d];
    }
    CHECK((last + 1) * t.itemsize <= t.storage_bytes);
    CHECK(t.wrapper != LMC_WRAPPER_CPU_SHM || t.shm_name[0] == '/');
    return 0;
}
