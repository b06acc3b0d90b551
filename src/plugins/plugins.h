/* Runtime plugins (docs/plugins.md): side programs (*.py, *.sh) the
 * server starts once it is up and stops at shutdown.  docs/plugins.md.
 *
 * The pure helpers (discovery, name filter, interpreter choice, the config
 * JSON) are exposed for the unit tests; the server uses lmc_plugins_start()
 * and lmc_plugins_stop() only. */
#ifndef LMC_PLUGINS_PLUGINS_H
#define LMC_PLUGINS_PLUGINS_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

/* The worker identity lmcached gives every plugin (MP mode: one worker). */
#define LMC_PLUGIN_WORKER_ID 0
#define LMC_PLUGIN_WORKER_COUNT 1

/* Milliseconds between SIGTERM and SIGKILL at shutdown. */
#define LMC_PLUGIN_STOP_GRACE_MS 3000

/* Expands `locations`: a file is taken as-is, a directory is scanned
 * recursively for *.py and *.sh (each directory's entries in name order;
 * symbolic links to directories are not followed), a missing location is
 * warned about and skipped.  Appends malloc'd paths to *out (an empty
 * lmc_strlist to start with; free with lmc_plugins_free_list).
 * Returns 0, or -1 on allocation failure. */
int lmc_plugins_discover(const lmc_strlist *locations, lmc_strlist *out);
void lmc_plugins_free_list(lmc_strlist *list);

/* The worker-id filter: the lowercase file stem split on '_'; with at
 * least 3 parts and an all-digit second part, the plugin runs only when
 * that number equals `worker_id`.  Otherwise it always runs. */
bool lmc_plugins_selected(const char *path, int worker_id);

/* Chooses the interpreter for `path`: the first line's shebang text, when
 * it names one executable (an executable file if it contains '/', else a
 * program found on `path_env`, e.g. getenv("PATH")), else "python3" for
 * *.py and "bash" for *.sh.  Writes it to out and returns 0; returns -1
 * when there is no usable shebang and the extension is neither. */
int lmc_plugins_interpreter(const char *path, const char *path_env, char *out, size_t cap);

/* LMCACHE_RUNTIME_PLUGIN_CONFIG: {"mp_config", "storage_manager_config",
 * "obs_config", "http_config" (only when the HTTP frontend runs), and
 * "runtime_plugin_extra_config" when --runtime-plugin-config is a non-empty
 * object}.  malloc'd compact JSON, or NULL on failure. */
char *lmc_plugins_config_json(const lmc_config *cfg);

/* The running plugins and the thread that logs their output. */
typedef struct lmc_plugins lmc_plugins;

/* Discovers, filters and launches the configured plugins, inheriting the
 * environment `envp` (NULL-terminated; NULL = empty) plus the plugin
 * variables.  Errors (unknown extension, spawn failure) are logged and the
 * plugin skipped.  Returns NULL when nothing runs (no locations, nothing
 * selected, or out of memory). */
lmc_plugins *lmc_plugins_start(const lmc_config *cfg, char *const envp[]);

/* Number of plugins launched (0 for NULL). */
size_t lmc_plugins_count(const lmc_plugins *p);

/* SIGTERM to every plugin still running (its whole process group), SIGKILL
 * to those left after LMC_PLUGIN_STOP_GRACE_MS, reaps them, logs the last
 * output and exit statuses, joins the thread and frees.  NULL is a no-op. */
void lmc_plugins_stop(lmc_plugins *p);

#endif
