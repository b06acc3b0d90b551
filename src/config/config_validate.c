/* Post-parse validation.  Simple numeric ranges come from the flag table;
 * everything that relates two flags (or needs more than a range) is one
 * small rule function below.  Each failure writes one line naming the flag
 * and the offending value. */
#include "config/config_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --- table-driven ranges -------------------------------------------------- */

static bool flag_number(const lmc_config *cfg, const lmc_config_flag *f, double *out)
{
    const void *slot = lmc_cfg_cfield(cfg, f);
    switch (f->kind) {
    case LMC_FK_INT: *out = *(const int *)slot; return true;
    case LMC_FK_I64: *out = (double)*(const int64_t *)slot; return true;
    case LMC_FK_DBL: *out = *(const double *)slot; return true;
    case LMC_FK_OPT_DBL:
        *out = ((const lmc_opt_double *)slot)->value;
        return ((const lmc_opt_double *)slot)->set;
    default: return false;
    }
}

static bool in_range(const lmc_config_flag *f, double v)
{
    if (isnan(v) || ((f->range & LMC_RANGE_FINITE) && !isfinite(v)))
        return false;
    if ((f->range & LMC_RANGE_MIN_OPEN) ? !(v > f->min) : !(v >= f->min))
        return false;
    return !(f->range & LMC_RANGE_HAS_MAX) || v <= f->max;
}

static int range_error(const lmc_config *cfg, const lmc_config_flag *f, double v,
                       lmc_cfg_err *e)
{
    char got[48];
    if (f->kind == LMC_FK_INT || f->kind == LMC_FK_I64)
        snprintf(got, sizeof got, "%lld",
                 f->kind == LMC_FK_INT ? (long long)*(const int *)lmc_cfg_cfield(cfg, f)
                                       : (long long)*(const int64_t *)lmc_cfg_cfield(cfg, f));
    else
        snprintf(got, sizeof got, "%g", v);
    const char *fin = (f->range & LMC_RANGE_FINITE) ? "finite and " : "";
    bool open = f->range & LMC_RANGE_MIN_OPEN;
    if (f->range & LMC_RANGE_HAS_MAX)
        return lmc_cfg_fail(e, "--%s: must be %sin %c%g, %g], got %s", f->name, fin,
                            open ? '(' : '[', f->min, f->max, got);
    return lmc_cfg_fail(e, "--%s: must be %s%s %g, got %s", f->name, fin, open ? ">" : ">=",
                        f->min, got);
}

static int check_ranges(const lmc_config *cfg, lmc_cfg_err *e)
{
    size_t n;
    const lmc_config_flag *flags = lmc_config_flags(&n);
    for (size_t i = 0; i < n; i++) {
        double v;
        if ((flags[i].range & LMC_RANGE_CHECK) && flag_number(cfg, &flags[i], &v) &&
            !in_range(&flags[i], v))
            return range_error(cfg, &flags[i], v, e);
    }
    return 0;
}

/* --- MP server ------------------------------------------------------------- */

static int check_hash(const lmc_config *cfg, lmc_cfg_err *e)
{
    if (strcmp(cfg->mp.hash_algorithm, "builtin") != 0)
        return 0;
    return lmc_cfg_fail(e, "--hash-algorithm: 'builtin' is not supported: it is CPython's "
                           "hash(), whose result depends on interpreter internals and "
                           "PYTHONHASHSEED and cannot be reproduced outside CPython; use "
                           "blake3 or sha256_cbor");
}

static int check_worker_liveness(const lmc_config *cfg, lmc_cfg_err *e)
{
    double reap = cfg->mp.worker_reap_timeout_seconds;
    double grace = cfg->mp.worker_registration_grace_seconds;
    /* Below 30 s a worker would be reaped between two engine heartbeats. */
    if (!isfinite(reap) || (reap != 0 && !(reap >= 30)))
        return lmc_cfg_fail(e, "--worker-reap-timeout-seconds: must be 0 (disabled) or >= "
                               "30, got %g", reap);
    if (!isfinite(grace) || !(grace >= reap))
        return lmc_cfg_fail(e, "--worker-registration-grace-seconds: must be finite and >= "
                               "--worker-reap-timeout-seconds (%g), got %g", reap, grace);
    return 0;
}

