/* Validation of --l1-manager JSON entries (docs/configuration.md,
 * "`--l1-manager` entries").  Each entry is
 * checked on its own (keys, types, ranges), then the entries together
 * (unique tags, one GDS at most, distinct DRAM SHM names). */
#include "config/config_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "obs/json_dump.h"

typedef struct {
    size_t index;                /* position among the --l1-manager flags */
    const char *type;            /* "DRAM", "DEVDAX" or "GDS" (literal) */
    const char *tag;             /* points into the entry's JSON */
    const char *shm_name;        /* DRAM only, "" when unset */
} l1_entry_info;

static const char *const common_keys[] = {"type", "tag", "size_gb", "align_bytes", "eviction",
                                          "read_ttl_seconds", "write_ttl_seconds", NULL};
static const char *const dram_keys[] = {"use_lazy", "init_size_gb", "shm_name",
                                        "use_hugepages", NULL};
static const char *const devdax_keys[] = {"path", NULL};
static const char *const gds_keys[] = {"path", "backend", "direct_io", NULL};
static const char *const eviction_keys[] = {"eviction_policy", "trigger_watermark",
                                            "eviction_ratio", NULL};
static const char *const policies[] = {"LRU", "ARC", "IsolatedLRU", "noop", NULL};

#define BAD(e, info, ...) l1_fail((e), (info)->index, __VA_ARGS__)

__attribute__((format(printf, 3, 4)))
static int l1_fail(lmc_cfg_err *e, size_t index, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lmc_cfg_fail(e, "--l1-manager[%zu]: %s", index, msg);
}

/* Compact JSON text of a value for error messages. */
static void show(const json_t *v, char *buf, size_t len)
{
    char *text = v ? lmc_json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(buf, len, "%s", text ? text : "null");
    free(text);
}

static bool in_list(const char *const *list, const char *s)
{
    for (size_t i = 0; list[i]; i++)
        if (strcmp(list[i], s) == 0)
            return true;
    return false;
}

static const char *const *type_keys(const char *type)
{
    return strcmp(type, "DRAM") == 0 ? dram_keys
           : strcmp(type, "GDS") == 0 ? gds_keys : devdax_keys;
}

static int check_keys(const json_t *o, const l1_entry_info *in, lmc_cfg_err *e)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
        if (!in_list(common_keys, key) && !in_list(type_keys(in->type), key))
            return BAD(e, in, "unknown key '%s' for a %s L1", key, in->type);
    return 0;
}

static int check_type_and_tag(const json_t *o, l1_entry_info *in, lmc_cfg_err *e)
{
    char got[128];
    const char *type = json_string_value(json_object_get(o, "type"));
    static const char *const types[] = {"DRAM", "DEVDAX", "GDS", NULL};
    for (size_t i = 0; type && types[i]; i++)
        if (strcmp(type, types[i]) == 0)
            in->type = types[i];
    if (!in->type) {
        show(json_object_get(o, "type"), got, sizeof got);
        return BAD(e, in, "\"type\" must be DRAM, DEVDAX or GDS, got %s", got);
    }
    json_t *tag = json_object_get(o, "tag");
    /* An untagged DRAM L1 is the default one that L2 adapters attach to. */
    in->tag = tag ? json_string_value(tag) : (strcmp(in->type, "DRAM") == 0 ? "_default" : NULL);
    if (!in->tag || !*in->tag) {
        show(tag, got, sizeof got);
        return BAD(e, in, "\"tag\" must be a non-empty string, got %s", got);
    }
    if (strcmp(in->tag, "_default") == 0 && strcmp(in->type, "DRAM") != 0)
        return BAD(e, in, "\"tag\" '_default' is reserved for DRAM, not %s", in->type);
    return 0;
}

/* Optional number key, finite and > 0 (or >= 0 is never wanted here). */
static int positive_number(const json_t *o, const char *key, bool integer, double *out,
                           const l1_entry_info *in, lmc_cfg_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return 0;
    double d = json_number_value(v);
    if ((integer ? !json_is_integer(v) : !json_is_number(v)) || !isfinite(d) || d <= 0) {
        char got[128];
        show(v, got, sizeof got);
        return BAD(e, in, "\"%s\" must be %s > 0, got %s", key,
                   integer ? "an integer" : "a finite number", got);
    }
    *out = d;
    return 0;
}

