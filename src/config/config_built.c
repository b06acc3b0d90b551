/* Flags whose feature this build of lmcached does not have yet.
 *
 * Parsing and validation follow upstream, so a configuration that upstream
 * accepts parses here too.  But a flag that parses and then does nothing
 * would let an operator believe a feature is on (a blend engine that
 * never blends), so the server refuses
 * such a value at start, naming the flag.  The list shrinks as features
 * land; docs/configuration.md, "Flags refused by this version", keeps it. */
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

typedef struct {
    const char *flag;
    bool (*requested)(const lmc_config *cfg);
    const char *missing;
    const char *help; /* what --help says instead of the upstream text */
} unbuilt_feature;

static bool wants_scripts(const lmc_config *c) { return c->mp.script_allowed_imports.count > 0; }
static bool wants_extra_logging(const lmc_config *c) { return c->obs.enable_extra_logging; }

#define REFUSED "Not built into this version: any value but the default is refused at start."
static const unbuilt_feature unbuilt[] = {
    {"--script-allowed-imports", wants_scripts,
     "lmcached serves no /run_script route (docs/http.md), so there is nothing to import into",
     "lmcached serves no /run_script route: any value is refused at start."},
    {"--enable-extra-logging", wants_extra_logging,
     "periodic extra logging is not built into this version; /metrics and /status carry the "
     "same figures",
     REFUSED " /metrics and /status carry the same figures."},
};

const char *lmc_cfg_unbuilt_help(const lmc_config_flag *f)
{
    for (size_t i = 0; i < sizeof unbuilt / sizeof unbuilt[0]; i++)
        if (strcmp(unbuilt[i].flag + 2, f->name) == 0)
            return unbuilt[i].help;
    return NULL;
}

int lmc_config_check_built(const lmc_config *cfg, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof unbuilt / sizeof unbuilt[0]; i++) {
        if (unbuilt[i].requested(cfg)) {
            snprintf(err, errlen, "%s: %s", unbuilt[i].flag, unbuilt[i].missing);
            return -1;
        }
    }
    /* The registrar runs with the HTTP frontend (docs/fleet.md): without
     * one the URL would be accepted and do nothing. */
    if (cfg->coordinator.url[0] != '\0' && !cfg->http.enabled) {
        snprintf(err, errlen, "--coordinator-url: the coordinator is only used with the HTTP "
                              "frontend, which --no-http turns off");
        return -1;
    }
    return 0;
}
