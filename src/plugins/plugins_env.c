/* What a plugin learns about the server: LMCACHE_RUNTIME_PLUGIN_CONFIG and
 * the other plugin variables, added to the inherited environment. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/json_dump.h"
#include "plugins/plugins_internal.h"

static int copy_group(json_t *dst, json_t *all, const char *name)
{
    json_t *group = json_object_get(all, name);
    return group ? json_object_set(dst, name, group) : 0;
}

static int add_extra(json_t *dst, const char *extra_text)
{
    if (!extra_text || !extra_text[0])
        return 0;
    /* Validated at start: NULL here is memory, and the plugins must not
     * start without the configuration they were given. */
    json_t *extra = json_loads(extra_text, 0, NULL);
    int rc = extra ? 0 : -1;
    if (json_is_object(extra) && json_object_size(extra) > 0)
        rc = json_object_set(dst, "runtime_plugin_extra_config", extra);
    json_decref(extra);
    return rc;
}

char *lmc_plugins_config_json(const lmc_config *cfg)
{
    char *text = lmc_config_to_json(cfg);
    json_t *all = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *out = json_object();
    char *result = NULL;
    if (all && out && copy_group(out, all, "mp_config") == 0 &&
        copy_group(out, all, "storage_manager_config") == 0 &&
        copy_group(out, all, "obs_config") == 0 &&
        (!cfg->http.enabled || copy_group(out, all, "http_config") == 0) &&
        add_extra(out, cfg->plugins.extra_config_json) == 0)
        result = lmc_json_dumps(out, JSON_COMPACT);
    json_decref(all);
    json_decref(out);
    return result;
}

/* The variables every plugin gets, as "NAME=value" strings. */
static const char *const var_names[] = {
    "LMCACHE_RUNTIME_PLUGIN_ROLE", "LMCACHE_RUNTIME_PLUGIN_CONFIG",
    "LMCACHE_RUNTIME_PLUGIN_WORKER_COUNT", "LMCACHE_RUNTIME_PLUGIN_WORKER_ID",
    "LMCACHE_PLUGIN_ROLE", "LMCACHE_PLUGIN_CONFIG",
    "LMCACHE_PLUGIN_WORKER_COUNT", "LMCACHE_PLUGIN_WORKER_ID",
    "PYTHONUNBUFFERED",
};
#define N_VARS (sizeof var_names / sizeof var_names[0])

static bool overridden(const char *entry)
{
    for (size_t i = 0; i < N_VARS; i++) {
        size_t n = strlen(var_names[i]);
        if (strncmp(entry, var_names[i], n) == 0 && entry[n] == '=')
            return true;
    }
    return false;
}

static char *make_var(const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s=%s", name, value);
    return s;
}

static int add_plugin_vars(char **env, size_t *n, const char *config_json)
{
    char count[16], id[16];
    snprintf(count, sizeof count, "%d", LMC_PLUGIN_WORKER_COUNT);
    snprintf(id, sizeof id, "%d", LMC_PLUGIN_WORKER_ID);
    const char *values[N_VARS] = {"", config_json, count, id, "", config_json, count, id, "1"};
    for (size_t i = 0; i < N_VARS; i++) {
        env[*n] = make_var(var_names[i], values[i]);
        if (!env[*n])
            return -1;
        (*n)++;
    }
    return 0;
}

char **lmc_plugins_build_env(char *const envp[], const char *config_json)
{
    size_t inherited = 0;
    for (size_t i = 0; envp && envp[i]; i++)
        inherited++;
    char **env = calloc(inherited + N_VARS + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < inherited; i++) {
        if (overridden(envp[i]))
            continue;
        env[n] = strdup(envp[i]);
        if (!env[n]) {
            lmc_plugins_free_env(env);
            return NULL;
        }
        n++;
    }
    if (add_plugin_vars(env, &n, config_json) != 0) {
        lmc_plugins_free_env(env);
        return NULL;
    }
    return env;
}

void lmc_plugins_free_env(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

const char *lmc_plugins_env_get(char *const env[], const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
            return env[i] + n + 1;
    return NULL;
}