static int check_size(const json_t *o, const l1_entry_info *in, lmc_cfg_err *e)
{
    double size_gb = 0, align = 4096, ttl;
    if (!json_object_get(o, "size_gb"))
        return BAD(e, in, "\"size_gb\" is required");
    if (positive_number(o, "size_gb", false, &size_gb, in, e) ||
        positive_number(o, "align_bytes", true, &align, in, e) ||
        positive_number(o, "read_ttl_seconds", true, &ttl, in, e) ||
        positive_number(o, "write_ttl_seconds", true, &ttl, in, e))
        return -1;
    uint64_t a = (uint64_t)align;
    if ((a & (a - 1)) != 0)
        return BAD(e, in, "\"align_bytes\" must be a power of two, got %llu",
                   (unsigned long long)a);
    if (strcmp(in->type, "GDS") == 0 && a < 4096)
        return BAD(e, in, "\"align_bytes\" must be >= 4096 for GDS (O_DIRECT), got %llu",
                   (unsigned long long)a);
    if (size_gb * 1073741824.0 < align)
        return BAD(e, in, "\"size_gb\" %g is smaller than \"align_bytes\" %llu", size_gb,
                   (unsigned long long)a);
    return 0;
}

static int check_fraction(const json_t *ev, const char *key, const l1_entry_info *in,
                          lmc_cfg_err *e)
{
    json_t *v = json_object_get(ev, key);
    double d = json_number_value(v);
    if (v && (!json_is_number(v) || !(d > 0 && d <= 1))) {
        char got[128];
        show(v, got, sizeof got);
        return BAD(e, in, "\"eviction\".\"%s\" must be in (0, 1], got %s", key, got);
    }
    return 0;
}

/* Each L1 needs a policy: from its own "eviction" object or --eviction-policy. */
static int check_eviction(const json_t *o, const lmc_config *cfg, const l1_entry_info *in,
                          lmc_cfg_err *e)
{
    json_t *ev = json_object_get(o, "eviction");
    char got[256];
    if (ev && !json_is_object(ev)) {
        show(ev, got, sizeof got);
        return BAD(e, in, "\"eviction\" must be a JSON object, got %s", got);
    }
    const char *key;
    json_t *v;
    json_object_foreach(ev, key, v)
        if (!in_list(eviction_keys, key))
            return BAD(e, in, "unknown key '%s' in \"eviction\"", key);
    json_t *pol = json_object_get(ev, "eviction_policy");
    if (pol && !(json_is_string(pol) && in_list(policies, json_string_value(pol)))) {
        show(pol, got, sizeof got);
        return BAD(e, in, "\"eviction\".\"eviction_policy\" must be one of LRU, ARC, "
                          "IsolatedLRU, noop, got %s", got);
    }
    if (check_fraction(ev, "trigger_watermark", in, e) ||
        check_fraction(ev, "eviction_ratio", in, e))
        return -1;
    if (!pol && !cfg->storage.eviction_policy)
        return BAD(e, in, "no eviction policy: give \"eviction\": {\"eviction_policy\": ...} "
                          "or --eviction-policy");
    return 0;
}

static int want_type(const json_t *o, const char *key, int json_type, const char *what,
                     const l1_entry_info *in, lmc_cfg_err *e)
{
    json_t *v = json_object_get(o, key);
    bool ok = !v || (json_type == JSON_TRUE ? json_is_boolean(v)
                                            : (int)json_typeof(v) == json_type);
    if (ok)
        return 0;
    char got[128];
    show(v, got, sizeof got);
    return BAD(e, in, "\"%s\" must be %s, got %s", key, what, got);
}

static int check_dram(const json_t *o, l1_entry_info *in, lmc_cfg_err *e)
{
    double init;
    if (want_type(o, "use_lazy", JSON_TRUE, "a boolean", in, e) ||
        want_type(o, "use_hugepages", JSON_TRUE, "a boolean", in, e) ||
        want_type(o, "shm_name", JSON_STRING, "a string", in, e) ||
        positive_number(o, "init_size_gb", false, &init, in, e))
        return -1;
    json_t *lazy = json_object_get(o, "use_lazy");
    const char *shm = json_string_value(json_object_get(o, "shm_name"));
    in->shm_name = shm ? shm : "";
    /* A lazily grown arena is never placed in SHM, so a name would be a lie. */
    if (*in->shm_name && (!lazy || json_is_true(lazy)))
        return BAD(e, in, "\"shm_name\" '%s' cannot be used with \"use_lazy\" (default true)",
                   in->shm_name);
    return 0;
}

static int check_path_types(const json_t *o, const l1_entry_info *in, lmc_cfg_err *e)
{
    const char *path = json_string_value(json_object_get(o, "path"));
    if (!path || !*path) {
        char got[128];
        show(json_object_get(o, "path"), got, sizeof got);
        return BAD(e, in, "\"path\" must be a non-empty string for %s, got %s", in->type, got);
    }
    if (strcmp(in->type, "GDS") != 0)
        return 0;
    return want_type(o, "backend", JSON_STRING, "a string", in, e) ||
                   want_type(o, "direct_io", JSON_TRUE, "a boolean", in, e)
               ? -1 : 0;
}

