/* Validation of --l2-adapter JSON entries (docs/l2.md, "Flags").
 *
 * Every entry is a JSON object with a string "type" and, when given, an
 * "affinity_tag" naming a DRAM or DEVDAX L1.  The per-type field schemas
 * below are checked strictly at flag validation (unknown types and fields,
 * missing required fields, wrong JSON types and ranges: exit 2), and again
 * by the adapter factory at start-up, which builds from the same tables. */
#include "config/config_internal.h"
#include "config/config_l2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    F_STR, F_BOOL, F_NUM_GE0, F_FRACTION, F_INT, F_INT_GE0, F_INT_GT0, F_OBJECT, F_ADAPTER,
} field_kind;

typedef struct {
    const char *name;
    field_kind kind;
} field_spec;

static const field_spec common_fields[] = {
    {"type", F_STR}, {"eviction", F_OBJECT}, {"persist_enabled", F_BOOL},
    {"max_capacity_gb", F_NUM_GE0}, {"affinity_tag", F_STR}, {"shared", F_BOOL},
    {NULL, F_STR},
};
static const field_spec mock_fields[] = {{"num_workers", F_INT_GT0}, {NULL, F_STR}};
static const field_spec fault_fields[] = {
    {"inner", F_ADAPTER}, {"fail_rate", F_FRACTION}, {"delay_rate", F_FRACTION},
    {"delay_ms", F_INT_GE0}, {"seed", F_INT_GE0}, {NULL, F_STR},
};
static const field_spec fs_fields[] = {
    {"base_path", F_STR}, {"relative_tmp_dir", F_STR}, {"read_ahead_size", F_INT_GT0},
    {"use_odirect", F_BOOL}, {"recover_on_start", F_BOOL}, {"num_workers", F_INT_GT0},
    {"verify_checksum", F_BOOL}, {NULL, F_STR},
};

/* RESP: host/port may also come from LMCACHE_RESP_HOST/PORT. */
static const field_spec resp_fields[] = {
    {"host", F_STR}, {"port", F_INT_GT0}, {"num_workers", F_INT_GT0}, {"username", F_STR},
    {"password", F_STR}, {"timeout_ms", F_INT_GT0}, {NULL, F_STR},
};
/* Upstream's s3 fields, plus lmcached's s3_create_bucket. */
static const field_spec s3_fields[] = {
    {"s3_endpoint", F_STR}, {"s3_region", F_STR}, {"s3_num_io_threads", F_INT_GT0},
    {"s3_prefer_http2", F_BOOL}, {"s3_enable_s3express", F_BOOL}, {"disable_tls", F_BOOL},
    {"aws_access_key_id", F_STR}, {"aws_secret_access_key", F_STR},
    {"s3_create_bucket", F_BOOL}, {"num_workers", F_INT_GT0}, {NULL, F_STR},
};

/* A peer's L1, read-only (docs/p2p.md, "Requesting side"). */
static const field_spec p2p_fields[] = {
    {"peer_mq_server_url", F_STR}, {"peer_transfer_channel_server_url", F_STR},
    {"lookup_timeout", F_NUM_GE0}, {"load_timeout", F_NUM_GE0}, {"num_workers", F_INT_GT0},
    {"transfer_engine", F_STR}, {NULL, F_STR},
};

static const struct {
    const char *type;
    const field_spec *fields;
    const char *required;   /* NULL: none */
} l2_types[] = {
    {"mock", mock_fields, NULL},
    {"fault_inject", fault_fields, "inner"},
    {"fs", fs_fields, "base_path"},
    {"resp", resp_fields, NULL},
    {"s3", s3_fields, "s3_endpoint"},
    {"p2p", p2p_fields, "peer_mq_server_url"},
};
#define N_L2_TYPES (sizeof l2_types / sizeof l2_types[0])

static int check_json(const json_t *o, bool strict, int depth, char *err, size_t errlen);