static int check_engine_mode(const lmc_config *cfg, lmc_cfg_err *e)
{
    /* Blend engines recompute KV inside the server, so the engine cannot
     * drive the transfer itself. */
    if (strncmp(cfg->mp.engine_type, "blend", 5) == 0 &&
        strcmp(cfg->mp.supported_transfer_mode, "engine_driven") == 0)
        return lmc_cfg_fail(e, "--supported-transfer-mode: engine_driven is not supported "
                               "with --engine-type %s", cfg->mp.engine_type);
    /* Segmented prefix is a policy of CB_UNIFIED_LOOKUP's prefix leg
     * (docs/cacheblend.md, "Segmented prefix"): without the blend module
     * it would be accepted and do nothing. */
    if (cfg->mp.enable_segmented_prefix && strcmp(cfg->mp.engine_type, "blend") != 0)
        return lmc_cfg_fail(e, "--enable-segmented-prefix: applies to --engine-type blend only "
                               "(got --engine-type %s)", cfg->mp.engine_type);
    if (cfg->mp.enable_dedup_content && strcmp(cfg->mp.engine_type, "blend") != 0)
        return lmc_cfg_fail(e, "--enable-dedup-content: applies to --engine-type blend only "
                               "(got --engine-type %s)", cfg->mp.engine_type);
    return 0;
}

static int check_plugin_config(const lmc_config *cfg, lmc_cfg_err *e)
{
    char why[160];
    bool oom;
    json_t *j = lmc_cfg_json_load(cfg->plugins.extra_config_json, JSON_DECODE_ANY, &oom, why,
                                  sizeof why);
    bool object = j && json_is_object(j);
    json_decref(j);
    if (!j && oom)
        return lmc_cfg_fail(e, "--runtime-plugin-config: out of memory parsing the JSON");
    if (!j)
        return lmc_cfg_fail(e, "--runtime-plugin-config: invalid JSON (%s): '%s'", why,
                            cfg->plugins.extra_config_json);
    if (!object)
        return lmc_cfg_fail(e, "--runtime-plugin-config: must be a JSON object, got '%s'",
                            cfg->plugins.extra_config_json);
    return 0;
}

/* --- P2P ------------------------------------------------------------------- */

/* P2P peers read straight out of our L1 arena, which needs one registered
 * region: exactly one DRAM L1. */
static int check_p2p_enabled(const lmc_config *cfg, lmc_cfg_err *e)
{
    const lmc_storage_config *s = &cfg->storage;
    const char *url = cfg->p2p.advertise_url;
    if (!*url)
        return 0;
    if (!*cfg->coordinator.url)
        return lmc_cfg_fail(e, "--p2p-advertise-url: P2P (%s) requires --coordinator-url "
                               "(or LMCACHE_COORDINATOR_URL)", url);
    if (s->l1_manager_json.count > 1)
        return lmc_cfg_fail(e, "--p2p-advertise-url: P2P needs a single L1 memory region, "
                               "got %zu --l1-manager entries", s->l1_manager_json.count);
    if (s->gds_l1_path || s->l1_devdax_path)
        return lmc_cfg_fail(e, "--p2p-advertise-url: P2P needs a single DRAM L1 region, not "
                               "%s", s->gds_l1_path ? "--gds-l1-path" : "--l1-devdax-path");
    json_t *entry = s->l1_manager_json.count ? lmc_cfg_l1_entry(cfg, 0) : NULL;
    /* Not "no entry, so DRAM": that would let a DEVDAX L1 through. */
    if (s->l1_manager_json.count && !entry)
        return lmc_cfg_fail(e, "--p2p-advertise-url: out of memory checking the L1 type");
    const char *type = entry ? json_string_value(json_object_get(entry, "type")) : "DRAM";
    int rc = 0;
    if (type && strcmp(type, "DRAM") != 0)
        rc = lmc_cfg_fail(e, "--p2p-advertise-url: P2P needs a single DRAM L1 region, got a "
                             "%s --l1-manager entry", type);
    json_decref(entry);
    return rc;
}

