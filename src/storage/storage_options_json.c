/* The first --l1-manager JSON entry (docs/configuration.md, "`--l1-manager`
 * entries"), DRAM only for now. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "storage/storage_manager.h"
#include "storage/storage_options_internal.h"

#define GIB (1ull << 30)

static int json_number(json_t *obj, const char *name, double *out)
{
    json_t *v = json_object_get(obj, name);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return -1;
    *out = json_number_value(v);
    return 0;
}

static int json_flag(json_t *obj, const char *name, bool *out)
{
    json_t *v = json_object_get(obj, name);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return -1;
    *out = json_is_true(v);
    return 0;
}

static int apply_eviction(json_t *ev, lmc_storage_options *o)
{
    if (!ev)
        return 0;
    if (!json_is_object(ev))
        return -1;
    json_t *policy = json_object_get(ev, "eviction_policy");
    if (policy && (!json_is_string(policy) ||
                   snprintf(o->eviction_policy, sizeof(o->eviction_policy), "%s",
                            json_string_value(policy)) >= (int)sizeof(o->eviction_policy)))
        return -1;
    if (json_number(ev, "trigger_watermark", &o->eviction_trigger_watermark) ||
        json_number(ev, "eviction_ratio", &o->eviction_ratio))
        return -1;
    return 0;
}

static int apply_dram_keys(json_t *l1, lmc_storage_options *o)
{
    double size_gb = 0, init_gb = (double)o->l1_init_bytes / (double)GIB;
    double align = (double)o->l1_align_bytes;
    double read_ttl = o->l1_read_ttl_seconds, write_ttl = o->l1_write_ttl_seconds;
    if (json_number(l1, "size_gb", &size_gb) || json_number(l1, "init_size_gb", &init_gb) ||
        json_number(l1, "align_bytes", &align) ||
        json_number(l1, "read_ttl_seconds", &read_ttl) ||
        json_number(l1, "write_ttl_seconds", &write_ttl) ||
        json_flag(l1, "use_lazy", &o->l1_use_lazy) ||
        json_flag(l1, "use_hugepages", &o->l1_use_hugepages) ||
        apply_eviction(json_object_get(l1, "eviction"), o))
        return -1;
    if (!(size_gb > 0) || !(init_gb >= 0) || !(align >= 1))
        return -1;
    o->l1_size_bytes = (uint64_t)(size_gb * (double)GIB);
    o->l1_init_bytes = (uint64_t)(init_gb * (double)GIB);
    o->l1_align_bytes = (uint64_t)align;
    o->l1_read_ttl_seconds = (int)read_ttl;
    o->l1_write_ttl_seconds = (int)write_ttl;
    json_t *shm = json_object_get(l1, "shm_name");
    if (shm) {   /* otherwise the --shm-name rule applies */
        if (!json_is_string(shm) || snprintf(o->shm_name, sizeof(o->shm_name), "%s",
                                             json_string_value(shm)) >= (int)sizeof(o->shm_name))
            return -1;
        o->shm_auto = false;
    }
    return 0;
}

int lmc_storage_options_apply_l1_manager_json(const char *text, lmc_storage_options *o,
                                              char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *l1 = json_loads(text, 0, &jerr);
    int rc = -1;
    if (!l1 && json_error_code(&jerr) == json_error_out_of_memory) {
        snprintf(err, errlen, "--l1-manager: out of memory reading its JSON");
        goto out;
    }
    if (!json_is_object(l1)) {
        snprintf(err, errlen, "--l1-manager: not a JSON object");
        goto out;
    }
    json_t *type = json_object_get(l1, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "DRAM") != 0) {
        snprintf(err, errlen, "--l1-manager: only type DRAM is supported");
        goto out;
    }
    if (apply_dram_keys(l1, o) != 0) {
        snprintf(err, errlen, "--l1-manager: invalid DRAM L1 definition '%s'", text);
        goto out;
    }
    rc = 0;
out:
    json_decref(l1);
    return rc;
}