static const char *kind_text(field_kind k)
{
    static const char *const text[] = {
        "a string", "a boolean", "a number >= 0", "a number in [0, 1]", "an integer",
        "an integer >= 0", "an integer > 0", "a JSON object", "an adapter JSON object",
    };
    return text[k];
}

static bool value_ok(const json_t *v, field_kind k)
{
    double d = json_number_value(v);
    switch (k) {
    case F_STR: return json_is_string(v);
    case F_BOOL: return json_is_boolean(v);
    case F_NUM_GE0: return json_is_number(v) && isfinite(d) && d >= 0;
    case F_FRACTION: return json_is_number(v) && d >= 0 && d <= 1;
    case F_INT: return json_is_integer(v);
    case F_INT_GE0: return json_is_integer(v) && json_integer_value(v) >= 0;
    case F_INT_GT0: return json_is_integer(v) && json_integer_value(v) > 0;
    case F_OBJECT: case F_ADAPTER: return json_is_object(v);
    }
    return false;
}

static const field_spec *find_field(const field_spec *t, const char *name)
{
    for (; t && t->name; t++)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

/* {"eviction_policy": LRU|IsolatedLRU|noop, "trigger_watermark": (0,1],
 *  "eviction_ratio": (0,1]} (docs/l2.md, "L2 eviction and quotas"). */
static int check_eviction(const json_t *ev, char *err, size_t errlen)
{
    const char *policy = json_string_value(json_object_get(ev, "eviction_policy"));
    json_t *wm = json_object_get(ev, "trigger_watermark"), *r = json_object_get(ev, "eviction_ratio");
    if (json_object_get(ev, "eviction_policy") &&
        (!policy || (strcmp(policy, "LRU") && strcmp(policy, "IsolatedLRU") && strcmp(policy, "noop")))) {
        snprintf(err, errlen, "\"eviction_policy\" must be LRU, IsolatedLRU or noop");
        return -1;
    }
    if ((wm && (!json_is_number(wm) || !(json_number_value(wm) > 0) || json_number_value(wm) > 1)) ||
        (r && (!json_is_number(r) || !(json_number_value(r) > 0) || json_number_value(r) > 1))) {
        snprintf(err, errlen, "\"trigger_watermark\" and \"eviction_ratio\" must be in (0, 1]");
        return -1;
    }
    return 0;
}

static int check_field(const field_spec *f, const json_t *v, bool strict, int depth, char *err,
                       size_t errlen)
{
    if (!value_ok(v, f->kind)) {
        snprintf(err, errlen, "\"%s\" must be %s", f->name, kind_text(f->kind));
        return -1;
    }
    if (f->kind == F_ADAPTER)
        return check_json(v, strict, depth + 1, err, errlen);
    if (strcmp(f->name, "eviction") == 0)
        return check_eviction(v, err, errlen);
    const char *s = json_string_value(v);
    if (strcmp(f->name, "relative_tmp_dir") == 0 && (s[0] == '/' || strstr(s, ".."))) {
        snprintf(err, errlen, "\"relative_tmp_dir\" must be relative without '..'");
        return -1;
    }
    return 0;
}

/* Common fields that would be accepted and then ignored are refused by
 * name (docs/l2.md, "Flags"): lmcached never deletes L2 data at shutdown;
 * eviction, affinity and sharing are read from the outer adapter only; a
 * fault_inject adapter has no capacity of its own. */
static int check_placement(const char *name, const json_t *v, const char *type, int depth,
                           char *err, size_t errlen)
{
    if (strcmp(name, "persist_enabled") == 0 && json_is_false(v)) {
        snprintf(err, errlen, "\"persist_enabled\": false is not supported: lmcached keeps L2 "
                              "data at shutdown (docs/l2.md); drop it or set it to true");
        return -1;
    }
    if (depth > 0 && (strcmp(name, "eviction") == 0 || strcmp(name, "affinity_tag") == 0 ||
                      strcmp(name, "shared") == 0)) {
        snprintf(err, errlen, "\"%s\" belongs on the outer adapter, not in \"inner\"", name);
        return -1;
    }
    if (strcmp(type, "fault_inject") == 0 && strcmp(name, "max_capacity_gb") == 0) {
        snprintf(err, errlen, "\"max_capacity_gb\" of a fault_inject adapter belongs on its "
                              "\"inner\" adapter");
        return -1;
    }
    return 0;
}

static int check_fields(const json_t *o, size_t t, bool strict, int depth, char *err,
                        size_t errlen)
{
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)o, name, v) {
        const field_spec *f = find_field(common_fields, name);
        if (!f && t < N_L2_TYPES)
            f = find_field(l2_types[t].fields, name);
        if (!f && strict) {
            snprintf(err, errlen, "unknown field \"%s\" for L2 adapter type '%s'", name,
                     json_string_value(json_object_get(o, "type")));
            return -1;
        }
        if (f && (check_field(f, v, strict, depth, err, errlen) != 0 ||
                  check_placement(name, v, json_string_value(json_object_get(o, "type")), depth,
                                  err, errlen) != 0))
            return -1;
    }
    return 0;
}

