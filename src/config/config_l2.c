/* Validation of --l2-adapter JSON entries.  Here only what every adapter
 * shares (storage.md §1.5): a JSON object with a string "type" and, when
 * given, an "affinity_tag" naming a DRAM or DEVDAX L1.  Per-type checks are
 * the L2 work's job: add a row to l2_type_checks below. */
#include "config/config_internal.h"

#include <stdlib.h>
#include <string.h>

/* Per-adapter-type hook: returns 0, or -1 after lmc_cfg_fail(e, ...). */
typedef int (*l2_type_check_fn)(const json_t *entry, size_t index, const lmc_config *cfg,
                                 lmc_cfg_err *e);

static const struct {
    const char *type;
    l2_type_check_fn check;
} l2_type_checks[] = {
    {NULL, NULL}, /* sentinel; per-type validators go above this line */
};

static int run_type_hook(const json_t *o, const char *type, size_t i, const lmc_config *cfg,
                         lmc_cfg_err *e)
{
    for (size_t k = 0; l2_type_checks[k].type; k++)
        if (strcmp(l2_type_checks[k].type, type) == 0)
            return l2_type_checks[k].check(o, i, cfg, e);
    return 0;
}

/* In legacy mode the default affinity always matches the single L1, so
 * only an explicit tag is checked there; with --l1-manager the default
 * "_default" must exist too. */
static int check_affinity(const json_t *o, size_t i, const lmc_config *cfg, lmc_cfg_err *e)
{
    json_t *t = json_object_get(o, "affinity_tag");
    if (t && !json_is_string(t))
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: \"affinity_tag\" must be a string", i);
    if (!t && cfg->storage.l1_manager_json.count == 0)
        return 0;
    const char *tag = t ? json_string_value(t) : "_default";
    const char *type = lmc_cfg_l1_type_of_tag(cfg, tag);
    if (!type)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: \"affinity_tag\" '%s' names no L1", i, tag);
    if (strcmp(type, "GDS") == 0 && cfg->storage.l1_manager_json.count)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: \"affinity_tag\" '%s' is a GDS L1; L2 "
                               "adapters need a DRAM or DEVDAX L1", i, tag);
    return 0;
}

static int check_adapter(const char *text, size_t i, const lmc_config *cfg, lmc_cfg_err *e)
{
    json_error_t jerr;
    json_t *o = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: invalid JSON (%s): '%s'", i, jerr.text, text);
    const char *type = json_string_value(json_object_get(o, "type"));
    int rc = 0;
    if (!json_is_object(o))
        rc = lmc_cfg_fail(e, "--l2-adapter[%zu]: must be a JSON object, got '%s'", i, text);
    else if (!type || !*type)
        rc = lmc_cfg_fail(e, "--l2-adapter[%zu]: needs a non-empty string \"type\", got '%s'",
                          i, text);
    else
        rc = check_affinity(o, i, cfg, e) ? -1 : run_type_hook(o, type, i, cfg, e);
    json_decref(o);
    return rc;
}

int lmc_cfg_check_l2_adapters(const lmc_config *cfg, lmc_cfg_err *e)
{
    const lmc_strlist *l = &cfg->storage.l2_adapter_json;
    for (size_t i = 0; i < l->count; i++)
        if (check_adapter(l->items[i], i, cfg, e) != 0)
            return -1;
    return 0;
}
