/* Shared by the files of src/plugins/ (and the unit tests). */
#ifndef LMC_PLUGINS_PLUGINS_INTERNAL_H
#define LMC_PLUGINS_PLUGINS_INTERNAL_H

#include "plugins/plugins.h"

/* The inherited environment `envp` (NULL = empty) without any plugin
 * variable, followed by the plugin variables (ROLE, CONFIG, WORKER_COUNT,
 * WORKER_ID under the LMCACHE_RUNTIME_PLUGIN_ and LMCACHE_PLUGIN_ names,
 * PYTHONUNBUFFERED=1).  NULL-terminated, malloc'd; NULL on failure. */
char **lmc_plugins_build_env(char *const envp[], const char *config_json);
void lmc_plugins_free_env(char **env);
/* Value of NAME in env, or NULL. */
const char *lmc_plugins_env_get(char *const env[], const char *name);

#endif
