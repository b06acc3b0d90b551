#include "modules/transfer/transfer.h"

#include <stdio.h>

#include "obs/log.h"
#include "storage/storage_manager.h"

/* Keys that are resident already may hold objects of another size (an
 * earlier layout of the model): those are replaced (docs/storage.md,
 * "Objects of another size").  Returns how many were. */
static size_t replace_other_size(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                                 uint64_t object_size, const char *tag, lmc_lease *leases,
                                 lmc_l1_result *res)
{
    size_t replaced = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i] != LMC_L1_KEY_NOT_WRITABLE ||
            lmc_storage_manager_delete_other_size(sm, &keys[i], 1, object_size) == 0)
            continue;
        replaced++;
        if (lmc_storage_manager_lease_write(sm, &keys[i], 1, object_size, false, tag,
                                            &leases[i], &res[i]) != 0)
            res[i] = LMC_L1_OUT_OF_MEMORY;
    }
    if (replaced)
        LMC_WARN_LIMITED("%s: replaced %zu resident object(s) of another size than this "
                         "writer's %llu bytes (a model redeployed with another layout)",
                         tag, replaced, (unsigned long long)object_size);
    return replaced;
}

void lmc_transfer_reserve_writes(lmc_storage_manager *sm, const lmc_object_key *keys, size_t n,
                        uint64_t object_size, const char *tag, lmc_lease *leases,
                        lmc_l1_result *res)
{
    if (lmc_storage_manager_lease_write(sm, keys, n, object_size, false, tag, leases, res) != 0) {
        for (size_t i = 0; i < n; i++)
            res[i] = LMC_L1_OUT_OF_MEMORY;
        return;
    }
    size_t oom = 0, taken = 0;
    for (size_t i = 0; i < n; i++) {
        oom += res[i] == LMC_L1_OUT_OF_MEMORY;
        taken += res[i] == LMC_L1_KEY_NOT_WRITABLE;
    }
    if (taken)
        replace_other_size(sm, keys, n, object_size, tag, leases, res);
    if (oom == 0 || lmc_storage_manager_run_eviction_once(sm) == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        if (res[i] == LMC_L1_OUT_OF_MEMORY &&
            lmc_storage_manager_lease_write(sm, &keys[i], 1, object_size, false, tag,
                                            &leases[i], &res[i]) != 0)
            res[i] = LMC_L1_OUT_OF_MEMORY;
    }
}

json_t *lmc_transfer_meta(const lmc_ipc_key *k, int64_t instance, const char *device,
                          size_t chunks, uint64_t bytes, char *sid, size_t sid_len)
{
    char engine[32];
    snprintf(sid, sid_len, "%.*s", (int)k->request_id_len, k->request_id);
    snprintf(engine, sizeof engine, "%lld", (long long)instance);
    return json_pack("{s:s%, s:s, s:s, s:I, s:s%, s:I, s:I}", "model_name", k->model_name,
                     k->model_len, "engine_id", engine, "device", device, "worker_id",
                     (json_int_t)k->worker_id, "cache_salt", k->cache_salt, k->salt_len,
                     "num_chunks", (json_int_t)chunks, "bytes", (json_int_t)bytes);
}

void lmc_transfer_publish(lmc_event_bus *bus, const char *type, const lmc_ipc_key *k,
                          int64_t instance, const char *device, size_t chunks, uint64_t bytes)
{
    if (!bus)
        return;
    char sid[256];
    json_t *meta = lmc_transfer_meta(k, instance, device, chunks, bytes, sid, sizeof sid);
    lmc_event_bus_publish(bus, type, sid, meta);
}
