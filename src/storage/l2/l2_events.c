/* Event helpers of the L2 controllers (l2_internal.h). */
#include <time.h>

#include "obs/events.h"
#include "storage/l2/l2_internal.h"

double lmc_l2_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void lmc_l2_publish_by_salt(lmc_storage_manager *sm, const char *type,
                            const lmc_object_key *keys, size_t n)
{
    if (n == 0 || !lmc_storage_manager_events_enabled(sm))
        return;
    lmc_storage_manager_publish(sm, type,
                                json_pack("{s:o}", "by_salt", lmc_storage_keys_by_salt(keys, n)));
}

void lmc_l2_publish_task(lmc_storage_manager *sm, const char *type, const lmc_l2_adapter *a,
                         uint64_t bytes, double seconds)
{
    if (!lmc_storage_manager_events_enabled(sm))
        return;
    lmc_storage_manager_publish(sm, type,
                                json_pack("{s:s, s:I, s:f}", "l2_name", lmc_l2_adapter_type(a),
                                          "bytes", (json_int_t)bytes, "seconds", seconds));
}

void lmc_l2_publish_prefetch_failure(lmc_storage_manager *sm, const char *reason,
                                     const lmc_object_key *key, size_t n)
{
    if (n == 0 || !lmc_storage_manager_events_enabled(sm))
        return;
    lmc_storage_manager_publish(sm, LMC_EVENT_L2_PREFETCH_FAILURE,
                                json_pack("{s:s, s:s, s:I}", "reason", reason, "model_name",
                                          key->model_name, "num_keys", (json_int_t)n));
}
