/* Fuzz target: the IPCCacheServerKey decoder (src/modules/services/ipc_key.c) on
 * arbitrary frames.  Every key it accepts must satisfy the invariants the
 * hashing and the object-key expansion rely on. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "modules/services/ipc_key.h"

#define CHUNK 16   /* small, so short inputs can still form whole chunks */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    lmc_ipc_key k;
    char err[256];
    if (lmc_ipc_key_decode_frame(data, len, CHUNK, &k, err, sizeof err) != 0) {
        CHECK(memchr(err, '\0', sizeof err) && err[0] != '\0');
        return 0;
    }
    CHECK(k.world_size >= 1 && k.world_size <= 255);
    CHECK(!k.has_worker || k.worker_id < k.world_size);
    CHECK(k.start <= k.end && k.end <= k.n_tokens);
    CHECK(k.start % CHUNK == 0 && k.end % CHUNK == 0);
    CHECK(k.num_kv_readers >= 1);
    CHECK(k.model_name && k.model_len > 0 && k.request_id && k.cache_salt);
    /* Borrowed strings lie inside the frame. */
    CHECK((const uint8_t *)k.model_name >= data &&
           (const uint8_t *)k.model_name + k.model_len <= data + len);
    for (size_t i = 0; i < k.n_tokens; i++)
        CHECK(k.tokens[i] <= UINT32_MAX);
    lmc_ipc_key_free(&k);
    return 0;
}