/* --- storage (legacy flags) ------------------------------------------------ */

static int check_l1_mode(const lmc_config *cfg, lmc_cfg_err *e)
{
    const lmc_storage_config *s = &cfg->storage;
    if (s->l1_manager_json.count) {
        const char *legacy = s->l1_size_gb.set ? "--l1-size-gb"
                             : s->gds_l1_path  ? "--gds-l1-path"
                             : s->l1_devdax_path ? "--l1-devdax-path" : NULL;
        if (legacy)
            return lmc_cfg_fail(e, "--l1-manager: cannot be mixed with %s", legacy);
        return 0;
    }
    if (!s->l1_size_gb.set)
        return lmc_cfg_fail(e, "--l1-size-gb: required when no --l1-manager is given");
    if (!s->eviction_policy)
        return lmc_cfg_fail(e, "--eviction-policy: required when no --l1-manager is given "
                               "(legacy --l1-size-gb mode)");
    if (s->gds_l1_path && s->l1_devdax_path)
        return lmc_cfg_fail(e, "--gds-l1-path: cannot be combined with --l1-devdax-path '%s'",
                            s->l1_devdax_path);
    return 0;
}

static int check_l1_memory(lmc_config *cfg, lmc_cfg_err *e)
{
    lmc_storage_config *s = &cfg->storage;
    int64_t a = s->l1_align_bytes;
    if (a <= 0 || (a & (a - 1)) != 0)
        return lmc_cfg_fail(e, "--l1-align-bytes: must be a power of two, got %lld",
                            (long long)a);
    const char *shm = cfg->mp.shm_name;
    if (s->l1_use_hugepages) {
        if (!shm || *shm)
            return lmc_cfg_fail(e, "--l1-use-hugepages: requires --shm-name \"\" (hugepage "
                                   "L1 is not SHM-backed), got shm name %s%s%s",
                                shm ? "'" : "", shm ? shm : "None", shm ? "'" : "");
        s->l1_use_lazy = false; /* upstream silently turns lazy off here */
    }
    if (s->l1_devdax_path && s->l1_use_lazy)
        return lmc_cfg_fail(e, "--l1-devdax-path: '%s' requires --no-l1-use-lazy",
                            s->l1_devdax_path);
    if (s->l1_devdax_path && (!shm || *shm))
        return lmc_cfg_fail(e, "--l1-devdax-path: '%s' requires --shm-name \"\"",
                            s->l1_devdax_path);
    return 0;
}

static int check_obs(const lmc_config *cfg, lmc_cfg_err *e)
{
    const char *ep = cfg->obs.otlp_endpoint;
    if (cfg->obs.enable_tracing && (!ep || !*ep))
        return lmc_cfg_fail(e, "--enable-tracing: requires --otlp-endpoint");
    return 0;
}

int lmc_cfg_validate(lmc_config *cfg, lmc_cfg_err *e)
{
    if (check_ranges(cfg, e) || check_hash(cfg, e) || check_worker_liveness(cfg, e) ||
        check_engine_mode(cfg, e) || check_plugin_config(cfg, e) || check_obs(cfg, e))
        return -1;
    if (check_l1_mode(cfg, e) || check_l1_memory(cfg, e) ||
        lmc_cfg_check_l1_managers(cfg, e) || lmc_cfg_check_l2_adapters(cfg, e))
        return -1;
    if (check_p2p_enabled(cfg, e) || lmc_cfg_check_verbs(cfg, e) || lmc_cfg_check_http(cfg, e))
        return -1;
    return 0;
}
