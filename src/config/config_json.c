/* Rendering the effective configuration as JSON (for /status, plugins and
 * logs), and derived values other subsystems need. */
#include "config/config_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "obs/json_dump.h"

/* A JSON-valued flag is embedded parsed; text that does not parse (only
 * possible for a config that skipped validation) is kept as a string.
 * NULL when out of memory: not the string, which would render valid JSON
 * as text. */
static json_t *json_text_value(const char *text)
{
    char why[160];
    bool oom;
    json_t *v = lmc_cfg_json_load(text, JSON_DECODE_ANY, &oom, why, sizeof why);
    return v ? v : oom ? NULL : json_string(text);
}

/* NULL when out of memory: a list missing an item would look complete. */
static json_t *list_value(const lmc_strlist *l, bool parse)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < l->count; i++) {
        json_t *item = parse ? json_text_value(l->items[i]) : json_string(l->items[i]);
        if (json_array_append_new(arr, item) != 0) { /* it frees item */
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* JSON has no inf/nan; jansson refuses them, so they become null. */
static json_t *real_value(double d)
{
    return isfinite(d) ? json_real(d) : json_null();
}

static json_t *flag_value(const lmc_config *cfg, const lmc_config_flag *f)
{
    const void *slot = lmc_cfg_cfield(cfg, f);
    const char *s;
    const lmc_opt_double *od;
    if (f->flags & LMC_FF_SECRET) /* a string flag: the JSON goes to /config, plugins, logs */
        return *(char *const *)slot ? json_string("***") : json_null();
    switch (f->kind) {
    case LMC_FK_STR:
    case LMC_FK_NSTR:
        s = *(char *const *)slot;
        if (!s)
            return json_null();
        return (f->flags & LMC_FF_JSON) ? json_text_value(s) : json_string(s);
    case LMC_FK_INT: return json_integer(*(const int *)slot);
    case LMC_FK_I64: return json_integer(*(const int64_t *)slot);
    case LMC_FK_DBL: return real_value(*(const double *)slot);
    case LMC_FK_OPT_DBL:
        od = slot;
        return od->set ? real_value(od->value) : json_null();
    case LMC_FK_BOOL:
    case LMC_FK_TRUE: return json_boolean(*(const bool *)slot);
    case LMC_FK_APPEND:
    case LMC_FK_NARGS: return list_value(slot, f->flags & LMC_FF_JSON);
    }
    return json_null();
}

static json_t *build(const lmc_config *cfg)
{
    json_t *root = json_object();
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; root && i < n; i++) {
        const char *gname = lmc_config_group_json(flags[i].group);
        json_t *group = json_object_get(root, gname);
        if (!group && json_object_set_new(root, gname, group = json_object()) != 0)
            goto fail;
        json_t *v = flag_value(cfg, &flags[i]);
        if (!v || json_object_set_new(group, flags[i].json_name, v) != 0)
            goto fail;
    }
    return root;
fail:
    json_decref(root);
    return NULL;
}

char *lmc_config_to_json(const lmc_config *cfg)
{
    json_t *root = build(cfg);
    char *text = root ? lmc_json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return text;
}

/* Flat and keyed by flag name, so that the output loads back as a --config
 * file (secrets aside: "***" is refused there).  A random instance id is
 * null: one file may serve many servers, and each must draw its own. */
char *lmc_cfg_to_flag_json(const lmc_config *cfg, bool random_instance_id)
{
    json_t *root = json_object();
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; root && i < n; i++) {
        bool drawn = random_instance_id && !strcmp(flags[i].name, "instance-id");
        json_t *v = drawn ? json_null() : flag_value(cfg, &flags[i]);
        if (!v || json_object_set_new(root, flags[i].name, v) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    char *text = root ? lmc_json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(root);
    return text;
}

uint64_t lmc_config_l1_size_bytes(const lmc_config *cfg)
{
    const double gib = 1073741824.0;
    double gb = 0;
    if (cfg->storage.l1_size_gb.set) {
        gb = cfg->storage.l1_size_gb.value;
    } else if (cfg->storage.l1_manager_json.count) {
        json_t *first = lmc_cfg_l1_entry(cfg, 0);
        gb = json_number_value(json_object_get(first, "size_gb"));
        json_decref(first);
    }
    if (!(gb > 0) || !isfinite(gb) || gb * gib >= 18446744073709551616.0)
        return 0;
    return (uint64_t)(gb * gib);
}