/* Parses entry i; on failure reports it and returns NULL. */
static json_t *load_entry(const lmc_config *cfg, size_t i, lmc_cfg_err *e)
{
    const char *text = cfg->storage.l1_manager_json.items[i];
    char why[160];
    bool oom;
    json_t *o = lmc_cfg_json_load(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &oom, why,
                                  sizeof why);
    if (!o && oom)
        l1_fail(e, i, "out of memory parsing the JSON");
    else if (!o)
        l1_fail(e, i, "invalid JSON (%s): '%s'", why, text);
    else if (!json_is_object(o)) {
        l1_fail(e, i, "must be a JSON object, got '%s'", text);
        json_decref(o);
        o = NULL;
    }
    return o;
}

static int check_entry(const json_t *o, const lmc_config *cfg, l1_entry_info *in,
                       lmc_cfg_err *e)
{
    if (check_type_and_tag(o, in, e) || check_keys(o, in, e) || check_size(o, in, e) ||
        check_eviction(o, cfg, in, e))
        return -1;
    return strcmp(in->type, "DRAM") == 0 ? check_dram(o, in, e) : check_path_types(o, in, e);
}

static int check_together(const l1_entry_info *all, size_t n, lmc_cfg_err *e)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (strcmp(all[i].tag, all[j].tag) == 0)
                return BAD(e, &all[i], "duplicate \"tag\" '%s' (also entry %zu)", all[i].tag, j);
            if (strcmp(all[i].type, "GDS") == 0 && strcmp(all[j].type, "GDS") == 0)
                return BAD(e, &all[i], "at most one GDS L1 per process (entry %zu is GDS)", j);
            if (all[i].shm_name && all[j].shm_name && *all[i].shm_name &&
                strcmp(all[i].shm_name, all[j].shm_name) == 0)
                return BAD(e, &all[i], "duplicate DRAM \"shm_name\" '%s' (also entry %zu)",
                           all[i].shm_name, j);
        }
    }
    return 0;
}

int lmc_cfg_check_l1_managers(const lmc_config *cfg, lmc_cfg_err *e)
{
    size_t n = cfg->storage.l1_manager_json.count;
    if (n == 0)
        return 0;
    json_t **docs = calloc(n, sizeof *docs);
    l1_entry_info *info = calloc(n, sizeof *info);
    int rc = (docs && info) ? 0 : lmc_cfg_fail(e, "--l1-manager: out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        info[i].index = i;
        docs[i] = load_entry(cfg, i, e);
        rc = docs[i] ? check_entry(docs[i], cfg, &info[i], e) : -1;
    }
    if (rc == 0)
        rc = check_together(info, n, e);
    for (size_t i = 0; docs && i < n; i++)
        json_decref(docs[i]);
    free(docs);
    free(info);
    return rc;
}

json_t *lmc_cfg_l1_entry(const lmc_config *cfg, size_t i)
{
    if (i >= cfg->storage.l1_manager_json.count)
        return NULL;
    return json_loads(cfg->storage.l1_manager_json.items[i], JSON_DECODE_ANY, NULL);
}

static const char *canonical_type(const char *type)
{
    static const char *const types[] = {"DRAM", "DEVDAX", "GDS"};
    for (size_t i = 0; type && i < 3; i++)
        if (strcmp(type, types[i]) == 0)
            return types[i];
    return NULL;
}

int lmc_cfg_l1_type_of_tag(const lmc_config *cfg, const char *tag, const char **type_out)
{
    const lmc_storage_config *s = &cfg->storage;
    if (s->l1_manager_json.count == 0) { /* legacy: a single L1 named _default */
        *type_out = strcmp(tag, "_default") != 0 ? NULL
                    : s->gds_l1_path            ? "GDS"
                    : s->l1_devdax_path         ? "DEVDAX" : "DRAM";
        return 0;
    }
    const char *found = NULL;
    for (size_t i = 0; !found && i < s->l1_manager_json.count; i++) {
        json_t *o = lmc_cfg_l1_entry(cfg, i);
        if (!o) /* validated already: only memory can fail it now */
            return -1;
        const char *type = canonical_type(json_string_value(json_object_get(o, "type")));
        json_t *t = json_object_get(o, "tag");
        bool dram = type && strcmp(type, "DRAM") == 0;
        const char *etag = t ? json_string_value(t) : (dram ? "_default" : NULL);
        if (type && etag && strcmp(etag, tag) == 0)
            found = type;
        json_decref(o);
    }
    *type_out = found;
    return 0;
}
