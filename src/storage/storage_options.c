/* lmc_storage_options from the parsed configuration (docs/configuration.md,
 * "Storage Manager (L1)"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "storage/l1/l1_manager.h"
#include "storage/storage_config.h"
#include "storage/storage_manager.h"
#include "storage/storage_options_internal.h"

#define GIB (1ull << 30)

void lmc_storage_options_defaults(lmc_storage_options *o)
{
    memset(o, 0, sizeof(*o));
    o->l1_use_lazy = true;
    o->l1_init_bytes = 20 * GIB;
    o->l1_align_bytes = 4096;
    o->shm_auto = true;
    o->l1_write_ttl_seconds = 600;
    o->l1_read_ttl_seconds = 300;
    snprintf(o->eviction_policy, sizeof(o->eviction_policy), "LRU");
    o->eviction_trigger_watermark = 0.8;
    o->eviction_ratio = 0.2;
    o->eviction_period_ms = 1000;
    o->lazy_grow_step_bytes = GIB;
    o->l1_shm_reserve_bytes = -1;
    o->check_books = LMC_L1_CHECK_BOOKS_DEFAULT;
}

static int gib_to_bytes(double gib, uint64_t *out, const char *what, char *err, size_t errlen)
{
    if (!isfinite(gib) || gib <= 0 || gib * (double)GIB >= 18446744073709551615.0) {
        snprintf(err, errlen, "%s must be a finite positive number of GiB", what);
        return -1;
    }
    *out = (uint64_t)(gib * (double)GIB);
    return 0;
}

static int set_shm_name(lmc_storage_options *o, const char *name, char *err, size_t errlen)
{
    o->shm_auto = name == NULL;
    if (name && snprintf(o->shm_name, sizeof(o->shm_name), "%s", name) >=
                    (int)sizeof(o->shm_name)) {
        snprintf(err, errlen, "--shm-name is too long");
        return -1;
    }
    return 0;
}

static int set_policy(lmc_storage_options *o, const char *policy)
{
    /* NULL (flag not given): LRU, so a full L1 makes room instead of
     * failing every store with OUT_OF_MEMORY. */
    return snprintf(o->eviction_policy, sizeof(o->eviction_policy), "%s",
                    policy ? policy : "LRU") >= (int)sizeof(o->eviction_policy) ? -1 : 0;
}

static int apply_legacy_flags(const lmc_config *cfg, lmc_storage_options *o, char *err,
                              size_t errlen)
{
    const lmc_storage_config *s = &cfg->storage;
    if (s->l1_devdax_path || s->gds_l1_path) {
        snprintf(err, errlen, "Device-DAX and GDS L1 tiers are not supported yet");
        return -1;
    }
    if (!s->l1_size_gb.set) {
        snprintf(err, errlen, "the L1 size is not configured (--l1-size-gb or --l1-manager)");
        return -1;
    }
    if (gib_to_bytes(s->l1_size_gb.value, &o->l1_size_bytes, "--l1-size-gb", err, errlen))
        return -1;
    o->l1_use_lazy = s->l1_use_lazy;
    o->l1_init_bytes = (uint64_t)(s->l1_init_size_gb > 0 ? s->l1_init_size_gb : 0) * GIB;
    o->l1_align_bytes = (uint64_t)s->l1_align_bytes;
    o->l1_use_hugepages = s->l1_use_hugepages;
    return set_shm_name(o, cfg->mp.shm_name, err, errlen);
}

int lmc_storage_options_from_config(const lmc_config *cfg, lmc_storage_options *o, char *err,
                                    size_t errlen)
{
    const lmc_storage_config *s = &cfg->storage;
    lmc_storage_options_defaults(o);
    o->l1_shm_reserve_bytes = s->l1_shm_reserve_mb < 0 ? -1 : (int64_t)s->l1_shm_reserve_mb << 20;
    o->l1_write_ttl_seconds = s->l1_write_ttl_seconds;
    o->l1_read_ttl_seconds = s->l1_read_ttl_seconds;
    o->eviction_trigger_watermark = s->eviction_trigger_watermark;
    o->eviction_ratio = s->eviction_ratio;
    if (set_policy(o, s->eviction_policy) != 0) {
        snprintf(err, errlen, "--eviction-policy: value too long");
        return -1;
    }
    if (s->l1_manager_json.count == 0)
        return apply_legacy_flags(cfg, o, err, errlen);
    if (s->l1_manager_json.count > 1) {
        snprintf(err, errlen, "more than one --l1-manager is not supported yet");
        return -1;
    }
    if (set_shm_name(o, cfg->mp.shm_name, err, errlen) != 0)
        return -1;
    o->l1_init_bytes = (uint64_t)(s->l1_init_size_gb > 0 ? s->l1_init_size_gb : 0) * GIB;
    return lmc_storage_options_apply_l1_manager_json(s->l1_manager_json.items[0], o, err,
                                                     errlen);
}