static int check_json(const json_t *o, bool strict, int depth, char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!json_is_object(o) || !type || !*type) {
        snprintf(err, errlen, "an adapter must be a JSON object with a non-empty \"type\"");
        return -1;
    }
    if (depth > 4) {
        snprintf(err, errlen, "adapters nested too deeply");
        return -1;
    }
    size_t t = 0;
    while (t < N_L2_TYPES && strcmp(l2_types[t].type, type) != 0)
        t++;
    if (t == N_L2_TYPES && strict) {
        snprintf(err, errlen, "unknown L2 adapter type '%s' (known: mock, fault_inject, fs, resp, s3, p2p)",
                 type);
        return -1;
    }
    if (strict && t < N_L2_TYPES && l2_types[t].required &&
        !json_object_get(o, l2_types[t].required)) {
        snprintf(err, errlen, "L2 adapter type '%s' needs \"%s\"", type, l2_types[t].required);
        return -1;
    }
    return check_fields(o, t, strict, depth, err, errlen);
}

int lmc_config_l2_adapter_check(const json_t *o, bool strict, char *err, size_t errlen)
{
    return check_json(o, strict, 0, err, errlen);
}

/* The full schema at flag time: an unknown type or field, a missing
 * required field or a bad value is a flag error (exit 2, nothing started);
 * the adapter factory checks the same schema again at start-up. */
static int check_schema(const json_t *o, size_t i, lmc_cfg_err *e)
{
    char msg[256];
    if (lmc_config_l2_adapter_check(o, true, msg, sizeof msg) != 0)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: %s", i, msg);
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
    const char *type;
    if (lmc_cfg_l1_type_of_tag(cfg, tag, &type) != 0)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: out of memory checking \"affinity_tag\"", i);
    if (!type)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: \"affinity_tag\" '%s' names no L1", i, tag);
    if (strcmp(type, "GDS") == 0 && cfg->storage.l1_manager_json.count)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: \"affinity_tag\" '%s' is a GDS L1; L2 "
                               "adapters need a DRAM or DEVDAX L1", i, tag);
    return 0;
}

static int check_adapter(const char *text, size_t i, const lmc_config *cfg, lmc_cfg_err *e)
{
    char why[160];
    bool oom;
    json_t *o = lmc_cfg_json_load(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &oom, why,
                                  sizeof why);
    if (!o && oom)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: out of memory parsing the JSON", i);
    if (!o)
        return lmc_cfg_fail(e, "--l2-adapter[%zu]: invalid JSON (%s): '%s'", i, why, text);
    const char *type = json_string_value(json_object_get(o, "type"));
    int rc = 0;
    if (!json_is_object(o))
        rc = lmc_cfg_fail(e, "--l2-adapter[%zu]: must be a JSON object, got '%s'", i, text);
    else if (!type || !*type)
        rc = lmc_cfg_fail(e, "--l2-adapter[%zu]: needs a non-empty string \"type\", got '%s'",
                          i, text);
    else
        rc = check_affinity(o, i, cfg, e) ? -1 : check_schema(o, i, e);
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
